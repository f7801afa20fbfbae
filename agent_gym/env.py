"""``ToolEnv``: a Gymnasium env whose observations and actions are token ids.

The contract (DESIGN.md, "token in, token out"):

- observation: ``{"input_ids": int64 array}``, the whole context so far;
- action: the ids the policy generated in one assistant turn, stop token included;
- the agent's ids are appended verbatim and never re-encoded; the env closes a turn that ran out
  of length with the end-of-turn token (an env token, outside the loss mask);
- tool results come back through a token-exact chat-template delta (:mod:`agent_gym.chat`);
- every failure of a call (malformed, unknown tool, bad arguments, tool error, timeout, budget)
  becomes a message to the agent and a status in ``info["tool_calls"]``; none raises.

Subclasses supply tasks, tools and answer scoring; see ``docs/adding_tools_and_envs.md``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from agent_gym.chat import ChatRenderer
from agent_gym.episode import Episode
from agent_gym.formats import CallOutcome, ParsedTurn, ToolCall, get_format
from agent_gym.tokenizer import load_tokenizer
from agent_gym.tools import Tool, ToolResult, run_tool


@dataclass
class RewardConfig:
    """Weights of the reward components. Each weighted component is logged in
    ``info["reward_components"]``, and the components add up to the step's reward.

    Outcome (on the final step): ``answer_weights`` maps an answer score name returned by the
    env's ``score_answer`` (e.g. ``em``, ``f1``) to its weight. ``format`` is paid once, at the
    end, when the episode ends with an answer in ``<answer>`` tags.

    Process (every step): ``call_ok`` per successful call, ``call_invalid`` per failed call
    (any status but ``ok``), ``no_action`` for a turn with neither call nor answer. Envs may add
    their own process components (e.g. the first retrieval of a supporting paragraph) through
    ``extra``.
    """

    answer_weights: dict[str, float] = field(default_factory=lambda: {"em": 1.0})
    format: float = 0.0
    call_ok: float = 0.0
    call_invalid: float = 0.0
    no_action: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_any(cls, value: "RewardConfig | dict | None") -> "RewardConfig":
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise TypeError(f"rewards must be a RewardConfig or a dict, got {type(value).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - names)
        if unknown:
            raise ValueError(f"unknown reward key(s) {unknown}; valid keys: {sorted(names)}")
        return cls(**value)


class ToolEnv(gym.Env):
    """Base class of every tool-using text env.

    Args:
        tools: the tools the agent may call. May be empty for an env where the agent only
            answers (e.g. NaiveRAG): the format's call instructions are then left out, and any
            call the agent writes gets status ``unknown_tool`` (or ``parse_error``).
        tokenizer: a tokenizer object, a local path, a hub name, or ``None`` for the built-in one.
        tool_format: a name from :func:`agent_gym.formats.list_formats`.
        system_prompt: the task instructions; the format's call instructions are appended.
        max_turns: assistant turns before truncation.
        max_context_tokens: the context budget; a turn that would exceed it truncates.
        max_tool_calls: tool calls per episode; a call beyond it gets status ``budget`` and ends
            the episode.
        max_invalid_calls: consecutive turns with only failed calls (or no call and no answer)
            before truncation.
        rewards: a :class:`RewardConfig` or a dict of its fields.
        render_mode: ``None`` or ``"ansi"``.
        eot_token: the assistant end-of-turn token; detected from the chat template by default.
        vocab_size: the action space's V; defaults to the tokenizer's length. Pass the model's
            (padded) embedding size so every id the model can sample is a valid action.
        tools_in_prompt: pass the tool schemas to the chat template (formats that use it). False
            leaves them out, for small models trained on the format, where the schema block
            would be most of the context.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 1}

    def __init__(
        self,
        tools: Sequence[Tool],
        tokenizer: Any = None,
        tool_format: str = "hermes",
        system_prompt: str = "You are a helpful assistant.",
        max_turns: int = 8,
        max_context_tokens: int = 4096,
        max_tool_calls: int = 16,
        max_invalid_calls: int = 3,
        rewards: RewardConfig | dict | None = None,
        render_mode: str | None = None,
        eot_token: str | None = None,
        vocab_size: int | None = None,
        tools_in_prompt: bool = True,
    ):
        for name, v in (("max_turns", max_turns), ("max_context_tokens", max_context_tokens),
                        ("max_tool_calls", max_tool_calls), ("max_invalid_calls", max_invalid_calls)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be None or one of {self.metadata['render_modes']}, got {render_mode!r}")
        names = [t.name for t in tools]
        if len(set(names)) != len(names):
            raise ValueError(f"tool names must be unique, got {names}")
        self.tools: dict[str, Tool] = {t.name: t for t in tools}
        self.format = get_format(tool_format)
        if tools:
            self.format.check_tools(list(tools))
        self.tokenizer = load_tokenizer(tokenizer)
        schemas = [t.schema() for t in tools] if (self.format.uses_template_tools and tools_in_prompt) else None
        self.renderer = ChatRenderer(self.tokenizer, schemas, eot_token=eot_token)
        self.system_prompt = system_prompt.rstrip()
        if tools:
            self.system_prompt += "\n\n" + self.format.instructions(list(tools))
        self.max_turns = int(max_turns)
        self.max_context_tokens = int(max_context_tokens)
        self.max_tool_calls = int(max_tool_calls)
        self.max_invalid_calls = int(max_invalid_calls)
        self.reward_cfg = RewardConfig.from_any(rewards)
        self.render_mode = render_mode

        self.eot_id = self.renderer.eot_id
        stop = [self.eot_id]
        if self.tokenizer.eos_token_id is not None and self.tokenizer.eos_token_id != self.eot_id:
            stop.append(int(self.tokenizer.eos_token_id))
        self.stop_token_ids: list[int] = stop
        self._stop_set = frozenset(stop)
        vocab = max(len(self.tokenizer), getattr(self.tokenizer, "vocab_size", 0))
        if vocab_size is not None:
            if vocab_size < vocab:
                raise ValueError(f"vocab_size {vocab_size} is below the tokenizer's {vocab} tokens")
            vocab = vocab_size  # a model's embedding table is often padded past the tokenizer
        self.vocab_size = int(vocab)
        self.observation_space = spaces.Dict(
            {"input_ids": spaces.Sequence(spaces.Discrete(self.vocab_size), stack=True)}
        )
        self.action_space = spaces.Sequence(spaces.Discrete(self.vocab_size), stack=True)
        self._ids: list[int] = []
        self._done = True

    # -- hooks for subclasses ----------------------------------------------------------------

    def num_tasks(self) -> int:
        raise NotImplementedError

    def get_task(self, index: int) -> dict[str, Any]:
        """Task ``index`` as a dict with at least ``id`` and ``question``."""
        raise NotImplementedError

    def task_messages(self, task: dict[str, Any]) -> list[dict[str, str]]:
        """The opening messages; by default the system prompt and the question."""
        return [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": task["question"]}]

    def score_answer(self, answer: str, task: dict[str, Any]) -> dict[str, float]:
        """Raw answer scores in [0, 1], e.g. ``{"em": 1.0, "f1": 1.0}``."""
        raise NotImplementedError

    def process_components(self, outcome: CallOutcome, task: dict[str, Any]) -> dict[str, float]:
        """Extra weighted process-reward components for one call (see ``RewardConfig.extra``)."""
        return {}

    def is_success(self, answer_scores: dict[str, float], task: dict[str, Any]) -> bool:
        """Whether an answer with these scores solves ``task`` (``Episode.success``). Default: exact
        match, ``answer_scores["em"] >= 1``; an env whose answers are judged otherwise overrides it."""
        return float(answer_scores.get("em", 0.0)) >= 1.0

    # -- gymnasium API -----------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        options = options or {}
        unknown = set(options) - {"task", "task_index"}
        if unknown:
            raise ValueError(f"unknown reset option(s) {sorted(unknown)}; valid: 'task', 'task_index'")
        if "task" in options:
            task = dict(options["task"])
            self.task_index = -1
        else:
            n = self.num_tasks()
            k = options.get("task_index")
            if k is None:
                k = int(self.np_random.integers(n))
            if not 0 <= int(k) < n:
                raise ValueError(f"task_index {k} out of range: this env has {n} tasks")
            self.task_index = int(k)
            task = self.get_task(self.task_index)
        self.task = task
        self.messages = self.task_messages(task)
        self._ids = self.renderer.prompt_ids(self.messages)
        if len(self._ids) >= self.max_context_tokens:
            raise ValueError(f"the prompt of task {task.get('id')!r} is {len(self._ids)} tokens, over "
                             f"max_context_tokens={self.max_context_tokens}; raise the budget.")
        self.prompt_len = len(self._ids)
        self._loss_mask = [0] * self.prompt_len
        self.turn = 0
        self.tool_calls_used = 0
        self.invalid_streak = 0
        self.step_spans: list[list[int]] = []
        self.step_rewards: list[float] = []
        self.step_reward_components: list[dict[str, float]] = []
        self.step_call_statuses: list[list[str]] = []
        self.answer: str | None = None
        self.transcript: list[tuple[str, str]] = [(m["role"], m["content"]) for m in self.messages]
        self._done = False
        info = {
            "task_id": str(task.get("id", self.task_index)),
            "task_index": self.task_index,
            "prompt_len": self.prompt_len,
            "stop_token_ids": list(self.stop_token_ids),
            "tool_schemas": [t.schema() for t in self.tools.values()],
            "max_new_tokens": self.max_context_tokens - self.prompt_len,
        }
        return self._obs(), info

    def check_action(self, action: Any) -> list[int]:
        """Validate ``action`` without stepping: the ids as a list, or ``ValueError`` naming what is
        wrong (``RuntimeError`` if the episode is over). :class:`~agent_gym.vector.ToolVectorEnv`
        checks every slot with it before stepping any."""
        if self._done:
            raise RuntimeError("step() called on a finished episode; call reset() first.")
        return _as_id_list(action, self.vocab_size)

    def step(self, action: Any):
        action_ids = self.check_action(action)
        self.turn += 1
        start = len(self._ids)
        self._ids.extend(action_ids)
        self._loss_mask.extend([1] * len(action_ids))
        action_span = [start, len(self._ids)]
        ends_with_stop = bool(action_ids) and action_ids[-1] in self._stop_set
        # Only the end-of-turn token closes a turn in the template; any other ending (length ran
        # out, or another stop id such as eos) is closed by the env with an env-owned token.
        closed_by_env = not ends_with_stop or action_ids[-1] != self.eot_id
        body = action_ids[:-1] if ends_with_stop else action_ids
        if closed_by_env:
            self._ids.append(self.eot_id)
            self._loss_mask.append(0)
        text = self.tokenizer.decode(body, skip_special_tokens=False)
        parsed = self.format.parse(text)
        self.transcript.append(("assistant", text))

        comps: dict[str, float] = {}
        outcomes: list[CallOutcome] = []
        terminated = truncated = False
        reason: str | None = None
        answer_scores: dict[str, float] = {}
        if parsed.answer is not None:
            self.answer = parsed.answer
            answer_scores = self.score_answer(parsed.answer, self.task)
            for k, w in self.reward_cfg.answer_weights.items():
                comps[k] = w * float(answer_scores.get(k, 0.0))
            comps["format"] = self.reward_cfg.format
            terminated = True
        else:
            outcomes = self._run_calls(parsed)
            for o in outcomes:
                key = "tool" if o.status == "ok" else "invalid"
                comps[key] = comps.get(key, 0.0) + (self.reward_cfg.call_ok if o.status == "ok" else self.reward_cfg.call_invalid)
                if o.status == "ok":
                    for k, v in self.process_components(o, self.task).items():
                        comps[k] = comps.get(k, 0.0) + v
            if not outcomes:
                comps["no_action"] = self.reward_cfg.no_action
            valid = any(o.status == "ok" for o in outcomes)
            self.invalid_streak = 0 if valid else self.invalid_streak + 1
            if any(o.status == "budget" for o in outcomes):
                truncated, reason = True, "tool_budget"
            elif self.invalid_streak >= self.max_invalid_calls:
                truncated, reason = True, "invalid_calls"
            elif self.turn >= self.max_turns:
                truncated, reason = True, "max_turns"

        obs_start = action_span[1]
        msgs = []
        if not terminated:
            msgs = self.format.result_messages(outcomes) if outcomes else [{"role": "user", "content": self.format.nudge()}]
        if truncated:  # the episode ends here: results are kept in the transcript, not the tokens
            self.transcript.extend((m["role"] + " (after the episode ended)", m["content"]) for m in msgs)
        elif not terminated:
            delta = self.renderer.delta_ids(msgs)
            # Keep room for at least one token of the next turn.
            if len(self._ids) + len(delta) >= self.max_context_tokens:
                truncated, reason = True, "context"
            else:
                self._ids.extend(delta)
                self._loss_mask.extend([0] * len(delta))
                self.messages.append({"role": "assistant", "content": text})
                self.messages.extend(msgs)
                self.transcript.extend((m["role"], m["content"]) for m in msgs)

        reward = float(sum(comps.values()))
        self.step_spans.append(action_span)
        self.step_rewards.append(reward)
        info: dict[str, Any] = {
            "turn": self.turn,
            "action_span": action_span,
            "obs_span": [obs_start, len(self._ids)],
            "closed_by_env": closed_by_env,
            "action_text": text,
            "tool_calls": [{"name": o.call.name, "arguments": o.call.arguments, "status": o.status} for o in outcomes],
            "reward_components": comps,
            "truncation_reason": reason,
            "max_new_tokens": max(self.max_context_tokens - len(self._ids), 0),
        }
        if terminated:
            info["answer"] = parsed.answer
            info["answer_scores"] = answer_scores
        self.step_reward_components.append(dict(comps))
        self.step_call_statuses.append([c["status"] for c in info["tool_calls"]])
        if terminated or truncated:
            self._done = True
            info["trajectory"] = self.episode(answer_scores, reason)
        return self._obs(), reward, terminated, truncated, info

    def episode(self, answer_scores: dict[str, float], truncation_reason: str | None) -> Episode:
        """The episode so far as the typed record the trainer reads: ``info["trajectory"]`` at its end
        (not ``info["episode"]``, which Gymnasium's ``RecordEpisodeStatistics`` owns)."""
        scores = {k: float(v) for k, v in answer_scores.items()}
        return Episode(
            token_ids=list(self._ids), loss_mask=list(self._loss_mask), prompt_len=self.prompt_len,
            step_spans=[list(s) for s in self.step_spans], step_rewards=list(self.step_rewards),
            step_reward_components=[dict(c) for c in self.step_reward_components],
            step_call_statuses=[list(s) for s in self.step_call_statuses],
            task_id=str(self.task.get("id", self.task_index)), task_index=self.task_index, answer=self.answer,
            answer_scores=scores, success=self.answer is not None and bool(self.is_success(scores, self.task)),
            truncation_reason=truncation_reason,
        )

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        lines = []
        for role, content in self.transcript:
            lines.append(f"[{role}]\n{content}")
        return "\n\n".join(lines) + "\n"

    # -- internals ---------------------------------------------------------------------------

    def _obs(self) -> dict[str, np.ndarray]:
        return {"input_ids": np.array(self._ids, dtype=np.int64)}

    def _run_calls(self, parsed: ParsedTurn) -> list[CallOutcome]:
        outcomes = []
        for call in parsed.calls:
            outcomes.append(self._run_call(call))
        return outcomes

    def _run_call(self, call: ToolCall) -> CallOutcome:
        if call.error is not None:
            return CallOutcome(call, "parse_error", ToolResult(f"Error: could not parse the tool call: {call.error}", ok=False))
        t = self.tools.get(call.name)  # type: ignore[arg-type]
        if t is None:
            return CallOutcome(call, "unknown_tool", ToolResult(
                f"Error: unknown tool {call.name!r}. Available tools: {sorted(self.tools)}", ok=False))
        err = t.validate(call.arguments)
        if err is not None:  # invalid arguments do not spend the budget
            return CallOutcome(call, "bad_arguments", ToolResult(f"Error: bad arguments for {t.name}: {err}", ok=False))
        if self.tool_calls_used >= self.max_tool_calls:
            return CallOutcome(call, "budget", ToolResult(
                f"Error: tool budget of {self.max_tool_calls} calls is spent.", ok=False))
        self.tool_calls_used += 1
        status, result = run_tool(t, call.arguments, validate=False)
        return CallOutcome(call, status, result)


def _as_id_list(action: Any, vocab_size: int) -> list[int]:
    """Validate an action (a 1-D sequence of ids) and return it as a list of ints."""
    arr = np.asarray(action)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(f"action must be a 1-D sequence of integer token ids, got shape {arr.shape} dtype {arr.dtype}")
    if arr.size and (arr.min() < 0 or arr.max() >= vocab_size):
        raise ValueError(f"action holds token ids outside [0, {vocab_size}): min {arr.min()}, max {arr.max()}")
    return arr.tolist()
