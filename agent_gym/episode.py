"""``Episode``: the one typed record an env hands to a trainer when an episode ends.

``ToolEnv.step`` puts it in ``info["trajectory"]`` on the step that terminates or truncates the
episode. Everything a trainer, an evaluator or a viewer needs about the episode is a field here;
nothing downstream reads answer-score names (``"em"``, ``"f1"``) or env-specific splits: the env
decides ``success`` itself (``ToolEnv.is_success``).

It holds plain Python values only (no numpy, no torch), so it pickles across the processes of an
async vector env and serializes with ``dataclasses.asdict`` to JSON.

Shapes: T = the episode's length in tokens (prompt + agent turns + env tokens), S = its steps
(assistant turns).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Episode:
    """One finished episode, as the env built it (see docs/design.md, "The env contract")."""

    token_ids: list[int]
    """(T,) the whole context: prompt, every agent turn, every env delta (tool results, turn closers)."""
    loss_mask: list[int]
    """(T,) 1 exactly on the tokens the agent sampled, 0 on prompt and env tokens."""
    prompt_len: int
    """Tokens before the first agent token, the first ``prompt_len`` of ``token_ids``: the opening prompt
    (system + question) and, in a scaffolded env, the first turn's prefix."""
    step_spans: list[list[int]]
    """(S, 2) ``[start, end)`` of each step's agent tokens in ``token_ids`` (``end == start`` for an empty action)."""
    step_rewards: list[float]
    """(S,) the env's reward of each step: its process components, plus the outcome on the last."""
    step_reward_components: list[dict[str, float]]
    """(S,) each step's weighted reward components (``em``, ``format``, ``tool``, ``invalid``, ``hop``...);
    their values sum to that step's reward."""
    step_call_statuses: list[list[str]]
    """(S,) the status of each tool call of each step (``ok``, ``parse_error``, ``bad_arguments``, ``too_many_calls``...)."""
    task_id: str
    task_index: int
    """The task's index in the env's task list; -1 for a task passed in ``reset(options={"task": ...})``."""
    answer: str | None
    """The text of the final ``<answer>``, or None when the episode was truncated without one."""
    answer_scores: dict[str, float]
    """The env's raw answer scores in [0, 1] (e.g. ``{"em": 1.0, "f1": 1.0}``; a QA env with an LLM judge adds
    ``judge`` and ``judge_failed``, agent_gym/judge.py); empty without an answer."""
    success: bool
    """The env's verdict (``ToolEnv.is_success(answer_scores, task)``); False without an answer."""
    truncation_reason: str | None
    """None when the agent answered; else ``max_turns``, ``invalid_calls``, ``tool_budget`` or ``context``."""
    tool_outputs_truncated: int = 0
    """Tool results (or error messages) cut to the env's ``max_tool_output_chars`` in this episode."""
    tool_calls_skipped: int = 0
    """Calls written past the env's ``max_calls_per_turn`` in a turn: neither parsed nor run (each such
    turn also has one ``too_many_calls`` status in ``step_call_statuses``)."""
    step_calls: list[list[str]] = field(default_factory=list)
    """(S,) each step's calls as ``name(arguments)``, the arguments as canonical JSON (keys sorted),
    parallel to ``step_call_statuses``: what the collapse monitors compare (a query repeated within
    an episode, ``trainers.rollout.summarize``)."""
    step_slots: list[str | None] = field(default_factory=list)
    """(S,) the scaffold slot each step's turn had (``"call:search"``, ``"answer"``...; ``None``: a free
    turn, or an env without a scaffold; agent_gym/scaffold.py)."""
    answer_holds_call: bool = False
    """Whether the answer holds a tool call, as the env that scored it reads one (its own tool format's
    calls, a user's format included, or a shipped format's, ``ToolEnv._holds_call``): what
    ``monitor/answer_holds_call_rate`` counts and what ``rewards.call_in_answer`` replaces the answer's
    reward with."""

    @property
    def reward(self) -> float:
        """The episode's return: the sum of its step rewards."""
        return float(sum(self.step_rewards))

    @property
    def turns(self) -> int:
        return len(self.step_spans)

    @property
    def answered(self) -> bool:
        return self.answer is not None

    @property
    def reward_components(self) -> dict[str, float]:
        """Each reward component summed over the episode."""
        total: Counter[str] = Counter()
        for comps in self.step_reward_components:
            total.update(comps)
        return dict(total)

    @property
    def call_statuses(self) -> dict[str, int]:
        """How many tool calls of the episode ended with each status."""
        return dict(Counter(s for step in self.step_call_statuses for s in step))


__all__ = ["Episode"]
