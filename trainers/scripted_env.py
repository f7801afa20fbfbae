"""A ``ToolEnv`` whose turns follow a per-task script, and the tool it calls: rollouts of a model that
writes no tool calls of its own (the tiny random Qwen2 of :mod:`trainers.tiny_model`) still have
several turns with real tool responses between them. Used by the asynchronous-rollout tests
(tests/trainers/test_rollout_async.py) and benchmark (benchmarks/perf/rollout_async.py).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from agent_gym.env import ToolEnv
from agent_gym.formats import ParsedTurn, ToolCall
from agent_gym.tools import Tool, ToolResult

LATENCY_MEDIAN_S = 0.2
LATENCY_SIGMA = 1.16
"""ln(3 s / 0.2 s) / 2.326: the 99th percentile of the lognormal at about 3 s."""
TOOL_TIMEOUT_S = 8.0


class WorkTool(Tool):
    """``work(task, turn)``: calls ``behaviour(task, turn)`` (which may sleep, block or raise) and
    returns its text. ``timeout``: the env gives up on a call after that long (status ``timeout``)."""

    name, description = "work", "Do the work of one turn."
    parameters = {
        "type": "object",
        "properties": {"task": {"type": "string"}, "turn": {"type": "integer"}},
        "required": ["task", "turn"],
    }

    def __init__(self, behaviour: Callable[[str, int], str], timeout: float | None = TOOL_TIMEOUT_S):
        self.behaviour, self.timeout = behaviour, timeout

    def execute(self, task: str, turn: int) -> ToolResult:
        return ToolResult(f"work {task} turn {turn}: {self.behaviour(task, turn)}")


class ScriptedToolEnv(ToolEnv):
    """A ``ToolEnv`` whose turns are scripted per task, for rollout benchmarks and tests on a model
    that writes no tool calls (the tiny random Qwen2): turn t < ``task["turns"]`` calls
    ``work(task=id, turn=t)`` whatever the agent wrote, turn ``task["turns"]`` answers
    ``task["answer"]``. Everything else (the agent's tokens, masks, spans, the tool's run with its
    timeout, the tool response's tokens) is the real ``ToolEnv``'s.

    The script replaces ``ToolEnv._parse``: the one hook between the agent's text and the calls,
    which no public hook covers for calls (``untagged_answer`` covers answers only)."""

    def __init__(self, tasks: list[dict[str, Any]], tool: Tool, tokenizer: Any = None, **kw: Any):
        kw.setdefault("max_turns", max(t["turns"] for t in tasks) + 1)
        kw.setdefault("max_invalid_calls", 8)
        kw.setdefault("max_context_tokens", 1024)
        kw.setdefault("tools_in_prompt", False)
        super().__init__(tools=[tool], tokenizer=tokenizer, **kw)
        self.tasks = tasks

    def num_tasks(self) -> int:
        return len(self.tasks)

    def get_task(self, index: int) -> dict[str, Any]:
        return self.tasks[index]

    def score_answer(self, answer: str, task: dict[str, Any]) -> dict[str, float]:
        return {"em": float(answer == task["answer"])}

    def _parse(self, text: str) -> ParsedTurn:
        if self.turn >= self.task["turns"]:
            return ParsedTurn(text, answer=self.task["answer"])
        args = {"task": self.task["id"], "turn": self.turn}
        return ParsedTurn(text, calls=[ToolCall("work", args, raw=text)])


def make_tasks(n: int, seed: int, max_turns: int = 6) -> list[dict[str, Any]]:
    """``n`` tasks with 1..``max_turns`` turns each and a lognormal tool latency per turn."""
    rng = np.random.default_rng(seed)
    tasks = []
    for k in range(n):
        turns = int(rng.integers(1, max_turns + 1))
        lat = np.exp(rng.normal(math.log(LATENCY_MEDIAN_S), LATENCY_SIGMA, size=turns)).round(4).tolist()
        tasks.append(
            {
                "id": f"t{k}",
                "question": f"Task {k}: do {turns} turn(s) of work.",
                "answer": f"done {k}",
                "turns": turns,
                "latency": lat,
            }
        )
    return tasks


__all__ = ["ScriptedToolEnv", "WorkTool", "make_tasks"]
