"""``ToolEnv``: a Gymnasium env whose observations and actions are token ids.

The contract (docs/design.md, "The env contract"):

- observation: ``{"input_ids": int64 array}``, the whole context so far;
- action: the ids the policy generated in one assistant turn, stop token included;
- the agent's ids are appended verbatim and never re-encoded; the env closes a turn that ran out
  of length with the end-of-turn token (an env token, outside the loss mask);
- tool results come back through a token-exact chat-template delta (:mod:`agent_gym.chat`);
- every failure of a call (malformed, unknown tool, bad arguments, tool error, timeout, budget)
  becomes a message to the agent and a status in ``info["tool_calls"]``; none raises;
- ``step()`` is transactional: anything that does raise (``KeyboardInterrupt`` from a tool, an
  exception in a subclass hook) leaves the env exactly as before the call; so is ``reset()`` (a
  subclass's own included), after which ``step()`` refuses until a reset succeeds;
- a tool's result is cut to ``max_tool_output_chars`` and a turn's calls to ``max_calls_per_turn``
  (reported in ``info["tool_calls"]`` and the ``Episode``);
- configuration is checked at construction (tool schemas, reward weights) and a task passed to
  ``reset`` is checked there (``required_task_keys``), so neither fails mid-episode.

Subclasses supply tasks, tools and answer scoring; see ``docs/adding_tools_and_envs.md``.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from agent_gym.chat import ChatRenderer
from agent_gym.episode import Episode
from agent_gym.formats import CALL_IN_TEXT, CallOutcome, ParsedTurn, ToolCall, answer_from_text, get_format
from agent_gym.scaffold import Scaffold, Slot, check_drop_prob
from agent_gym.tokenizer import load_tokenizer
from agent_gym.tool_log import ToolRecorder, ToolReplay
from agent_gym.tools import Tool, ToolResult, cap_result, check_arguments, run_tool


@dataclass
class RewardConfig:
    """Weights of the reward components. Each weighted component is logged in
    ``info["reward_components"]``, and the components add up to the step's reward.

    Outcome (on the final step): ``answer_weights`` maps an answer score name returned by the
    env's ``score_answer`` (e.g. ``em``, ``f1``) to its weight. ``format`` is paid once, at the
    end, when the episode ends with a non-blank answer in ``<answer>`` tags (empty tags earn
    nothing). ``format_gate`` (default ``None``) names an answer score (e.g. ``"f1"``): format
    is then paid only when that score is above 0, so a well-formed wrong answer earns no more
    than a blank one and the format reward cannot be taken without answering at least partly
    right. A name the env's ``score_answer`` does not return is refused at the first answer.

    ``call_in_answer`` (default ``None``: off) is what an answer that holds a tool call earns
    (a call the env's tool format parses, or ``agent_gym.formats.CALL_IN_TEXT``: a shipped
    format's call body or tag written into the answer, as a scaffold's answer slot allows): its
    answer components and ``format`` are 0 and the component
    ``call_in_answer`` takes this weight (0.0: no credit; below 0: a penalty). An F1 reward otherwise
    pays such an answer for the words its query shares with the gold (docs/results.md, "The
    temperature lever"). The answer's scores (``answer_scores``, the evaluation's metrics) are not
    changed.

    Process (every step): ``call_ok`` per successful call, ``call_invalid`` per failed call
    (any status but ``ok``), ``no_action`` for a turn with neither call nor answer. Envs may add
    their own process components (e.g. the first retrieval of a supporting paragraph) through
    ``extra``. With ``process_needs_answer`` (default ``False``) the positive process rewards
    count only in an episode that ends with a non-blank answer: one that ends otherwise (a blank
    answer, a turn, context or call limit) gives them back on its last step as the component
    ``process_forfeit`` (their negative sum). Penalties (negative components) are never given
    back. Each step's reward is still paid when it happens; only the episode's sum changes.
    """

    answer_weights: dict[str, float] = field(default_factory=lambda: {"em": 1.0})
    format: float = 0.0
    format_gate: str | None = None
    call_ok: float = 0.0
    call_invalid: float = 0.0
    no_action: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)
    process_needs_answer: bool = False
    call_in_answer: float | None = None

    def __post_init__(self) -> None:
        """Weights must be finite real numbers: a string or NaN weight would only fail (or poison
        every reward) at the first step."""
        for name in ("format", "call_ok", "call_invalid", "no_action"):
            _check_weight(f"rewards.{name}", getattr(self, name))
        if self.call_in_answer is not None:
            _check_weight("rewards.call_in_answer", self.call_in_answer)
        if not isinstance(self.process_needs_answer, bool):
            raise TypeError(f"rewards.process_needs_answer must be true or false, got {self.process_needs_answer!r}")
        if self.format_gate is not None and (not isinstance(self.format_gate, str) or not self.format_gate):
            raise TypeError(
                f"rewards.format_gate must be the name of an answer score (e.g. 'f1') or None, got {self.format_gate!r}"
            )
        for name in ("answer_weights", "extra"):
            table = getattr(self, name)
            if not isinstance(table, dict):
                raise TypeError(f"rewards.{name} must be a dict of name -> weight, got {type(table).__name__}")
            for k, w in table.items():
                if not isinstance(k, str):
                    raise TypeError(f"rewards.{name} keys must be strings, got {k!r}")
                _check_weight(f"rewards.{name}[{k!r}]", w)

    @classmethod
    def from_any(cls, value: RewardConfig | dict | None) -> RewardConfig:
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


def _check_weight(where: str, w: Any) -> None:
    if isinstance(w, bool) or not isinstance(w, (int, float, np.integer, np.floating)):
        raise TypeError(f"{where} must be a number, got {w!r} ({type(w).__name__})")
    if not np.isfinite(w):
        raise ValueError(f"{where} must be finite, got {w!r}")


ANSWER_SOURCES = ("tags", "text", "reply")


DemoPolicy = Callable[[dict[str, Any], np.random.Generator], list[str]]
"""A scripted policy: ``(task, rng) -> the texts of the agent's turns`` (``ToolEnv.demonstrations``)."""


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
        max_context_tokens: the context budget. An action longer than the room left is cut to
            that room, closed with the env's end-of-turn token, and ends the episode with
            ``truncation_reason="context"`` without being parsed or scored (no answer, no tool
            call, reward 0; ``info["action_tokens_dropped"]`` counts the ids cut): nothing past
            the budget is ever scored. A tool response that would leave no room for a next turn
            ends the episode the same way.
        max_tool_calls: tool calls per episode; a call beyond it gets status ``budget`` and ends
            the episode.
        max_calls_per_turn: tool calls read from one turn (default: ``max_tool_calls``). The
            parser stops after that many; the calls after them are neither parsed nor run, and
            count as one failed call with status ``too_many_calls`` (its ``info["tool_calls"]``
            entry has ``"skipped": <how many>``; ``Episode.tool_calls_skipped`` sums them).
        max_tool_output_chars: the most characters of one call's result (or error message) the
            agent sees; a longer one is cut to that many, followed by a line saying how much was
            cut, before anything is encoded. Its ``info["tool_calls"]`` entry then has
            ``"truncated": True`` and ``"output_chars"`` (the full length);
            ``Episode.tool_outputs_truncated`` counts them. Default 32,768. Characters, not tokens:
            counting tokens would mean encoding the whole output, the very cost the cap avoids;
            ``max_context_tokens`` already bounds the tokens a result may add.
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
        answer_source: what a turn with no answer tags and no tool call answers. ``"tags"``
            (default): nothing; only ``<answer>...</answer>`` is scored. ``"text"``: the short
            answer its plain text gives (:func:`agent_gym.formats.answer_from_text`: "The answer
            is: 2009." -> "2009"), as the paper's Naive RAG reads a model's reply. ``"reply"``:
            the whole reply, stripped, so a single-turn task's ``score_answer`` (its reward
            function) scores every completion. An answer read this way ends the episode like a
            tagged one but earns no ``format`` reward; ``info["answer_extracted"]`` is True on its
            step. A subclass may override :meth:`untagged_answer` instead.
        scaffold: scaffolded turns (:mod:`agent_gym.scaffold`): per turn, a prefix the env writes
            before the model's part, stop strings that end it and the text that closes the
            structure after it, all env tokens (loss mask 0). ``None`` (default): none. A dict
            (``turns``, ``drop_prob``, ``slots``), ``True`` (a call slot of the first tool on every
            turn but the last, an answer slot on the last), a ``Scaffold`` or a callable ``(env) ->
            Slot | None``. ``info["stop_strings"]`` (reset and every step) gives the next turn's stop
            strings for the sampler.
        tool_record: a JSONL file to append every tool call to (name, arguments, status, result,
            keyed by task id, reset seed and the call's ordinal; :mod:`agent_gym.tool_log`).
        tool_replay: a file ``tool_record`` wrote: calls are served from it and no tool runs; a
            call that differs from the recording raises ``ToolReplayMismatch`` naming it.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 1}
    required_task_keys: tuple[str, ...] = ("question", "answer")
    """Keys a task passed as ``reset(options={"task": ...})`` must have (subclasses extend it)."""

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
        max_calls_per_turn: int | None = None,
        max_tool_output_chars: int = 32_768,
        answer_source: str = "tags",
        scaffold: Any = None,
        tool_record: str | None = None,
        tool_replay: str | None = None,
    ):
        if max_calls_per_turn is None:
            max_calls_per_turn = max_tool_calls
        _check_settings(
            type(self),
            dict(
                answer_source=answer_source,
                max_turns=max_turns,
                max_context_tokens=max_context_tokens,
                max_tool_calls=max_tool_calls,
                max_invalid_calls=max_invalid_calls,
                max_calls_per_turn=max_calls_per_turn,
                max_tool_output_chars=max_tool_output_chars,
                render_mode=render_mode,
            ),
        )
        names = [t.name for t in tools]
        if len(set(names)) != len(names):
            raise ValueError(f"tool names must be unique, got {names}")
        for t in tools:
            t.check_schema()
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
        self.scaffold = Scaffold.build(scaffold, self)
        self._env_text_ids: dict[str, list[int]] = {}
        self._slot: Slot | None = None
        self._drop_prob = 0.0  # the episode's, set by reset (the scaffold's own, or the reset option)
        self.max_context_tokens = int(max_context_tokens)
        self.max_tool_calls = int(max_tool_calls)
        self.max_invalid_calls = int(max_invalid_calls)
        self.max_calls_per_turn = int(max_calls_per_turn)
        self.max_tool_output_chars = int(max_tool_output_chars)
        self._answer_source = answer_source  # (the code envs have an answer_source() method)
        # A format written before ``max_calls`` existed parses every call; the env caps them after.
        self._parse_takes_limit = "max_calls" in inspect.signature(self.format.parse).parameters
        self.reward_cfg = RewardConfig.from_any(rewards)
        self.render_mode = render_mode
        if tool_record is not None and tool_replay is not None:
            raise ValueError(
                "tool_record and tool_replay exclude each other: record a rollout first, then replay it from that file"
            )
        self._tool_record = ToolRecorder(tool_record) if tool_record is not None else None
        self._tool_replay = ToolReplay(tool_replay) if tool_replay is not None else None
        self.episode_seed: int | None = None

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

    def untagged_answer(self, text: str) -> str | None:
        """The answer of a turn that has no answer tags and no tool call, or None (the turn then
        counts as a turn without a call, as before). ``text`` is the turn's decoded text. By
        ``answer_source``: ``"tags"`` None, ``"text"`` :func:`~agent_gym.formats.answer_from_text`,
        ``"reply"`` the stripped reply. Public: override it to read answers another way."""
        if self._answer_source == "text":
            return answer_from_text(text)
        if self._answer_source == "reply":
            return text.strip() or None
        return None

    def demonstrations(self) -> dict[str, DemoPolicy]:
        """Optional: the env's scripted policies by name, each ``(task, rng) -> assistant turns``
        (the texts of the agent's turns, played through the env by ``trainers.sft.play``). SFT's
        ``demo_policy`` and ``evaluate.py --policy`` pick from these. The default offers ``oracle``
        when the env defines ``demonstration(task)``, else nothing; an env with further policies
        (FactChain: ``protocol``, ``reversed``) returns them too."""
        oracle = getattr(self, "demonstration", None)
        return {} if oracle is None else {"oracle": lambda task, rng: oracle(task)}

    def check_task(self, task: Any) -> dict[str, Any]:
        """A copy of ``task`` if it is a dict with every key in ``required_task_keys`` and a string
        question; else ``ValueError`` naming what is missing (checked at reset, never mid-episode)."""
        if not isinstance(task, dict):
            raise ValueError(f"options['task'] must be a dict, got {type(task).__name__}")
        missing = [k for k in self.required_task_keys if k not in task]
        if missing:
            raise ValueError(
                f"options['task'] is missing key(s) {missing}; {type(self).__name__} tasks need "
                f"{list(self.required_task_keys)} (got keys {sorted(map(str, task))})"
            )
        if not isinstance(task["question"], str):
            raise ValueError(f"options['task']['question'] must be a string, got {type(task['question']).__name__}")
        return dict(task)

    # -- gymnasium API -----------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Start an episode. Transactional, like :meth:`step`, and so is every subclass's own
        ``reset`` (wrapped when the class is defined): if anything raises (a prompt over
        ``max_context_tokens``, a bad task or index, a hook, ``KeyboardInterrupt``), the env is left
        exactly as before the call (the RNG included), and :meth:`step` refuses to act until a
        reset succeeds, since the caller meant to leave the old episode."""
        super().reset(seed=seed)
        self.episode_seed = None if seed is None else int(seed)  # a tool call's key for record and replay
        options = options or {}
        unknown = set(options) - {"task", "task_index", "scaffold_drop_prob"}
        if unknown:
            raise ValueError(
                f"unknown reset option(s) {sorted(unknown)}; valid: 'task', 'task_index', 'scaffold_drop_prob'"
            )
        if "scaffold_drop_prob" in options:
            if self.scaffold is None:
                raise ValueError(
                    "reset option 'scaffold_drop_prob' needs an env built with a scaffold (env kwarg scaffold: ...)"
                )
            self._drop_prob = check_drop_prob(options["scaffold_drop_prob"])
        else:
            self._drop_prob = 0.0 if self.scaffold is None else self.scaffold.drop_prob
        if "task" in options:
            task = self.check_task(options["task"])
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
        self.turn = 0
        self.tool_calls_used = 0
        self.invalid_streak = 0
        self.outputs_truncated = 0
        self.calls_skipped = 0
        self.step_spans: list[list[int]] = []
        self.step_rewards: list[float] = []
        self.step_reward_components: list[dict[str, float]] = []
        self.step_call_statuses: list[list[str]] = []
        self.step_calls: list[list[str]] = []
        self.step_slots: list[str | None] = []
        self.answer: str | None = None
        self.answer_holds_call = False
        self.transcript: list[tuple[str, str]] = [(m["role"], m["content"]) for m in self.messages]
        # The first turn's scaffold prefix (if any) is part of the prompt: everything before the
        # first agent token.
        self._ids = self.renderer.prompt_ids(self.messages) + self._open_slot(1)
        if len(self._ids) >= self.max_context_tokens:
            raise ValueError(
                f"the prompt of task {task.get('id')!r} is {len(self._ids)} tokens, over "
                f"max_context_tokens={self.max_context_tokens}; raise the budget."
            )
        self.prompt_len = len(self._ids)
        self._loss_mask = [0] * self.prompt_len
        self._done = False
        info = {
            "task_id": str(task.get("id", self.task_index)),
            "task_index": self.task_index,
            "prompt_len": self.prompt_len,
            "stop_token_ids": list(self.stop_token_ids),
            "tool_schemas": [t.schema() for t in self.tools.values()],
            "max_new_tokens": self._room(),
            **self._slot_info(),
        }
        return self._obs(), info

    def check_action(self, action: Any) -> list[int]:
        """Validate ``action`` without stepping: the ids as a list, or ``ValueError`` naming what is
        wrong (``RuntimeError`` if the episode is over). :class:`~agent_gym.vector.ToolVectorEnv`
        checks every slot with it before stepping any."""
        failed = self.__dict__.get("_reset_failed")
        if failed is not None:
            raise RuntimeError(
                f"the last reset() failed ({failed}) and changed nothing; step() refuses to go on "
                "with whatever came before it. Call reset() again and let it succeed first."
            )
        if self._done:
            raise RuntimeError("step() called on a finished episode; call reset() first.")
        return _as_id_list(action, self.vocab_size)

    def encode_turn(self, text: str) -> np.ndarray:
        """The action that writes ``text`` as one whole assistant turn: its ids, then the
        end-of-turn token (for scripted policies, demonstrations, text wrappers and tests). The
        text is encoded as a model's output would be (special-token text is a special token)."""
        return np.asarray(self.tokenizer.encode(text, add_special_tokens=False) + [self.eot_id], dtype=np.int64)

    def step(self, action: Any):
        """One assistant turn. Transactional: it either completes, or raises and leaves the env as
        it was before the call (the action is not appended, the turn not counted), so the caller may
        retry, reset or step again. What a tool did to the world outside the env is not undone."""
        action_ids = self.check_action(action)
        saved = self._checkpoint()
        try:
            turn = self._append_action(action_ids)
            if turn.reason is None:  # the action fits the context budget
                turn.parsed = self._parse(turn.read_text)
                if turn.parsed.answer is None and not turn.parsed.calls and not turn.parsed.calls_skipped:
                    untagged = self.untagged_answer(turn.read_text)
                    if untagged is not None:
                        turn.parsed.answer, turn.extracted = untagged, True
                if turn.parsed.answer is not None:
                    self._score_answer(turn)
                else:
                    self._run_turn_calls(turn)
                    self._append_delta(turn)
            return self._finish(turn)
        except BaseException:  # KeyboardInterrupt included: it propagates, the env stays consistent
            self._rollback(saved)
            raise

    # -- the parts of a step, in order -----------------------------------------------------------

    def _append_action(self, action_ids: list[int]) -> _Turn:
        """Append the agent's ids (loss mask 1), the scaffold's closing text if the turn has a slot
        (env tokens, mask 0) and, if the turn did not end with the end-of-turn token, an env-owned
        one (mask 0). An action longer than the context left is cut to fit and ends the episode
        (``truncation_reason="context"``) without being parsed or scored."""
        self.turn += 1
        slot = self._slot
        room = self._room()  # keeps room for the slot's closing text
        dropped = max(len(action_ids) - room, 0)
        if dropped:
            action_ids = action_ids[:room]
        start = len(self._ids)
        self._ids.extend(action_ids)
        self._loss_mask.extend([1] * len(action_ids))
        ends_with_stop = not dropped and bool(action_ids) and action_ids[-1] in self._stop_set
        # Only the end-of-turn token closes a turn in the template; any other ending (length ran
        # out, another stop id such as eos, or the cut above) is closed with an env-owned token.
        closed_by_env = not ends_with_stop or action_ids[-1] != self.eot_id
        body = action_ids[:-1] if ends_with_stop else action_ids
        span = [start, len(self._ids)]
        agent_text = self.tokenizer.decode(body, skip_special_tokens=False)
        text, read_text, slot_info = agent_text, agent_text, None
        if slot is not None:
            value, tail = slot.cut(agent_text)
            # A turn the model ended itself gets no closing text: it would fall outside its message.
            close = "" if (ends_with_stop or dropped) else slot.close_to_write(tail)
            close_ids = self._env_ids(close)
            self._ids.extend(close_ids)
            self._loss_mask.extend([0] * len(close_ids))
            text, read_text = slot.prefix + agent_text + close, slot.read(value)
            slot_info = {
                "slot": slot.name,
                "value": value,
                "stopped_at": None if tail is None else len(value),
                "close_written": close,
            }
        if closed_by_env:
            self._ids.append(self.eot_id)
            self._loss_mask.append(0)
        self.transcript.append(("assistant", text))
        turn = _Turn(
            span=span,
            closed_by_env=closed_by_env,
            text=text,
            dropped=dropped,
            agent_text=agent_text,
            read_text=read_text,
            slot=slot_info,
        )
        if dropped:
            turn.truncated, turn.reason = True, "context"
        return turn

    def _score_answer(self, turn: _Turn) -> None:
        """An answer ends the episode: outcome components from ``score_answer`` and ``format``."""
        answer = turn.parsed.answer
        scores = self.score_answer(answer, self.task)
        if not isinstance(scores, dict):
            raise TypeError(
                f"{type(self).__name__}.score_answer must return a dict of floats, got {type(scores).__name__}"
            )
        turn.answer_scores = {k: float(v) for k, v in scores.items()}
        for k, w in self.reward_cfg.answer_weights.items():
            turn.comps[k] = w * turn.answer_scores.get(k, 0.0)
        # format pays for a tagged answer with something in it: not for an answer read from untagged
        # text, nor for empty tags (a scaffolded answer slot always has the tags; an agent could farm
        # them empty).
        paid = not turn.extracted and bool(answer.strip())
        gate = self.reward_cfg.format_gate
        if gate is not None:
            if gate not in turn.answer_scores:
                raise ValueError(
                    f"rewards.format_gate={gate!r} is not a score {type(self).__name__}.score_answer returns; "
                    f"it returns {sorted(turn.answer_scores)}: name one of them, or set format_gate to null"
                )
            paid = paid and turn.answer_scores[gate] > 0.0
        self.answer_holds_call = self._holds_call(answer)
        if self.reward_cfg.call_in_answer is not None and self.answer_holds_call:
            turn.comps.update(dict.fromkeys(self.reward_cfg.answer_weights, 0.0))
            turn.comps["call_in_answer"] = float(self.reward_cfg.call_in_answer)
            paid = False
        turn.comps["format"] = self.reward_cfg.format if paid else 0.0
        self.answer = answer
        turn.terminated = True

    def _holds_call(self, text: str) -> bool:
        """Whether ``text`` (an answer) holds a tool call: one this env's format parses, in any format
        (a user's own included), or a call of a shipped format, tagged or as a bare JSON body
        (``CALL_IN_TEXT``: what a scaffold's answer slot can hold without the tags)."""
        return bool(CALL_IN_TEXT.search(text)) or bool(self._parse(text).calls)

    def _run_turn_calls(self, turn: _Turn) -> None:
        """Run the turn's calls; process components; the invalid streak and the limits."""
        cfg = self.reward_cfg
        turn.outcomes = self._run_calls(turn.parsed)
        skipped = turn.parsed.calls_skipped
        if skipped:  # the calls past max_calls_per_turn: one failed outcome, nothing parsed or run
            k = self.max_calls_per_turn
            turn.outcomes.append(
                CallOutcome(
                    ToolCall(None, {}, "", f"{skipped} calls past the limit of {k} per turn"),
                    "too_many_calls",
                    ToolResult(
                        f"Error: this turn has {skipped} more tool call(s) after the first {k}; they were not "
                        f"read or run. At most {k} calls are read per turn.",
                        ok=False,
                    ),
                )
            )
            self.calls_skipped += skipped
        for o in turn.outcomes:
            key = "tool" if o.status == "ok" else "invalid"
            turn.comps[key] = turn.comps.get(key, 0.0) + (cfg.call_ok if o.status == "ok" else cfg.call_invalid)
            if o.status == "ok":
                for k, v in self.process_components(o, self.task).items():
                    turn.comps[k] = turn.comps.get(k, 0.0) + float(v)
        if not turn.outcomes:
            turn.comps["no_action"] = cfg.no_action
        valid = any(o.status == "ok" for o in turn.outcomes)
        self.invalid_streak = 0 if valid else self.invalid_streak + 1
        if any(o.status == "budget" for o in turn.outcomes):
            turn.truncated, turn.reason = True, "tool_budget"
        elif self.invalid_streak >= self.max_invalid_calls:
            turn.truncated, turn.reason = True, "invalid_calls"
        elif self.turn >= self.max_turns:
            turn.truncated, turn.reason = True, "max_turns"

    def _append_delta(self, turn: _Turn) -> None:
        """The results (or a nudge) as the next messages: their chat-template delta, then the next
        turn's scaffold prefix (if any), are appended unless the episode ends here or they would
        leave no room for a next turn."""
        msgs = (
            self.format.result_messages(turn.outcomes)
            if turn.outcomes
            else [{"role": "user", "content": self.format.nudge()}]
        )
        if not turn.truncated:
            delta = self.renderer.delta_ids(msgs)
            n_messages = len(self.messages)
            self.messages.append({"role": "assistant", "content": turn.text})
            self.messages.extend(msgs)
            prefix = self._open_slot(self.turn + 1)  # a callable scaffold sees the new messages
            # Keep room for at least one token of the next turn (and the slot's closing text).
            if len(self._ids) + len(delta) + len(prefix) + self._close_reserve() >= self.max_context_tokens:
                turn.truncated, turn.reason = True, "context"
                del self.messages[n_messages:]
                self._slot = None
            else:
                self._ids.extend(delta + prefix)
                self._loss_mask.extend([0] * (len(delta) + len(prefix)))
                self.transcript.extend((m["role"], m["content"]) for m in msgs)
                return
        # The episode ends here: results are kept in the transcript, not the tokens.
        self.transcript.extend((m["role"] + " (after the episode ended)", m["content"]) for m in msgs)

    # -- scaffolded turns (agent_gym/scaffold.py) -------------------------------------------------

    def _open_slot(self, turn: int) -> list[int]:
        """Pick turn ``turn``'s slot (the scaffold's, unless dropped with the episode's drop
        probability) and return the ids of its prefix ([] for a free turn)."""
        slot = None
        if self.scaffold is not None:
            slot = self.scaffold.slot(self, turn)
            if slot is not None and self._drop_prob > 0 and self.np_random.random() < self._drop_prob:
                slot = None
        self._slot = slot
        return [] if slot is None else self._env_ids(slot.prefix)

    def _env_ids(self, text: str) -> list[int]:
        """The ids of scaffold text the env writes into the assistant's turn, encoded as a model's
        output would be (the format's tags are tokens where the tokenizer has them); memoized."""
        ids = self._env_text_ids.get(text)
        if ids is None:
            ids = self.tokenizer.encode(text, add_special_tokens=False) if text else []
            self._env_text_ids[text] = ids
        return list(ids)

    def _close_reserve(self) -> int:
        """Context kept free for the pending slot's closing text."""
        return 0 if self._slot is None else len(self._env_ids(self._slot.close))

    def _room(self) -> int:
        """How many ids the next action may have before the context budget cuts it."""
        return max(self.max_context_tokens - len(self._ids) - self._close_reserve(), 0)

    def _slot_info(self) -> dict[str, Any]:
        """The next turn's scaffold, for the sampler: its stop strings and the slot's name."""
        slot = self._slot
        return {
            "stop_strings": [] if slot is None else list(slot.stop),
            "scaffold": None if slot is None else slot.name,
        }

    @property
    def scaffold_prefix(self) -> str:
        """The text the env has prefilled the pending assistant turn with ("" without a slot): a
        chat client sends it as a partial assistant message (``continue_final_message``)."""
        return "" if self._slot is None or self._done else self._slot.prefix

    @property
    def scaffold_stop(self) -> list[str]:
        """The pending turn's stop strings ([] without a slot)."""
        return [] if self._slot is None or self._done else list(self._slot.stop)

    def _finish(self, turn: _Turn):
        """Record the step (span, reward, components, statuses) and build the step's return."""
        if self.reward_cfg.process_needs_answer and (turn.terminated or turn.truncated):
            self._forfeit_process(turn)
        reward = float(sum(turn.comps.values()))
        calls = [self._call_info(o, turn.parsed) for o in turn.outcomes]
        info: dict[str, Any] = {
            "turn": self.turn,
            "action_span": turn.span,
            "obs_span": [turn.span[1], len(self._ids)],
            "closed_by_env": turn.closed_by_env,
            "action_text": turn.agent_text,
            "turn_text": turn.text,
            "action_tokens_dropped": turn.dropped,
            "tool_calls": calls,
            "reward_components": turn.comps,
            "truncation_reason": turn.reason,
            "max_new_tokens": self._room(),
            "scaffold_slot": turn.slot,
            **self._slot_info(),
        }
        if turn.terminated:
            info["answer"] = turn.parsed.answer
            info["answer_scores"] = turn.answer_scores
            info["answer_extracted"] = turn.extracted
        self.step_spans.append(turn.span)
        self.step_rewards.append(reward)
        self.step_reward_components.append(dict(turn.comps))
        self.step_call_statuses.append([c["status"] for c in calls])
        self.step_calls.append([call_signature(c["name"], c["arguments"]) for c in calls])
        self.step_slots.append(None if turn.slot is None else turn.slot["slot"])
        if turn.terminated or turn.truncated:
            self._slot = None
            info["trajectory"] = self.episode(turn.answer_scores, turn.reason)
            self._done = True
        return self._obs(), reward, turn.terminated, turn.truncated, info

    def _forfeit_process(self, turn: _Turn) -> None:
        """``process_needs_answer``: an episode that ends without a non-blank answer gives back
        the positive process rewards of all its steps (this one's included) on its last step."""
        if turn.terminated and turn.parsed is not None and (turn.parsed.answer or "").strip():
            return
        outcome = {*self.reward_cfg.answer_weights, "format", "call_in_answer"}
        earlier = [v for comps in self.step_reward_components for v in comps.values()]
        here = [v for k, v in turn.comps.items() if k not in outcome]
        turn.comps["process_forfeit"] = -float(sum(v for v in earlier + here if v > 0))

    _EPISODE_LISTS = (
        "_ids",
        "_loss_mask",
        "step_spans",
        "step_rewards",
        "step_reward_components",
        "step_call_statuses",
        "step_calls",
        "step_slots",
        "transcript",
        "messages",
    )
    _EPISODE_SCALARS = (
        "turn",
        "tool_calls_used",
        "invalid_streak",
        "answer",
        "answer_holds_call",
        "_done",
        "outputs_truncated",
        "calls_skipped",
        "_slot",
    )

    episode_state: tuple[str, ...] = ()
    """Names of per-episode attributes a subclass keeps and changes during a step (in
    ``process_components``, ``score_answer``, a tool, ...), e.g. FactChain's ``_hops_found``.
    ``step()`` deep-copies each one before the step and puts the copy back if the step raises, so
    a retried step sees (and pays) what it would have the first time. Declared per class; the
    names of every class in the MRO count, so a subclass lists only its own."""
    _episode_state_all: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Check a class's ``episode_state`` when it is defined and gather those of its MRO."""
        super().__init_subclass__(**kwargs)
        declared = cls.__dict__.get("episode_state", ())
        names_ok = isinstance(declared, (tuple, list)) and all(
            isinstance(k, str) and k.isidentifier() for k in declared
        )
        if not names_ok:
            hint = f" (write ({declared!r},))" if isinstance(declared, str) else ""
            raise TypeError(f"{cls.__name__}.episode_state must be a tuple of attribute names, got {declared!r}{hint}")
        cls._episode_state_all = tuple(
            dict.fromkeys(k for klass in reversed(cls.__mro__) for k in klass.__dict__.get("episode_state", ()))
        )
        own_reset = cls.__dict__.get("reset")
        if callable(own_reset) and not getattr(own_reset, "__agent_gym_transactional__", False):
            cls.reset = _transactional_reset(own_reset)  # type: ignore[method-assign]

    def _reset_checkpoint(self) -> tuple[dict[str, Any], dict[str, Any], Any, Any]:
        """What a reset may change: every attribute (a shallow copy of ``__dict__``: reset assigns
        new episode lists rather than changing the old ones), a deep copy of ``episode_state``
        (which a subclass may change in place), and the RNG's state (drawing a task index advances
        it in place)."""
        rng = self.__dict__.get("_np_random")
        return (
            dict(self.__dict__),
            {k: copy.deepcopy(getattr(self, k, _MISSING)) for k in self._episode_state_all},
            rng,
            None if rng is None else copy.deepcopy(rng.bit_generator.state),
        )

    def _reset_rollback(self, saved: tuple[dict[str, Any], dict[str, Any], Any, Any]) -> None:
        attrs, extra, rng, rng_state = saved
        for k in [k for k in self.__dict__ if k not in attrs]:
            del self.__dict__[k]
        self.__dict__.update(attrs)
        for k, v in extra.items():
            if v is _MISSING:
                self.__dict__.pop(k, None)
            else:
                setattr(self, k, v)
        if rng is not None:
            rng.bit_generator.state = rng_state

    def _checkpoint(self) -> tuple[dict[str, int], dict[str, Any], dict[str, Any]]:
        """The episode state a step may change. Steps only append to the lists, so their lengths
        are enough to undo one; a subclass's ``episode_state`` is deep-copied."""
        return (
            {k: len(getattr(self, k)) for k in self._EPISODE_LISTS},
            {k: getattr(self, k) for k in self._EPISODE_SCALARS},
            {k: copy.deepcopy(getattr(self, k, _MISSING)) for k in self._episode_state_all},
        )

    def _rollback(self, saved: tuple[dict[str, int], dict[str, Any], dict[str, Any]]) -> None:
        lengths, scalars, extra = saved
        for k, n in lengths.items():
            del getattr(self, k)[n:]
        for k, v in scalars.items():
            setattr(self, k, v)
        for k, v in extra.items():
            if v is _MISSING:
                if hasattr(self, k):
                    delattr(self, k)
            else:
                setattr(self, k, v)

    def episode(self, answer_scores: dict[str, float], truncation_reason: str | None) -> Episode:
        """The episode so far as the typed record the trainer reads: ``info["trajectory"]`` at its end
        (not ``info["episode"]``, which Gymnasium's ``RecordEpisodeStatistics`` owns)."""
        scores = {k: float(v) for k, v in answer_scores.items()}
        return Episode(
            token_ids=list(self._ids),
            loss_mask=list(self._loss_mask),
            prompt_len=self.prompt_len,
            step_spans=[list(s) for s in self.step_spans],
            step_rewards=list(self.step_rewards),
            step_reward_components=[dict(c) for c in self.step_reward_components],
            step_call_statuses=[list(s) for s in self.step_call_statuses],
            task_id=str(self.task.get("id", self.task_index)),
            task_index=self.task_index,
            answer=self.answer,
            answer_scores=scores,
            success=self.answer is not None and bool(self.is_success(scores, self.task)),
            truncation_reason=truncation_reason,
            tool_outputs_truncated=self.outputs_truncated,
            tool_calls_skipped=self.calls_skipped,
            step_slots=list(self.step_slots),
            step_calls=[list(c) for c in self.step_calls],
            answer_holds_call=self.answer_holds_call,
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

    def _parse(self, text: str) -> ParsedTurn:
        """The format's parse, reading at most ``max_calls_per_turn`` calls."""
        k = self.max_calls_per_turn
        parsed = self.format.parse(text, max_calls=k) if self._parse_takes_limit else self.format.parse(text)
        if len(parsed.calls) > k:  # a format that ignores max_calls: its extra calls are not run either
            parsed.calls_skipped += len(parsed.calls) - k
            del parsed.calls[k:]
        return parsed

    def _run_calls(self, parsed: ParsedTurn) -> list[CallOutcome]:
        outcomes = []
        for call in parsed.calls:
            o = self._run_call(call)
            o.result, o.output_chars = cap_result(o.result, self.max_tool_output_chars)
            if o.output_chars is not None:
                self.outputs_truncated += 1
            outcomes.append(o)
        return outcomes

    @staticmethod
    def _call_info(o: CallOutcome, parsed: ParsedTurn) -> dict[str, Any]:
        """One ``info["tool_calls"]`` entry: name, arguments, status, and the flags of a cut result
        (``truncated``, ``output_chars``) or of the calls past the per-turn limit (``skipped``)."""
        entry: dict[str, Any] = {"name": o.call.name, "arguments": o.call.arguments, "status": o.status}
        if o.output_chars is not None:
            entry["truncated"], entry["output_chars"] = True, o.output_chars
        if o.status == "too_many_calls":
            entry["skipped"] = parsed.calls_skipped
        return entry

    def _run_call(self, call: ToolCall) -> CallOutcome:
        if call.error is not None:
            return CallOutcome(
                call, "parse_error", ToolResult(f"Error: could not parse the tool call: {call.error}", ok=False)
            )
        t = self.tools.get(call.name)  # type: ignore[arg-type]
        if t is None:
            return CallOutcome(
                call,
                "unknown_tool",
                ToolResult(f"Error: unknown tool {call.name!r}. Available tools: {sorted(self.tools)}", ok=False),
            )
        bad = check_arguments(t, call.arguments)  # never raises: a validation that fails is a tool_error
        if bad is not None:  # invalid arguments do not spend the budget
            return CallOutcome(call, *bad)
        if self.tool_calls_used >= self.max_tool_calls:
            return CallOutcome(
                call, "budget", ToolResult(f"Error: tool budget of {self.max_tool_calls} calls is spent.", ok=False)
            )
        key = {
            "task_id": str(self.task.get("id", self.task_index)),
            "seed": self.episode_seed,
            "call": self.tool_calls_used,
        }
        if self._tool_replay is not None:  # agent_gym/tool_log.py: the recorded result, no tool run
            status, result = self._tool_replay.serve(**key, name=call.name, arguments=call.arguments)
        else:
            status, result = run_tool(t, call.arguments, validate=False, scope=self)  # abandoned calls bounded per env
            if self._tool_record is not None:
                self._tool_record.write(
                    **key, turn=self.turn, name=call.name, arguments=call.arguments, status=status, result=result
                )
        self.tool_calls_used += 1
        return CallOutcome(call, status, result)


@dataclass
class _Turn:
    """What one step has found so far, passed between the named parts of :meth:`ToolEnv.step`."""

    span: list[int]
    closed_by_env: bool
    text: str
    """The turn's content in the context: the scaffold prefix, the agent's text, the closing text written."""
    dropped: int = 0
    agent_text: str = ""
    """The decoded agent tokens (without the end-of-turn token)."""
    read_text: str = ""
    """What the env parses: the agent's text, or a slot's ``prefix + value + close``."""
    slot: dict[str, Any] | None = None
    """The turn's scaffold slot (name, value, where the model's part stopped, the close written), or None."""
    parsed: ParsedTurn | None = None
    comps: dict[str, float] = field(default_factory=dict)
    outcomes: list[CallOutcome] = field(default_factory=list)
    answer_scores: dict[str, float] = field(default_factory=dict)
    terminated: bool = False
    truncated: bool = False
    reason: str | None = None
    extracted: bool = False  # the answer came from untagged_answer, not from answer tags


_LIMITS = (
    "max_turns",
    "max_context_tokens",
    "max_tool_calls",
    "max_invalid_calls",
    "max_calls_per_turn",
    "max_tool_output_chars",
)


def _check_settings(env_cls: type, settings: dict[str, Any]) -> None:
    """``ToolEnv``'s checks of its own settings, on those present in ``settings``: the limits are
    positive integers, ``answer_source``, ``render_mode`` and ``tool_format`` are known ones."""
    for name in _LIMITS:
        v = settings.get(name)
        if name in settings and (v is not None or name != "max_calls_per_turn"):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if "answer_source" in settings and settings["answer_source"] not in ANSWER_SOURCES:
        raise ValueError(
            f"answer_source must be one of {ANSWER_SOURCES}, got {settings['answer_source']!r}: 'tags' scores "
            "only <answer>...</answer>; 'text' also reads the short answer a reply without tags "
            "gives; 'reply' takes the whole reply as the answer"
        )
    modes = env_cls.metadata["render_modes"]
    if settings.get("render_mode") is not None and settings["render_mode"] not in modes:
        raise ValueError(f"render_mode must be None or one of {modes}, got {settings['render_mode']!r}")
    if "tool_format" in settings:
        get_format(settings["tool_format"])  # raises naming the valid formats


def init_arguments(klasses: Any) -> set[str]:
    """The named arguments (no ``self``, no ``*args`` or ``**kwargs``) of the ``__init__`` each of
    ``klasses`` defines itself: what a class hierarchy takes, read without building it."""
    named: set[str] = set()
    for klass in klasses:
        if "__init__" in vars(klass):
            named |= {
                n
                for n, p in inspect.signature(klass.__init__).parameters.items()
                if n != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
            }
    return named


def nearest_hint(key: str, valid: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` for the valid name nearest ``key``; empty when none is near."""
    import difflib  # deferred: only on the error path

    near = difflib.get_close_matches(key, sorted(valid), n=1)
    return f" (did you mean {near[0]!r}?)" if near else ""


def check_env_kwargs(env_cls: type, kwargs: dict[str, Any]) -> None:
    """Refuse, before an env subclass reads any data, what ``ToolEnv.__init__`` would refuse only
    after it: a keyword argument neither the subclass nor ``ToolEnv`` takes (``TypeError`` naming
    the nearest valid name and all of them) and a bad value of a ``ToolEnv`` setting
    (``_check_settings``). ``kwargs``: what the subclass passes on to ``ToolEnv``, with the
    ``ToolEnv`` settings it names itself (``max_turns``, ``tool_format``, ...)."""
    base = init_arguments([ToolEnv]) - {"tools"}
    unknown = [k for k in kwargs if k not in base]
    if unknown:
        valid = sorted(base | init_arguments(c for c in env_cls.__mro__ if c is not ToolEnv) - {"tools"})
        raise TypeError(
            f"{env_cls.__name__} got an unknown keyword argument {unknown[0]!r}{nearest_hint(unknown[0], valid)}. "
            f"Valid arguments: {', '.join(valid)}"
        )
    _check_settings(env_cls, kwargs)


def call_signature(name: Any, arguments: Any) -> str:
    """A call as ``name(arguments)``, the arguments as canonical JSON (``Episode.step_calls``)."""
    try:
        args = json.dumps(arguments, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError):
        args = repr(arguments)
    return f"{name}({args})"


class _Missing:
    """The type of ``_MISSING``; it survives ``copy.deepcopy`` as itself (a plain ``object()``
    would be copied into a new object, and ``v is _MISSING`` would then never hold)."""

    def __deepcopy__(self, memo: Any) -> _Missing:
        return self

    def __copy__(self) -> _Missing:
        return self

    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Missing()
"""An ``episode_state`` attribute that did not exist at the checkpoint (deleted on rollback)."""


def _transactional_reset(fn: Any) -> Any:
    """``fn`` (a ``reset``) made transactional: the outermost call checkpoints the env and, if
    anything raises (``KeyboardInterrupt`` included), restores it and records the failure so that
    ``step`` refuses until a reset succeeds. Inner calls (a subclass's ``super().reset``) run as is."""

    @functools.wraps(fn)
    def reset(self: ToolEnv, *args: Any, **kwargs: Any):
        if self.__dict__.get("_in_reset"):
            return fn(self, *args, **kwargs)
        saved = self._reset_checkpoint()
        self.__dict__["_in_reset"] = True
        try:
            out = fn(self, *args, **kwargs)
        except BaseException as e:
            self._reset_rollback(saved)
            msg = _short(e)
            self.__dict__["_reset_failed"] = f"{type(e).__name__}: {msg}" if msg else type(e).__name__
            raise
        finally:
            self.__dict__["_in_reset"] = False
        self.__dict__["_reset_failed"] = None
        return out

    reset.__agent_gym_transactional__ = True  # type: ignore[attr-defined]
    return reset


def _short(e: BaseException, limit: int = 300) -> str:
    try:
        text = str(e)
    except Exception:  # an exception whose __str__ raises
        return f"<unprintable {type(e).__name__}>"
    return text if len(text) <= limit else text[:limit] + "..."


ToolEnv.reset = _transactional_reset(ToolEnv.reset)  # type: ignore[method-assign]


def _as_id_list(action: Any, vocab_size: int) -> list[int]:
    """Validate an action (a 1-D sequence of ids) and return it as a list of ints."""
    arr = np.asarray(action)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(f"action must be a 1-D sequence of integer token ids, got shape {arr.shape} dtype {arr.dtype}")
    if arr.size and (arr.min() < 0 or arr.max() >= vocab_size):
        raise ValueError(f"action holds token ids outside [0, {vocab_size}): min {arr.min()}, max {arr.max()}")
    return arr.tolist()
