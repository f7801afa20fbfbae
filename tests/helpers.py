"""Helpers for tests that run child processes: every wait on a child has a deadline of its own, and
what a failed test leaves running is killed (the suite must never hang, nor leave CPU hogs behind)."""

from __future__ import annotations

import importlib.util
import os
import signal
import threading
from pathlib import Path
from types import ModuleType
from typing import IO, Iterable


class LineReader:
    """Reads a child's text stdout on a daemon thread, so that no wait on it blocks past a deadline
    (a process left behind holding the pipe must fail the test, not hang it).

    ``lines`` holds every line read so far; ``eof`` is set once the pipe closed (every holder
    exited); ``ready`` once a line starts with ``ready_prefix``; ``next_line`` is ``readline``
    with a timeout."""

    def __init__(self, stream: IO[str], ready_prefix: str | None = None):
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.eof = threading.Event()
        self._prefix = ready_prefix
        self._taken = 0
        self._cond = threading.Condition()
        threading.Thread(target=self._run, args=(stream,), daemon=True).start()

    def _run(self, stream: IO[str]) -> None:
        try:
            for line in stream:
                with self._cond:
                    self.lines.append(line)
                    self._cond.notify_all()
                if self._prefix is not None and line.startswith(self._prefix):
                    self.ready.set()
        finally:
            with self._cond:
                self.eof.set()
                self._cond.notify_all()

    def next_line(self, timeout: float) -> str:
        """The next line not yet returned by this method; ``""`` once the stream ended (as
        ``readline``). Raises ``TimeoutError`` (with what was read) when none comes within ``timeout`` s."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.lines) > self._taken or self.eof.is_set(), timeout):
                raise TimeoutError(f"no line from the child within {timeout} s; read so far:\n" + self.text())
            if len(self.lines) > self._taken:
                self._taken += 1
                return self.lines[self._taken - 1]
            return ""

    def text(self, tail: int | None = 4000) -> str:
        """What was read so far: its last ``tail`` characters (for a failure message), or all of it
        with ``tail=None`` (for an assertion on what the child printed: a line printed early can be
        followed by many lines of its engines' shutdown logs)."""
        text = "".join(self.lines)
        return text if tail is None else text[-tail:]


def kill_all(pids: Iterable[int]) -> None:
    """SIGKILL each pid that still exists (one already gone, or not ours, is skipped)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


__all__ = ["LineReader", "kill_all"]


def load_script(name: str) -> ModuleType:
    """``scripts/<name>.py`` as a module (the set-up's helpers are scripts, not a package)."""
    return _load_file(Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py")


def _load_file(path: Path) -> ModuleType:
    name = path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def assert_implements(obj: object, protocol: type) -> None:
    """``obj`` has every method of ``protocol`` taking the protocol's parameters by the same names in
    the same order (extra trailing parameters allowed), which ``isinstance`` against a
    ``runtime_checkable`` protocol does not check (it looks only at the names of the methods)."""
    import inspect

    for name, member in vars(protocol).items():
        if name.startswith("_") or not callable(member):
            continue
        assert callable(getattr(obj, name, None)), f"{type(obj).__name__} has no method {name}"
        want = [p for p in inspect.signature(member).parameters if p != "self"]
        have = list(inspect.signature(getattr(obj, name)).parameters)
        assert have[: len(want)] == want, (
            f"{type(obj).__name__}.{name}{have} does not take {want} like {protocol.__name__}"
        )
