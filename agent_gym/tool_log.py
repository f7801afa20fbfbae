"""Tool record and replay: every tool call of a rollout written to JSONL, and served back from it.

``ToolEnv(tool_record="calls.jsonl")`` appends one line per call that reached its tool::

    {"task_id": "7", "seed": 1234, "call": 0, "turn": 1, "name": "search",
     "arguments": {"query": "..."}, "status": "ok", "content": "Doc 1 ...", "ok": true, "metadata": {...}}

``ToolEnv(tool_replay="calls.jsonl")`` runs no tool: each call is looked up by its key
``(task_id, seed, call)`` (the episode's task, its reset seed, the call's ordinal in the episode)
and the recorded status and result are served, metadata included (so process rewards that read
it, such as the supporting-paragraph reward, pay the same). A call whose name or arguments differ
from the recording, or that the recording does not hold, raises :class:`ToolReplayMismatch`
naming the first such call, both versions and the line: replay serves exact re-runs (the same
policy, seeds and env settings), e.g. re-running an iteration without the retriever or the
sandbox, or timing the trainer on its own.

Calls that never reach a tool (a parse error, an unknown tool, invalid arguments, a spent budget)
are neither recorded nor replayed: the env answers them itself, the same way both times. Many
envs (threads of a vector env, Ray workers) may append to one file: each line is one
``os.write`` on a file opened with ``O_APPEND``. A step that raises and is retried may have
written its calls twice; the replay keeps the last line of a key. Metadata goes through JSON, so
a tool whose metadata is not JSON (sets, objects) gets a ``TypeError`` when recording.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from agent_gym.cli_errors import UserError
from agent_gym.tools import ToolResult

_LOADED: dict[tuple[str, int, int], dict[tuple[str, Any, int], tuple[int, dict[str, Any]]]] = {}
_LOCK = threading.Lock()


class ToolReplayMismatch(UserError, RuntimeError):
    """A replayed call that the recording does not hold, or holds with another name or arguments."""


def call_key(task_id: str, seed: int | None, call: int) -> tuple[str, Any, int]:
    return (str(task_id), seed, int(call))


class ToolRecorder:
    """Appends one JSON line per tool call to ``path`` (created with its folder)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(
        self,
        *,
        task_id: str,
        seed: int | None,
        call: int,
        turn: int,
        name: str,
        arguments: Any,
        status: str,
        result: ToolResult,
    ) -> None:
        line = (
            json.dumps(
                {
                    "task_id": str(task_id),
                    "seed": seed,
                    "call": int(call),
                    "turn": int(turn),
                    "name": name,
                    "arguments": arguments,
                    "status": status,
                    "content": result.content,
                    "ok": bool(result.ok),
                    "metadata": result.metadata,
                },
                ensure_ascii=False,
            )
            + "\n"
        )
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode("utf-8"))
        finally:
            os.close(fd)


class ToolReplay:
    """Serves the calls recorded in ``path`` (:class:`ToolRecorder`'s lines), by key."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(
                f"tool_replay: no recording at {str(self.path)!r}; record one first with the env "
                "kwarg tool_record: FILE (same policy, seeds and env settings)"
            )
        self.calls = _load(self.path)

    def serve(self, *, task_id: str, seed: int | None, call: int, name: str, arguments: Any) -> tuple[str, ToolResult]:
        key = call_key(task_id, seed, call)
        found = self.calls.get(key)
        now = f"{name}({json.dumps(arguments, sort_keys=True, ensure_ascii=False)})"
        where = f"call {call} of task {task_id!r} (reset seed {seed})"
        if found is None:
            raise ToolReplayMismatch(
                f"tool_replay: {where} is not in {self.path} (this run made {now}); replay serves "
                "exact re-runs only: the same policy, seeds and env settings as the recording"
            )
        line, rec = found
        if rec["name"] != name or rec["arguments"] != arguments:
            was = f"{rec['name']}({json.dumps(rec['arguments'], sort_keys=True, ensure_ascii=False)})"
            raise ToolReplayMismatch(
                f"tool_replay: {where} differs from {self.path} line {line}: recorded {was}, "
                f"this run made {now}; replay serves exact re-runs only (the same policy, seeds "
                "and env settings)"
            )
        return rec["status"], ToolResult(rec["content"], ok=bool(rec["ok"]), metadata=dict(rec.get("metadata") or {}))


def _load(path: Path) -> dict[tuple[str, Any, int], tuple[int, dict[str, Any]]]:
    """The recording's calls by key (the last line of a key wins), cached per file version: every
    env of a vector env shares one table."""
    st = path.stat()
    cache_key = (str(path.resolve()), st.st_mtime_ns, st.st_size)
    with _LOCK:
        if cache_key in _LOADED:
            return _LOADED[cache_key]
    calls: dict[tuple[str, Any, int], tuple[int, dict[str, Any]]] = {}
    with open(path, encoding="utf-8") as f:
        for i, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw)
                key = call_key(rec["task_id"], rec["seed"], rec["call"])
                rec["name"], rec["arguments"], rec["status"], rec["content"], rec["ok"]
            except (ValueError, KeyError, TypeError) as e:
                raise ToolReplayMismatch(
                    f"tool_replay: {path} line {i} is not a recorded call ({type(e).__name__}: "
                    f"{e}); record the file with the env kwarg tool_record: FILE"
                ) from None
            calls[key] = (i, rec)
    with _LOCK:
        _LOADED[cache_key] = calls
    return calls
