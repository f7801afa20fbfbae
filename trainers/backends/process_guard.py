"""Leave no engine process behind: find every process an engine started, and end them.

vLLM runs its engine core in a child process, which starts the model workers as its own
children. vLLM's shutdown ends them, but not always: when the parent exits during or right after
start-up under CPU contention, a worker survived as an orphan (ppid 1) holding the parent's
stdout (which hung ``make test``). So ``VLLMBackend`` marks the processes it starts instead of trusting the tree:

- Before creating the engine it puts a fresh token in the environment variable ``ENV_VAR``.
  Every process started from then on (engine core, workers, however deep, whoever their parent
  is now) carries it in ``/proc/PID/environ``, which a process cannot lose by being re-parented.
- ``end_marked(token)`` ends every process carrying the token: SIGTERM, a grace period, then
  SIGKILL, until none is left. multiprocessing's resource tracker is spared: it is shared with
  the rest of the parent process and exits by itself once the processes holding its pipe are gone.
- ``start_watchdog(token)`` starts this file as a small process that waits on a pipe from the
  parent and runs ``end_marked(token)`` when the pipe closes without a "closed" line, that is when
  the parent died without closing the engine (SIGKILL, a crash, ``os._exit``). It ignores SIGINT,
  so the Ctrl-C that stops a terminal's foreground group does not stop it first.

Linux only (``/proc``); elsewhere the functions find nothing and vLLM's own shutdown is all there is.
No torch or vllm import here: the watchdog starts in milliseconds.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

ENV_VAR = "AGENT_GYM_ENGINE_TOKEN"
_SPARED = (b"multiprocessing.resource_tracker",)


@contextlib.contextmanager
def environ(env: dict[str, str]) -> Iterator[None]:
    """``env`` set in ``os.environ`` (so the processes started meanwhile inherit it), restored after."""
    previous = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in previous.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def marked_pids(token: str) -> set[int]:
    """Live processes (zombies excluded) whose environment holds ``ENV_VAR=token``, except this one."""
    needle = f"{ENV_VAR}={token}".encode() + b"\0"
    found = set()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    me = os.getpid()
    for entry in entries:
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read() + b"\0":
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if any(s in f.read() for s in _SPARED):
                    continue
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            if stat[stat.rindex(b")") + 2 :].split()[0] == b"Z":
                continue
        except (OSError, ValueError):
            continue  # gone, or not ours to read
        found.add(int(entry))
    return found


def alive(pid: int) -> bool:
    """The process exists and has not exited (a zombie, an exited child not reaped yet, counts as exited)."""
    stat = _stat(pid)
    return stat is not None and stat[0] not in (b"Z", b"X")


def exit_status(pid: int) -> int | None:
    """A zombie's exit status as ``os.waitpid`` reports it (``/proc/PID/stat`` field 52, Linux 3.5+),
    or None when the process runs, was reaped already, or the field is not readable."""
    stat = _stat(pid)
    if stat is None or stat[0] != b"Z" or len(stat) < 50:
        return None
    return int(stat[49])  # field 52; the list starts at field 3 (state)


def titled(token: str, prefix: bytes) -> dict[int, str]:
    """Processes marked with ``token`` whose title (``/proc/PID/cmdline``'s first word, which
    ``setproctitle`` sets, e.g. ``VLLM::Worker``) starts with ``prefix``: pid -> title."""
    found = {}
    for pid in marked_pids(token):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                title = f.read().split(b"\0", 1)[0]
        except OSError:
            continue
        if title.startswith(prefix):
            found[pid] = title.decode(errors="replace")
    return found


def _stat(pid: int) -> list[bytes] | None:
    """``/proc/PID/stat`` from field 3 (state) on, or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rindex(b")") + 2 :].split()


def end_marked(token: str, grace_s: float = 5.0, kill_s: float = 30.0) -> set[int]:
    """End every process marked with ``token``; returns those still alive (empty on success).

    Waits up to ``grace_s`` for them to exit by themselves (a shutdown in progress), sends SIGTERM
    to the rest and waits ``grace_s`` more, then SIGKILLs whatever is left for up to ``kill_s``.
    """
    deadline = time.monotonic() + grace_s
    while (pids := marked_pids(token)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, kill_s)):
        if not pids:
            return pids
        deadline = time.monotonic() + wait_s
        while pids and time.monotonic() < deadline:
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
            time.sleep(0.1)
            pids = marked_pids(token)
    return pids


class Watchdog:
    """The parent's end of a watchdog process (see the module docstring)."""

    def __init__(self, token: str):
        env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
        self.proc = subprocess.Popen(
            [sys.executable, "-S", os.path.abspath(__file__), token],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            close_fds=True,
        )

    def release(self) -> None:
        """The engine was closed normally: the watchdog exits without ending anything."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.write(b"closed\n")
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


def start_watchdog(token: str) -> Watchdog:
    return Watchdog(token)


def _watchdog_main(token: str) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    data = sys.stdin.buffer.read()  # until the parent closes the pipe or dies
    if b"closed" not in data:
        end_marked(token)
    return 0


if __name__ == "__main__":
    sys.exit(_watchdog_main(sys.argv[1]))
