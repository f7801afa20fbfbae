"""Run untrusted Python in a sandbox: bubblewrap namespaces plus resource limits.

:func:`run_python` runs one program in a fresh sandbox and returns a :class:`SandboxResult`;
:class:`PythonTool` is the agent-facing ``python`` tool built on it. What the sandbox does and
does not protect against is in ``docs/sandbox.md``. In short, each call:

- runs ``bwrap`` (bubblewrap, Debian package ``bubblewrap``; ``make setup`` installs it) with
  every namespace unshared (user, pid, network, ipc, uts, cgroup): no network at all, its own
  process tree, ``--die-with-parent``, ``--new-session``, nested user namespaces disabled;
- sees a filesystem built from nothing: ``/usr`` (and the interpreter's prefix if it lies
  elsewhere) bound read-only, ``/proc`` of its own pid namespace, a minimal ``/dev``, and a
  private size-capped tmpfs ``/tmp`` as its working directory; the root and ``/dev`` are
  remounted read-only. The project's files, ``/etc``, ``/home`` and ``/root`` are not there;
- starts with an empty environment (``--clearenv``, plus ``PATH``, ``HOME``, ``LANG``), so no
  secret of the parent's environment is inherited, and runs Python in isolated mode without
  site-packages (``-I -S``: the standard library only);
- runs as an unprivileged user: as root, a fresh uid drawn per call from a range no account
  uses (so process counts of concurrent calls never mix); otherwise the caller's own uid;
- has hard resource limits set in the child before ``bwrap`` starts (``prlimit``): CPU seconds,
  address space, processes (``RLIMIT_NPROC``), file size, open files, no core dumps;
- is read with a wall-clock deadline and an output cap: past either, the whole sandbox is
  killed (the outer ``bwrap`` gets ``SIGKILL``; its pid-1 reaper dies with it by
  ``--die-with-parent``, and with it every process of the pid namespace).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import os
import random
import selectors
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from agent_gym.tools import Tool, ToolResult

INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: `apt-get install -y bubblewrap`, which `make setup` "
                "does through scripts/setup_sandbox.sh) and allow unprivileged user namespaces "
                "(`sysctl -w kernel.unprivileged_userns_clone=1` where that setting exists, "
                "`user.max_user_namespaces` > 0)")

# As root, each call runs as a uid drawn from this range: no account owns these ids, and a
# per-call uid keeps RLIMIT_NPROC (counted per real uid) from mixing concurrent calls.
UID_RANGE = (1_500_000, 2_500_000)
STATUSES = ("ok", "error", "timeout", "output_limit")
_ISSUED_UIDS: "collections.deque[int]" = collections.deque(maxlen=4096)


def issued_uids() -> set[int]:
    """The uids this process ran its latest (up to 4,096) sandboxes as (root only): a process left
    running as one of them would be a leak of this process's sandboxes (the tests check)."""
    return set(_ISSUED_UIDS)


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot run on this machine (no bwrap, no user namespaces, no interpreter)."""


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sandboxed run. Every field must be positive.

    ``wall_s``: wall-clock seconds before the sandbox is killed (status ``timeout``);
    ``cpu_s``: CPU seconds per process (``RLIMIT_CPU``; SIGXCPU, then SIGKILL a second later);
    ``memory_mb``: address space per process (``RLIMIT_AS``; Python raises ``MemoryError``);
    ``max_procs``: processes and threads of the sandbox's uid (``RLIMIT_NPROC``);
    ``max_output_bytes``: stdout and stderr together; past it the sandbox is killed (status
    ``output_limit``) and the output kept so far is returned;
    ``max_file_mb``: the size of any one file written (``RLIMIT_FSIZE``);
    ``tmpfs_mb``: the whole private working directory ``/tmp`` (and ``/dev/shm``);
    ``max_open_files``: ``RLIMIT_NOFILE``.
    """

    wall_s: float = 10.0
    cpu_s: int = 5
    memory_mb: int = 512
    max_procs: int = 32
    max_output_bytes: int = 65_536
    max_file_mb: int = 16
    tmpfs_mb: int = 64
    max_open_files: int = 64

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"sandbox limit {f.name} must be a positive number, got {v!r}")
            if f.name != "wall_s" and not float(v).is_integer():
                raise ValueError(f"sandbox limit {f.name} must be a whole number, got {v!r}")

    @classmethod
    def from_any(cls, value: "SandboxLimits | dict | None") -> "SandboxLimits":
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise TypeError(f"sandbox limits must be a SandboxLimits or a dict, got {type(value).__name__}")
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(value) - set(names))
        if unknown:
            raise ValueError(f"unknown sandbox limit(s) {unknown}; valid: {names}")
        return cls(**value)


@dataclass
class SandboxResult:
    """What one run did. ``status``: ``ok`` (exit code 0), ``error`` (another exit code, or a
    signal: an exception, ``MemoryError``, a segfault, ``os._exit(3)``), ``timeout`` (the wall
    deadline, or the CPU limit), ``output_limit`` (more output than ``max_output_bytes``)."""

    status: str
    exit_code: int | None
    stdout: str
    stderr: str
    wall_s: float
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def default_python() -> str:
    """The interpreter run in the sandbox: Debian's ``/usr/bin/python3`` when present (everything it
    needs lies under ``/usr``), else the base interpreter of the running one (never a venv's,
    whose packages and paths belong to the project)."""
    if os.path.exists("/usr/bin/python3"):
        return "/usr/bin/python3"
    return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


def _root_binds(python: str) -> list[str]:
    """bwrap arguments for the read-only system part of the filesystem."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    real = os.path.realpath(python)
    if not real.startswith("/usr/"):  # e.g. a pyenv build: bind its prefix, read-only
        prefix = os.path.dirname(os.path.dirname(real))
        args += ["--ro-bind", prefix, prefix]
    return args


def _bwrap_command(python: str, limits: SandboxLimits, nproc: int) -> list[str]:
    bwrap, prlimit = shutil.which("bwrap"), shutil.which("prlimit")
    if bwrap is None:
        raise SandboxUnavailable(f"bubblewrap (bwrap) is not installed; {INSTALL_HINT}")
    if prlimit is None:
        raise SandboxUnavailable("prlimit (util-linux) is not installed; apt-get install -y util-linux")
    mb = 1 << 20
    cpu = int(limits.cpu_s)
    return [
        prlimit, f"--cpu={cpu}:{cpu + 1}", f"--as={int(limits.memory_mb) * mb}", f"--nproc={nproc}",
        f"--fsize={int(limits.max_file_mb) * mb}", f"--nofile={int(limits.max_open_files)}", "--core=0", "--",
        bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
        "--uid", "65534", "--gid", "65534", "--hostname", "sandbox",
        *_root_binds(python),
        "--proc", "/proc", "--dev", "/dev",
        "--size", str(8 * mb), "--tmpfs", "/dev/shm", "--remount-ro", "/dev",
        "--size", str(int(limits.tmpfs_mb) * mb), "--tmpfs", "/tmp",
        "--remount-ro", "/",
        "--chdir", "/tmp", "--clearenv",
        "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--setenv", "HOME", "/tmp",
        "--setenv", "LANG", "C.UTF-8", "--setenv", "TMPDIR", "/tmp",
        # -I: isolated (no PYTHON* variables, no user site, no cwd on sys.path); -S: no site-packages
        # (the standard library only, whatever the system has installed; and a 20% faster start).
        "--", python, "-I", "-S", "-u", "-",
    ]


def _identity(limits: SandboxLimits) -> tuple[dict[str, Any], int]:
    """Popen user arguments and the RLIMIT_NPROC value for one call."""
    if os.geteuid() == 0:
        uid = random.SystemRandom().randrange(*UID_RANGE)
        _ISSUED_UIDS.append(uid)
        return {"user": uid, "group": uid, "extra_groups": []}, int(limits.max_procs)
    # Not root: the sandbox runs as the caller's uid, whose processes all count against
    # RLIMIT_NPROC, so the limit is the caller's current count plus max_procs.
    return {}, _own_process_count() + int(limits.max_procs)


def _own_process_count() -> int:
    uid, n = os.getuid(), 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                n += os.stat(f"/proc/{name}").st_uid == uid
            except OSError:
                pass
    return n


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # bwrap leads its own session (start_new_session)
    except (ProcessLookupError, PermissionError):
        pass


def run_python(code: str, limits: SandboxLimits | dict | None = None, python: str | None = None) -> SandboxResult:
    """Run ``code`` (a Python 3 program, fed on stdin) in a fresh sandbox; never raises for what
    the program does. Raises :class:`SandboxUnavailable` when the sandbox itself cannot start."""
    if not isinstance(code, str):
        raise TypeError(f"code must be a str, got {type(code).__name__}")
    limits = SandboxLimits.from_any(limits)
    python = python or default_python()
    check_available(python)
    return _run(code, limits, python)


def _run(code: str, limits: SandboxLimits, python: str) -> SandboxResult:
    ident, nproc = _identity(limits)
    cmd = _bwrap_command(python, limits, nproc)
    t0 = time.monotonic()
    deadline = t0 + float(limits.wall_s)
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={}, cwd="/", start_new_session=True, **ident)
    out = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    cap = int(limits.max_output_bytes)
    status, detail = None, ""
    pending = memoryview(code.encode("utf-8", "surrogatepass"))
    sel = selectors.DefaultSelector()
    try:
        stdin_fd = proc.stdin.fileno()
        os.set_blocking(stdin_fd, False)
        sel.register(stdin_fd, selectors.EVENT_WRITE)
        for fd in out:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                status, detail = "timeout", f"wall-clock limit of {limits.wall_s:g} s"
                break
            for key, _ in sel.select(left):
                fd = key.fd
                if fd == stdin_fd:
                    try:
                        n = os.write(fd, pending[:65536])
                    except (BrokenPipeError, BlockingIOError) as e:
                        n = len(pending) if isinstance(e, BrokenPipeError) else 0
                    pending = pending[n:]
                    if not pending:
                        sel.unregister(fd)
                        proc.stdin.close()
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    sel.unregister(fd)
                    continue
                out[fd] += chunk
                if sum(len(b) for b in out.values()) > cap:
                    status, detail = "output_limit", f"output limit of {cap} bytes"
                    break
            if status:
                break
        if status is None:
            try:
                proc.wait(max(deadline - time.monotonic(), 0.001))
            except subprocess.TimeoutExpired:
                status, detail = "timeout", f"wall-clock limit of {limits.wall_s:g} s"
    finally:
        sel.close()
        if status is not None or proc.poll() is None:
            _kill(proc)
        proc.wait()
        for f in (proc.stdin, proc.stdout, proc.stderr):
            if not f.closed:
                f.close()
    code_ = proc.returncode
    if status is None:
        status, detail = _exit_status(code_, limits)
    stdout, stderr = (bytes(b).decode("utf-8", "replace") for b in out.values())
    if status == "output_limit":
        both = len(stdout) + len(stderr)
        if both > cap:  # keep the cap, stdout first
            stdout = stdout[:cap]
            stderr = stderr[:max(cap - len(stdout), 0)]
    return SandboxResult(status, code_ if status in ("ok", "error") else None, stdout, stderr,
                         time.monotonic() - t0, detail)


def _exit_status(code: int, limits: SandboxLimits) -> tuple[str, str]:
    if code == 0:
        return "ok", ""
    # bwrap exits with the program's exit code, or 128 + the signal that killed it.
    if code > 128 and code - 128 in (signal.SIGXCPU, signal.SIGKILL):
        return "timeout", f"CPU time limit of {limits.cpu_s} s (killed by {signal.Signals(code - 128).name})"
    if code > 128:
        try:
            name = signal.Signals(code - 128).name
        except ValueError:
            name = f"signal {code - 128}"
        return "error", f"killed by {name}"
    return "error", f"exit code {code}"


@functools.lru_cache(maxsize=8)
def _probe(python: str) -> str | None:
    """None when a trivial program runs in the sandbox, else why not (cached per interpreter)."""
    if not os.path.exists(python):
        return f"the sandbox interpreter {python!r} does not exist; pass python= an existing python3"
    try:
        r = _run("print('ready')", SandboxLimits(wall_s=60), python)
    except SandboxUnavailable as e:
        return str(e)
    except OSError as e:
        return f"could not start bwrap: {e}; {INSTALL_HINT}"
    if r.status != "ok" or r.stdout.strip() != "ready":
        why = (r.stderr.strip() or r.detail or r.status)[-500:]
        return f"bwrap could not run {python} in a sandbox ({why}); {INSTALL_HINT}"
    return None


def check_available(python: str | None = None) -> None:
    """Raise :class:`SandboxUnavailable` (saying how to fix it) unless the sandbox runs here."""
    why = _probe(python or default_python())
    if why is not None:
        raise SandboxUnavailable(why)


def sandbox_available(python: str | None = None) -> bool:
    try:
        check_available(python)
    except SandboxUnavailable:
        return False
    return True


class PythonTool(Tool):
    """The ``python`` tool: runs the agent's program in a fresh sandbox (:func:`run_python`) and
    returns its output. A program that fails (an exception, a non-zero exit, a signal, a limit)
    is a ``ToolResult(ok=False)``, so the call's status is ``tool_error``, with the output and
    the reason in the message. Nothing persists between calls. ``timeout`` is ``None``: the
    sandbox enforces its own wall-clock deadline and kills the program at it."""

    name = "python"
    description = ("Run a Python 3 program in an isolated sandbox and get back what it prints. Each "
                   "call starts fresh: no network, no files kept between calls, the standard library (no project packages). "
                   "Use print() to see results.")
    parameters = {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "the complete Python 3 program"}},
        "required": ["code"],
        "additionalProperties": False,
    }

    def __init__(self, limits: SandboxLimits | dict | None = None, python: str | None = None,
                 max_result_chars: int = 2000):
        self.limits = SandboxLimits.from_any(limits)
        self.python = python
        if not isinstance(max_result_chars, int) or max_result_chars <= 0:
            raise ValueError(f"max_result_chars must be a positive integer, got {max_result_chars!r}")
        self.max_result_chars = max_result_chars

    def execute(self, code: str) -> ToolResult:
        r = run_python(code, self.limits, self.python)
        return ToolResult(format_result(r, self.max_result_chars), ok=r.ok,
                          metadata={"status": r.status, "exit_code": r.exit_code, "wall_s": r.wall_s})


def format_result(r: SandboxResult, max_chars: int = 2000) -> str:
    """The text the agent sees: the output (its last ``max_chars`` characters per stream) and, on
    failure, why the program stopped."""
    text = _tail(r.stdout, max_chars)
    if r.stderr:
        text = _line(text) + "stderr:\n" + _tail(r.stderr, max_chars)
    if not r.ok:
        text = _line(text) + f"Error: the program stopped: {r.detail or r.status}."
    return text or "(no output)"


def _line(text: str) -> str:
    return text if not text or text.endswith("\n") else text + "\n"


def _tail(text: str, n: int) -> str:
    return text if len(text) <= n else f"[... {len(text) - n} characters cut]\n" + text[-n:]


__all__ = ["PythonTool", "SandboxLimits", "SandboxResult", "SandboxUnavailable", "check_available",
           "default_python", "format_result", "run_python", "sandbox_available"]
