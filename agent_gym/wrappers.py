"""Views of a ``ToolEnv`` for libraries that do not speak token ids.

- :class:`TextView`: string observations and actions. An action string must be encoded, so its
  tokens were not sampled by a model; each step says so in ``info["retokenized"]`` and flags a
  lossy round trip in ``info["retokenize_lossy"]``. Train on tokens, not through this view.
- :class:`ChatView`: the conversation as a list of ``{role, content}`` messages; the action is
  the assistant's reply text (encoded and closed with the end-of-turn token).
- :class:`PaddedTokens`: fixed shapes for RLlib and SB3-style libraries: the observation is a
  ``Box`` of ``max_len`` ids (right-padded with ``pad_id``) plus its ``length``; the action is a
  ``MultiDiscrete`` of ``max_action_len`` ids in which the value ``vocab_size`` means "no token".
  ``max_len`` is at least :func:`max_observation_len` (``max_context_tokens + 1``: an action cut
  at the budget is closed with the env's end-of-turn token), so no observation is ever cut.

Each view has ``check_action(action)``: it validates an action in the view's own action space
without stepping (``ValueError`` naming what is wrong), and ``step`` runs the same check, so
:class:`~agent_gym.vector.ToolVectorEnv` can check every slot before stepping any.
:func:`action_checker` finds the ``check_action`` that applies to any wrapped env, and
:func:`tool_env_of` the ``ToolEnv`` under the wrappers.
"""

from __future__ import annotations

import string
from typing import Any, Callable

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from agent_gym.env import ToolEnv
from agent_gym.tokenizer import pad_token_id

_CHARSET = frozenset(string.printable) | frozenset("\u2019\u2013\u2014")


def tool_env_of(env: gym.Env) -> ToolEnv:
    """The :class:`ToolEnv` under ``env``'s wrappers; ``TypeError`` if there is none."""
    base = env.unwrapped
    if not isinstance(base, ToolEnv):
        raise TypeError(f"this wrapper needs a ToolEnv underneath, got {type(base).__name__}")
    return base


def action_checker(env: gym.Env) -> Callable[[Any], Any]:
    """The ``check_action`` that validates ``env``'s actions in ``env``'s own action space.

    Outermost first: the first env or wrapper whose class defines ``check_action`` (a ``ToolEnv``,
    the views of this module) gives it. A wrapper without one is looked through only if it keeps
    its inner env's action space and is not a ``gym.ActionWrapper``, i.e. passes actions through
    unchanged (Gymnasium's ``OrderEnforcing``, ``PassiveEnvChecker``, ``TimeLimit``,
    ``RecordEpisodeStatistics``). Any other wrapper may change what an action means, so it cannot
    be checked from outside: ``TypeError`` naming it and the fix.
    """
    e = env
    while True:
        if callable(getattr(type(e), "check_action", None)):
            return e.check_action
        if not isinstance(e, gym.Wrapper):
            raise TypeError(
                f"{type(e).__name__} has no check_action(action) and wraps no env; "
                "actions can be checked only on a ToolEnv or through wrappers that have one"
            )
        if isinstance(e, gym.ActionWrapper) or e.action_space != e.env.action_space:
            raise TypeError(
                f"wrapper {type(e).__name__} changes or transforms actions and has no check_action(action), "
                "so its actions cannot be checked without stepping. Give it a check_action that raises "
                "ValueError for a bad action without stepping (see agent_gym.wrappers.PaddedTokens), or "
                "apply it outside the vector env."
            )
        e = e.env


def max_observation_len(env: gym.Env) -> int:
    """The most ids a ``ToolEnv``'s observation can hold: ``max_context_tokens + 1``. A prompt or
    a tool result is kept below ``max_context_tokens``, but an action that fills the room left is
    cut to it and then closed with one env-owned end-of-turn token (``ToolEnv._append_action``)."""
    return tool_env_of(env).max_context_tokens + 1


class TextView(gym.Wrapper):
    def __init__(self, env: gym.Env, max_length: int = 1 << 20):
        super().__init__(env)
        self.tool_env = tool_env_of(env)
        self.observation_space = spaces.Text(max_length=max_length, charset=_CHARSET)
        self.action_space = spaces.Text(max_length=max_length, charset=_CHARSET)

    def _text(self, obs: dict[str, np.ndarray]) -> str:
        return self.tool_env.tokenizer.decode(obs["input_ids"], skip_special_tokens=False)

    def check_action(self, action: Any) -> np.ndarray:
        """The ids ``step`` would send for ``action`` (a string), or ``ValueError`` without stepping."""
        return _check_text_action(self, action)

    def reset(self, **kwargs: Any):
        obs, info = self.env.reset(**kwargs)
        return self._text(obs), info

    def step(self, action: str):
        ids = self.check_action(action)
        obs, r, term, trunc, info = self.env.step(ids)
        info["retokenized"] = True
        info["retokenize_lossy"] = self.tool_env.tokenizer.decode(ids[:-1], skip_special_tokens=False) != action
        return self._text(obs), r, term, trunc, info


class ChatView(gym.Wrapper):
    """Chat messages in, reply text out. In a scaffolded env (agent_gym/scaffold.py) the reply is the
    continuation of ``tool_env.scaffold_prefix`` (the pending turn's prefill), which the messages do
    not show; it should stop at ``tool_env.scaffold_stop`` (what ``openai_policy`` sends a server)."""

    def __init__(self, env: gym.Env, max_length: int = 1 << 20):
        super().__init__(env)
        self.tool_env = tool_env_of(env)
        text = spaces.Text(max_length=max_length, charset=_CHARSET)
        self.observation_space = spaces.Sequence(spaces.Dict({"role": text, "content": text}))
        self.action_space = text

    def _messages(self) -> list[dict[str, str]]:
        return [dict(m) for m in self.tool_env.messages]

    def check_action(self, action: Any) -> np.ndarray:
        """The ids ``step`` would send for ``action`` (the reply text), or ``ValueError`` without stepping."""
        return _check_text_action(self, action)

    def reset(self, **kwargs: Any):
        _, info = self.env.reset(**kwargs)
        return self._messages(), info

    def step(self, action: str):
        _, r, term, trunc, info = self.env.step(self.check_action(action))
        info["retokenized"] = True
        msgs = self._messages()
        if term or trunc:  # the env does not append the final turn to its messages
            msgs.append({"role": "assistant", "content": info["turn_text"]})
        return msgs, r, term, trunc, info


class PaddedTokens(gym.Wrapper):
    """Fixed shapes: ``max_len`` ids (default and minimum: :func:`max_observation_len`, the longest
    observation the env can produce) and ``max_action_len`` action ids. An observation longer than
    ``max_len`` (an env that breaks its own bound) raises rather than being cut."""

    def __init__(self, env: gym.Env, max_len: int | None = None, max_action_len: int = 128, pad_id: int | None = None):
        super().__init__(env)
        self.tool_env = te = tool_env_of(env)
        longest = max_observation_len(env)
        self.max_len = int(max_len or longest)
        if self.max_len < longest:
            raise ValueError(
                f"max_len {self.max_len} is below the longest observation the env can produce, "
                f"{longest} ids (max_context_tokens {te.max_context_tokens} + the end-of-turn token "
                "that closes an action cut at the budget); pass max_len >= "
                f"{longest} or leave it None"
            )
        if max_action_len <= 0:
            raise ValueError(f"max_action_len must be positive, got {max_action_len}")
        self.max_action_len = int(max_action_len)
        tok = te.tokenizer
        self.pad_id = int(pad_id) if pad_id is not None else pad_token_id(tok, default=0)
        v = te.vocab_size
        self.observation_space = spaces.Dict(
            {
                "input_ids": spaces.Box(0, v - 1, shape=(self.max_len,), dtype=np.int64),
                "length": spaces.Box(0, self.max_len, shape=(), dtype=np.int64),
            }
        )
        self.no_token = v
        self.action_space = spaces.MultiDiscrete(np.full(self.max_action_len, v + 1, dtype=np.int64))

    def _pad(self, obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ids = obs["input_ids"]
        n = len(ids)
        if n > self.max_len:
            raise RuntimeError(
                f"the env's observation has {n} ids, over PaddedTokens' max_len={self.max_len}; "
                "it is not cut (a cut would drop tokens the policy acted on). The env broke its "
                f"bound of max_context_tokens + 1 = {max_observation_len(self.env)}"
            )
        out = np.full(self.max_len, self.pad_id, dtype=np.int64)
        out[:n] = ids
        return {"input_ids": out, "length": np.asarray(n, dtype=np.int64)}

    def reset(self, **kwargs: Any):
        obs, info = self.env.reset(**kwargs)
        return self._pad(obs), info

    def check_action(self, action: Any) -> np.ndarray:
        """The ids ``step`` would send (``action`` without its "no token" values), or ``ValueError``
        without stepping: ``action`` must be a 1-D integer array of at most ``max_action_len``
        values in ``[0, vocab_size]`` (shorter is padded with "no token"), and the ``ToolEnv`` must
        accept the ids."""
        a = np.asarray(action)
        if a.ndim != 1 or (a.size and not np.issubdtype(a.dtype, np.integer)):
            raise ValueError(
                f"action must be a 1-D array of integer token ids (the value {self.no_token} = no token), "
                f"got shape {a.shape} dtype {a.dtype}; float actions are not truncated to ids"
            )
        if a.size > self.max_action_len:
            raise ValueError(
                f"action has {a.size} values, over max_action_len={self.max_action_len}; "
                "raise max_action_len or cut the turn"
            )
        if a.size and (a.min() < 0 or a.max() > self.no_token):
            raise ValueError(f"action holds values outside [0, {self.no_token}]: min {a.min()}, max {a.max()}")
        ids = a[a != self.no_token].astype(np.int64)
        self.tool_env.check_action(ids)  # e.g. the episode is over
        return ids

    def step(self, action: Any):
        ids = self.check_action(action)
        obs, r, term, trunc, info = self.env.step(ids)
        return self._pad(obs), r, term, trunc, info


def _check_text_action(view: TextView | ChatView, action: Any) -> np.ndarray:
    """A text view's action: a string, encoded as one assistant turn and checked by the env below."""
    if not isinstance(action, str):
        raise ValueError(
            f"{type(view).__name__} actions are strings (the assistant's reply text), got {type(action).__name__}"
        )
    ids = view.tool_env.encode_turn(action)
    view.tool_env.check_action(ids)  # e.g. the episode is over
    return ids
