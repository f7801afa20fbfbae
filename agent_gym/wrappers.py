"""Views of a ``ToolEnv`` for libraries that do not speak token ids.

- :class:`TextView`: string observations and actions. An action string must be encoded, so its
  tokens were not sampled by a model; each step says so in ``info["retokenized"]`` and flags a
  lossy round trip in ``info["retokenize_lossy"]``. Train on tokens, not through this view.
- :class:`ChatView`: the conversation as a list of ``{role, content}`` messages; the action is
  the assistant's reply text (encoded and closed with the end-of-turn token).
- :class:`PaddedTokens`: fixed shapes for RLlib and SB3-style libraries: the observation is a
  ``Box`` of ``max_len`` ids (right-padded with ``pad_id``) plus its ``length``; the action is a
  ``MultiDiscrete`` of ``max_action_len`` ids in which the value ``vocab_size`` means "no token".
"""

from __future__ import annotations

import string
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from agent_gym.env import ToolEnv

_CHARSET = frozenset(string.printable) | frozenset("\u2019\u2013\u2014")


def _tool_env(env: gym.Env) -> ToolEnv:
    base = env.unwrapped
    if not isinstance(base, ToolEnv):
        raise TypeError(f"this wrapper needs a ToolEnv underneath, got {type(base).__name__}")
    return base


class TextView(gym.Wrapper):
    def __init__(self, env: gym.Env, max_length: int = 1 << 20):
        super().__init__(env)
        self.tool_env = _tool_env(env)
        self.observation_space = spaces.Text(max_length=max_length, charset=_CHARSET)
        self.action_space = spaces.Text(max_length=max_length, charset=_CHARSET)

    def _text(self, obs: dict[str, np.ndarray]) -> str:
        return self.tool_env.tokenizer.decode(obs["input_ids"], skip_special_tokens=False)

    def reset(self, **kwargs: Any):
        obs, info = self.env.reset(**kwargs)
        return self._text(obs), info

    def step(self, action: str):
        ids = self.tool_env.encode_turn(action)
        obs, r, term, trunc, info = self.env.step(ids)
        info["retokenized"] = True
        info["retokenize_lossy"] = self.tool_env.tokenizer.decode(ids[:-1], skip_special_tokens=False) != action
        return self._text(obs), r, term, trunc, info


class ChatView(gym.Wrapper):
    def __init__(self, env: gym.Env, max_length: int = 1 << 20):
        super().__init__(env)
        self.tool_env = _tool_env(env)
        text = spaces.Text(max_length=max_length, charset=_CHARSET)
        self.observation_space = spaces.Sequence(spaces.Dict({"role": text, "content": text}))
        self.action_space = text

    def _messages(self) -> list[dict[str, str]]:
        return [dict(m) for m in self.tool_env.messages]

    def reset(self, **kwargs: Any):
        _, info = self.env.reset(**kwargs)
        return self._messages(), info

    def step(self, action: str):
        _, r, term, trunc, info = self.env.step(self.tool_env.encode_turn(action))
        info["retokenized"] = True
        msgs = self._messages()
        if term or trunc:  # the env does not append the final turn to its messages
            msgs.append({"role": "assistant", "content": info["action_text"]})
        return msgs, r, term, trunc, info


class PaddedTokens(gym.Wrapper):
    def __init__(self, env: gym.Env, max_len: int | None = None, max_action_len: int = 128,
                 pad_id: int | None = None):
        super().__init__(env)
        self.tool_env = te = _tool_env(env)
        self.max_len = int(max_len or te.max_context_tokens)
        if self.max_len < te.max_context_tokens:
            raise ValueError(f"max_len {self.max_len} is below the env's max_context_tokens "
                             f"{te.max_context_tokens}; observations would not fit")
        if max_action_len <= 0:
            raise ValueError(f"max_action_len must be positive, got {max_action_len}")
        self.max_action_len = int(max_action_len)
        tok = te.tokenizer
        self.pad_id = int(pad_id if pad_id is not None else (tok.pad_token_id if tok.pad_token_id is not None else 0))
        v = te.vocab_size
        self.observation_space = spaces.Dict({
            "input_ids": spaces.Box(0, v - 1, shape=(self.max_len,), dtype=np.int64),
            "length": spaces.Box(0, self.max_len, shape=(), dtype=np.int64),
        })
        self.no_token = v
        self.action_space = spaces.MultiDiscrete(np.full(self.max_action_len, v + 1, dtype=np.int64))

    def _pad(self, obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ids = obs["input_ids"]
        out = np.full(self.max_len, self.pad_id, dtype=np.int64)
        n = min(len(ids), self.max_len)
        out[:n] = ids[:n]
        return {"input_ids": out, "length": np.asarray(n, dtype=np.int64)}

    def reset(self, **kwargs: Any):
        obs, info = self.env.reset(**kwargs)
        return self._pad(obs), info

    def step(self, action: Any):
        a = np.asarray(action)
        if a.ndim != 1 or (a.size and not np.issubdtype(a.dtype, np.integer)):
            raise ValueError(f"action must be a 1-D array of integer token ids (the value {self.no_token} = no token), "
                             f"got shape {a.shape} dtype {a.dtype}; float actions are not truncated to ids")
        if a.size and (a.min() < 0 or a.max() > self.no_token):
            raise ValueError(f"action holds values outside [0, {self.no_token}]: min {a.min()}, max {a.max()}")
        ids = a[a != self.no_token].astype(np.int64)
        obs, r, term, trunc, info = self.env.step(ids)
        return self._pad(obs), r, term, trunc, info
