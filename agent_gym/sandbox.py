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
- runs under a seccomp filter (``DENIED_SYSCALLS``; compiled with pyseccomp/libseccomp, loaded by
  bwrap's ``--seccomp`` in the program and in bwrap's pid-1 reaper): no ptrace, no other
  process's memory, no keyrings, no namespaces or mounts, no SysV IPC or memfd, ...;
- is set up in the child before ``bwrap`` starts: it joins the call's cgroups (memory and pids
  limits for the whole call, where ``cgroup_plan()`` finds them), drops to the call's uid, joins a
  new empty session keyring, mounts its private tmpfs (size and inode bound) in a user and mount
  namespace of its own, and sets hard rlimits: CPU seconds, address space, processes, file size,
  open files, no core dumps;
- is read with a wall-clock deadline and an output cap; at its end, however it ended, the whole
  call is ended: SIGKILL to its pid namespace's pid 1 through a pidfd (the kernel then ends every
  process of the namespace), then a check by the kernel's own lists (the pidfd of pid 1, the
  cgroup's ``cgroup.procs``) that nothing of it is left.
"""

from __future__ import annotations

import atexit
import collections
import ctypes
import dataclasses
import errno
import functools
import itertools
import json
import os
import random
import resource
import select
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from agent_gym.cli_errors import UserError
from agent_gym.tools import Tool, ToolResult

INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: `apt-get install -y bubblewrap`, which `make setup` "
    "does through scripts/setup_sandbox.sh) and allow unprivileged user namespaces "
    "(`sysctl -w kernel.unprivileged_userns_clone=1` where that setting exists, "
    "`user.max_user_namespaces` > 0)"
)

# As root, each call runs as a uid drawn from this range: no account owns these ids, and a
# per-call uid keeps RLIMIT_NPROC (counted per real uid) from mixing concurrent calls.
UID_RANGE = (1_500_000, 2_500_000)
STATUSES = ("ok", "error", "timeout", "output_limit")
_ISSUED_UIDS: collections.deque[int] = collections.deque(maxlen=4096)


def issued_uids() -> set[int]:
    """The uids this process ran its latest (up to 4,096) sandboxes as (root only): a process left
    running as one of them would be a leak of this process's sandboxes (the tests check)."""
    return set(_ISSUED_UIDS)


class SandboxUnavailable(UserError, RuntimeError):
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
    ``max_open_files``: ``RLIMIT_NOFILE``;
    ``max_inodes``: files and directories in the private tmpfs (its ``nr_inodes``), so a flood of
    empty files cannot pin kernel memory.

    With a memory cgroup (``cgroup_plan()``), the whole call (all its processes, shared memory,
    the tmpfs's pages and the kernel's memory for it) is also held to :func:`call_memory_mb`
    (``memory_mb + tmpfs_mb + 32``) MiB, and its processes to ``max_procs + 2`` (``pids.max``).
    """

    wall_s: float = 10.0
    cpu_s: int = 5
    memory_mb: int = 512
    max_procs: int = 32
    max_output_bytes: int = 65_536
    max_file_mb: int = 16
    tmpfs_mb: int = 64
    max_open_files: int = 64
    max_inodes: int = 10_000

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"sandbox limit {f.name} must be a positive number, got {v!r}")
            if f.name != "wall_s" and not float(v).is_integer():
                raise ValueError(f"sandbox limit {f.name} must be a whole number, got {v!r}")

    @classmethod
    def from_any(cls, value: SandboxLimits | dict | None) -> SandboxLimits:
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
    signal: an exception, ``MemoryError``, a segfault, ``os._exit(3)``, the memory cgroup's
    limit), ``timeout`` (the wall deadline, or the CPU limit), ``output_limit`` (more output than
    ``max_output_bytes``).

    ``reason``, why it ended: ``exit`` (the program exited, with ``exit_code``), ``signal`` (a
    signal that no limit sent: a crash, or the program killing itself), ``wall``, ``cpu``,
    ``memory`` (the kernel's OOM killer at the call's memory cgroup limit), ``output``;
    ``leftovers``: processes of the call still running when its end was seen, all killed (``None``
    without cgroups: then the pid namespace's teardown ends them uncounted). Exact when a limit
    ended the call (counted before anything is killed); when the program exited by itself, bwrap's
    reaper dies with bwrap and the kernel is already killing the rest while they are counted, so
    it is a lower bound (0 up to the true number on a loaded machine);
    ``memory_peak_mb``: the call's peak memory by the kernel's accounting (``None`` without a
    memory cgroup); ``isolation``: ``cgroup`` or ``namespace`` (see ``cgroup_plan()``)."""

    status: str
    exit_code: int | None
    stdout: str
    stderr: str
    wall_s: float
    detail: str = ""
    reason: str = ""
    leftovers: int | None = None
    memory_peak_mb: float | None = None
    isolation: str = ""

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


# --- the syscall filter -------------------------------------------------------------------------
# Denied (EPERM) for every process of the sandbox, bwrap's pid-1 reaper included (bwrap loads the
# filter there too). Everything else is allowed. Why each is denied: docs/sandbox.md.
DENIED_SYSCALLS: dict[str, str] = {
    # other processes: the pid-1 reaper runs with the program's uid and this kernel may have no Yama
    "ptrace": "tracing another process (the pid-1 reaper included)",
    "process_vm_readv": "reading another process's memory",
    "process_vm_writev": "writing another process's memory",
    "pidfd_getfd": "taking another process's file descriptors",
    "kcmp": "probing another process's kernel objects",
    # the caller's keyrings
    "keyctl": "kernel keyrings (the caller's session keyring)",
    "add_key": "planting a key in a keyring",
    "request_key": "looking up keys",
    # large kernel attack surface, no use to a Python program
    "perf_event_open": "performance counters (kernel attack surface, side channels)",
    "bpf": "eBPF programs",
    "userfaultfd": "user page-fault handling (a common kernel-exploit primitive)",
    "io_uring_setup": "io_uring (its operations bypass the syscall filter)",
    "io_uring_enter": "io_uring",
    "io_uring_register": "io_uring",
    "modify_ldt": "x86 segment tables (kernel attack surface)",
    "uselib": "legacy library loading",
    # mounts and namespaces: bwrap builds the sandbox's own before it loads the filter
    "mount": "mounting",
    "umount2": "unmounting (uncovering what bwrap mounted over)",
    "pivot_root": "changing the root",
    "chroot": "changing the root",
    "unshare": "new namespaces",
    "setns": "entering other namespaces",
    "open_tree": "new mount API",
    "move_mount": "new mount API",
    "fsopen": "new mount API",
    "fsconfig": "new mount API",
    "fsmount": "new mount API",
    "fspick": "new mount API",
    "mount_setattr": "new mount API",
    "name_to_handle_at": "file handles (escaping a bind mount)",
    "open_by_handle_at": "file handles (escaping a bind mount)",
    # the machine
    "kexec_load": "loading a new kernel",
    "kexec_file_load": "loading a new kernel",
    "reboot": "rebooting",
    "init_module": "kernel modules",
    "finit_module": "kernel modules",
    "delete_module": "kernel modules",
    "swapon": "swap",
    "swapoff": "swap",
    "acct": "process accounting",
    "quotactl": "disk quotas",
    "syslog": "the kernel log",
    "iopl": "I/O ports",
    "ioperm": "I/O ports",
    "settimeofday": "the clock",
    "clock_settime": "the clock",
    "clock_adjtime": "the clock",
    "adjtimex": "the clock",
    "vhangup": "terminals",
    # memory that RLIMIT_AS does not count (the bound where there is no memory cgroup)
    "memfd_create": "anonymous files: their pages lie outside RLIMIT_AS",
    "memfd_secret": "secret memory outside RLIMIT_AS",
    "shmget": "SysV shared memory: outside RLIMIT_AS",
    "shmat": "SysV shared memory",
    "shmctl": "SysV shared memory",
    "msgget": "SysV message queues (kernel memory)",
    "msgsnd": "SysV message queues",
    "msgrcv": "SysV message queues",
    "msgctl": "SysV message queues",
    "semget": "SysV semaphores (kernel memory)",
    "semop": "SysV semaphores",
    "semtimedop": "SysV semaphores",
    "semctl": "SysV semaphores",
    "mq_open": "POSIX message queues (kernel memory)",
    "mq_unlink": "POSIX message queues",
}
# clone() with any of these flags is denied (no new namespaces, a user namespace above all).
# clone3() passes its flags in memory a filter cannot read: it gets ENOSYS, and the C library falls
# back to clone(), which is checked. personality() is allowed only for PER_LINUX (0) and the query
# 0xffffffff: the other personas switch protections off (ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC).
CLONE_NEW_FLAGS = {
    "CLONE_NEWTIME": 0x80,
    "CLONE_NEWNS": 0x20000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}


@functools.lru_cache(maxsize=1)
def seccomp_filter() -> tuple[bytes, tuple[str, ...]]:
    """The compiled (BPF) syscall filter that bwrap loads (``--seccomp``), and the denied syscalls
    this libseccomp does not know (skipped: newer than the library). Built with ``pyseccomp``
    (libseccomp). A syscall of another ABI (i386 or x32 on x86-64) kills the process: libseccomp's
    action for a foreign architecture."""
    try:
        import pyseccomp as sc  # optional: pyseccomp (extra code)
    except (ImportError, OSError) as e:  # OSError: libseccomp.so.2 missing
        raise SandboxUnavailable(
            f"the sandbox's syscall filter needs pyseccomp and libseccomp ({e}); pip install pyseccomp "
            "(the project's `code` extra) and apt-get install -y libseccomp2"
        ) from e
    arch = sc.system_arch()
    f = sc.SyscallFilter(sc.ALLOW)
    unknown: list[str] = []

    def deny(name: str, *args: Any, err: int = errno.EPERM) -> None:
        if sc.resolve_syscall(arch, name) < 0:
            unknown.append(name)
        else:
            f.add_rule(sc.ERRNO(err), name, *args)

    for name in DENIED_SYSCALLS:
        deny(name)
    deny("clone3", err=errno.ENOSYS)
    for flag in CLONE_NEW_FLAGS.values():
        deny("clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    # The low 32 bits of personality's argument (the kernel ignores the rest) are neither all 0
    # nor all 1 exactly when some bit i is 1 and the next bit (i + 1) mod 32 is 0: one rule each.
    for i in range(32):
        bit, nxt = 1 << i, 1 << ((i + 1) % 32)
        deny("personality", sc.Arg(0, sc.MASKED_EQ, bit | nxt, bit))
    with tempfile.TemporaryFile() as fh:
        f.export_bpf(fh)
        fh.seek(0)
        return fh.read(), tuple(unknown)


# --- cgroups ----------------------------------------------------------------------------------
CGROUP_ENV = "AGENT_GYM_SANDBOX_CGROUP"  # "none": no cgroups; a path: a delegated cgroup v2 directory
_call_counter = itertools.count()


@dataclass(frozen=True)
class CgroupPlan:
    """Where each call's cgroups go: a parent directory per hierarchy (``None``: not usable).
    ``kill``: a cgroup v2 directory (``cgroup.kill``, ``cgroup.events``); ``memory`` and ``pids``:
    ``(version, parent)`` of the controller used."""

    kill: str | None = None
    memory: tuple[int, str] | None = None
    pids: tuple[int, str] | None = None

    @property
    def mode(self) -> str:
        return "cgroup" if (self.memory or self.pids or self.kill) else "namespace"


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fs type, super options) of the cgroup file systems."""
    out = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            left, _, right = line.partition(" - ")
            fstype, _, opts = (right.split() + ["", "", ""])[:3]
            if fstype in ("cgroup", "cgroup2"):
                out.append((left.split()[4], fstype, set(opts.split(","))))
    return out


def _try_dir(parent: str, files: tuple[str, ...]) -> bool:
    """Whether this process can make (and remove) a child cgroup of ``parent`` that has ``files``."""
    probe = os.path.join(parent, f"agent_gym-probe-{os.getpid()}")
    try:
        os.mkdir(probe)
    except OSError:
        return False
    try:
        return all(os.path.exists(os.path.join(probe, f)) for f in files)
    finally:
        try:
            os.rmdir(probe)
        except OSError:
            pass


def cgroup_plan(setting: str | None = None) -> CgroupPlan:
    """The cgroups each call gets here, detected once: cgroup v2 (``memory.max``, ``pids.max``,
    ``cgroup.kill``) where this process may make child cgroups, else cgroup v1 ``memory`` and
    ``pids`` hierarchies; ``setting`` (default: the ``AGENT_GYM_SANDBOX_CGROUP`` variable) ``none``
    turns them off, a path names a delegated cgroup v2 directory to use."""
    return _cgroup_plan(os.environ.get(CGROUP_ENV, "") if setting is None else setting)


@functools.lru_cache(maxsize=4)
def _cgroup_plan(setting: str) -> CgroupPlan:
    if setting.strip().lower() == "none":
        return CgroupPlan()
    own: dict[str, str] = {}
    with open("/proc/self/cgroup") as fh:
        for line in fh:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            for c in ctrls.split(",") if ctrls else [""]:
                own[c] = path
    kill = memory = pids = None
    v2 = [m for m, t, _ in _mounts() if t == "cgroup2"]
    if setting.strip():
        if not os.path.isfile(os.path.join(setting, "cgroup.procs")):
            raise SandboxUnavailable(
                f"{CGROUP_ENV}={setting!r} is not a cgroup v2 directory; "
                "set it to a delegated cgroup v2 directory, or to 'none'"
            )
        v2_parent: str | None = setting
    else:
        v2_parent = os.path.join(v2[0], own.get("", "/").lstrip("/")) if v2 and "" in own else None
    if v2_parent and _try_dir(v2_parent, ("cgroup.procs",)):
        kill = v2_parent if _try_dir(v2_parent, ("cgroup.kill",)) else None
        try:
            with open(os.path.join(v2_parent, "cgroup.subtree_control")) as fh:
                enabled = set(fh.read().split())
            if not {"memory", "pids"} <= enabled:  # only possible in an empty (or the root) cgroup
                with open(os.path.join(v2_parent, "cgroup.subtree_control"), "w") as fh:
                    fh.write(" ".join(f"+{c}" for c in ("memory", "pids") if c not in enabled))
                enabled |= {"memory", "pids"}
        except OSError:
            pass
        if "memory" in enabled and _try_dir(v2_parent, ("memory.max",)):
            memory = (2, v2_parent)
        if "pids" in enabled and _try_dir(v2_parent, ("pids.max",)):
            pids = (2, v2_parent)
    for mnt, fstype, opts in _mounts():
        if fstype != "cgroup":
            continue
        for ctrl, probe_file in (("memory", "memory.limit_in_bytes"), ("pids", "pids.max")):
            if ctrl in opts and ctrl in own and not (memory if ctrl == "memory" else pids):
                parent = os.path.join(mnt, own[ctrl].lstrip("/"))
                if _try_dir(parent, (probe_file,)):
                    if ctrl == "memory":
                        memory = (1, parent)
                    else:
                        pids = (1, parent)
    plan = CgroupPlan(kill, memory, pids)
    _remove_stale(plan)
    return plan


def _remove_stale(plan: CgroupPlan) -> None:
    """Remove call cgroups left by processes that died in the middle of a call (empty by then: the
    kernel ended their processes with their namespace)."""
    for parent in {plan.kill, *(w[1] for w in (plan.memory, plan.pids) if w)} - {None}:
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        for name in names:
            parts = name.split("-")
            if (
                len(parts) == 3
                and parts[0] == "agent_gym"
                and parts[1].isdigit()
                and parts[2].isdigit()
                and not os.path.exists(f"/proc/{parts[1]}")
            ):
                try:
                    os.rmdir(os.path.join(parent, name))
                except OSError:
                    pass


def call_memory_mb(limits: SandboxLimits) -> int:
    """The memory cgroup's limit for one call: ``memory_mb`` + ``tmpfs_mb`` + 32 MiB (the kernel
    memory of the call: bwrap, page tables, pipes, the tmpfs's inodes)."""
    return int(limits.memory_mb) + int(limits.tmpfs_mb) + 32


class _CallCgroups:
    """The cgroups of one call: made before it starts, each process joins them in the child before
    ``bwrap`` runs, so everything the call starts is in them; removed after it."""

    def __init__(self, plan: CgroupPlan, limits: SandboxLimits):
        self.plan, self.dirs, self.procs_files = plan, {}, []
        name = f"agent_gym-{os.getpid()}-{next(_call_counter)}"
        mem = call_memory_mb(limits) << 20
        wanted = {"kill": (2, plan.kill) if plan.kill else None, "memory": plan.memory, "pids": plan.pids}
        try:
            for role, where in wanted.items():
                if where is None:
                    continue
                d = os.path.join(where[1], name)
                if d not in self.dirs.values():
                    os.mkdir(d)
                    self.procs_files.append(os.path.join(d, "cgroup.procs"))
                self.dirs[role] = d
            if plan.memory:
                d = self.dirs["memory"]
                if plan.memory[0] == 2:
                    _write(d, "memory.max", mem)
                    _write(d, "memory.swap.max", 0, missing_ok=True)
                else:
                    _write(d, "memory.limit_in_bytes", mem)
                    _write(d, "memory.memsw.limit_in_bytes", mem, missing_ok=True)
            if plan.pids:
                # bwrap's two processes plus the program's; RLIMIT_NPROC bounds the program as well
                _write(self.dirs["pids"], "pids.max", int(limits.max_procs) + 2)
        except BaseException:
            self.remove()
            raise

    def join(self) -> None:
        """Move the calling process into the call's cgroups (the child, before it runs bwrap)."""
        pid = str(os.getpid()).encode()
        for path in self.procs_files:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, pid)
            finally:
                os.close(fd)

    def pids(self) -> set[int]:
        found: set[int] = set()
        for path in self.procs_files:
            try:
                with open(path) as fh:
                    found |= {int(x) for x in fh.read().split()}
            except OSError:
                pass
        return found

    def freeze_forks(self) -> None:
        """No new process in the call from now on (``pids.max`` 0)."""
        if self.plan.pids:
            _write(self.dirs["pids"], "pids.max", 0, missing_ok=True)

    def kill_all(self) -> None:
        if "kill" in self.dirs:
            _write(self.dirs["kill"], "cgroup.kill", 1, missing_ok=True)

    def oom_kills(self) -> int:
        if not self.plan.memory:
            return 0
        d = self.dirs["memory"]
        name = "memory.events" if self.plan.memory[0] == 2 else "memory.oom_control"
        try:
            with open(os.path.join(d, name)) as fh:
                for line in fh:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except OSError:
            pass
        return 0

    def memory_peak_mb(self) -> float | None:
        if not self.plan.memory:
            return None
        d = self.dirs["memory"]
        for name in ("memory.peak",) if self.plan.memory[0] == 2 else ("memory.max_usage_in_bytes",):
            try:
                with open(os.path.join(d, name)) as fh:
                    return int(fh.read()) / (1 << 20)
            except (OSError, ValueError):
                pass
        return None

    def remove(self) -> None:
        for d in dict.fromkeys(self.dirs.values()):
            for _ in range(200):
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:  # EBUSY: its last process is still being torn down
                    time.sleep(0.005)
        self.dirs = {}


def _write(d: str, name: str, value: int, missing_ok: bool = False) -> None:
    try:
        with open(os.path.join(d, name), "w") as fh:
            fh.write(str(value))
    except OSError:
        if not missing_ok:
            raise


# --- the child's set-up, between fork and exec of bwrap ----------------------------------------
_LIBC = None
_MOUNT_POINT: list[str] = []


def _libc() -> Any:
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC


def _mount_point() -> str:
    """An empty directory of the host (made once per process, mode 0711): each call's child mounts
    its private tmpfs on it inside its own mount namespace; the host only ever sees it empty. It is
    removed when the process that made it exits (a forked child that inherits the exit hook leaves
    it to its parent)."""
    if not _MOUNT_POINT or not os.path.isdir(_MOUNT_POINT[0]):
        d = tempfile.mkdtemp(prefix="agent_gym_sandbox_")
        os.chmod(d, 0o711)
        _MOUNT_POINT[:] = [d]
        atexit.register(_remove_mount_point, d, os.getpid())
    return _MOUNT_POINT[0]


def _remove_mount_point(path: str, owner: int) -> None:
    if os.getpid() != owner:
        return
    try:
        os.rmdir(path)  # empty by construction; never a recursive delete
    except OSError:
        pass


@functools.lru_cache(maxsize=1)
def _keyctl_nr() -> int:
    try:
        import pyseccomp as sc  # optional: pyseccomp (extra code)

        return sc.resolve_syscall(sc.system_arch(), "keyctl")
    except Exception:
        return -1


_CLONE_NEWNS, _CLONE_NEWUSER, _MS_NOSUID, _MS_NODEV = 0x20000, 0x10000000, 2, 4


def _child_setup(
    cgroups: _CallCgroups | None, uid: int | None, limits: SandboxLimits, nproc: int, mount_point: str, keyctl_nr: int
) -> None:
    """Runs in the child before it becomes bwrap: join the call's cgroups (still root), drop to the
    call's uid, leave the caller's session keyring for a new empty one, mount the call's tmpfs
    (size and inode count bounded) in a private user and mount namespace, and set the rlimits.
    Everything it uses is imported and loaded in the parent: nothing is imported between fork and
    exec."""
    libc = _libc()
    if cgroups is not None:
        cgroups.join()
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: a uid change cleared it; uid_map needs it
    if keyctl_nr >= 0:
        libc.syscall(keyctl_nr, 1, None)  # KEYCTL_JOIN_SESSION_KEYRING, anonymous: a new empty one
    me, grp = os.getuid(), os.getgid()
    if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(user, mount namespace) for the sandbox's tmpfs")
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {me} 1"), ("gid_map", f"0 {grp} 1")):
        with open(f"/proc/self/{name}", "w") as fh:
            fh.write(text)
    opts = f"size={int(limits.tmpfs_mb) << 20},nr_inodes={int(limits.max_inodes)},mode=0755"
    if libc.mount(b"tmpfs", mount_point.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, opts.encode()) != 0:
        raise OSError(ctypes.get_errno(), f"mount tmpfs on {mount_point}")
    for sub in ("tmp", "shm"):
        os.mkdir(os.path.join(mount_point, sub), 0o777)
    mb, cpu = 1 << 20, int(limits.cpu_s)
    for res, value in (
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_NPROC, (nproc, nproc)),
        (resource.RLIMIT_FSIZE, (int(limits.max_file_mb) * mb,) * 2),
        (resource.RLIMIT_NOFILE, (int(limits.max_open_files),) * 2),
        (resource.RLIMIT_CORE, (0, 0)),
        (resource.RLIMIT_MSGQUEUE, (0, 0)),
        (resource.RLIMIT_AS, (int(limits.memory_mb) * mb,) * 2),
    ):  # last: no allocation after
        resource.setrlimit(res, value)


def _bwrap_command(python: str, limits: SandboxLimits, seccomp_fd: int, info_fd: int, mount_point: str) -> list[str]:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable(f"bubblewrap (bwrap) is not installed; {INSTALL_HINT}")
    return [
        bwrap,
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--uid",
        "65534",
        "--gid",
        "65534",
        "--hostname",
        "sandbox",
        "--seccomp",
        str(seccomp_fd),
        "--info-fd",
        str(info_fd),
        *_root_binds(python),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--bind",
        os.path.join(mount_point, "shm"),
        "/dev/shm",
        "--remount-ro",
        "/dev",
        "--bind",
        os.path.join(mount_point, "tmp"),
        "/tmp",
        "--remount-ro",
        "/",
        "--chdir",
        "/tmp",
        "--clearenv",
        "--setenv",
        "PATH",
        "/usr/local/bin:/usr/bin:/bin",
        "--setenv",
        "HOME",
        "/tmp",
        "--setenv",
        "LANG",
        "C.UTF-8",
        "--setenv",
        "TMPDIR",
        "/tmp",
        # -I: isolated (no PYTHON* variables, no user site, no cwd on sys.path); -S: no site-packages
        # (the standard library only, whatever the system has installed; and a 20% faster start).
        "--",
        python,
        "-I",
        "-S",
        "-u",
        "-",
    ]


def _identity(limits: SandboxLimits) -> tuple[int | None, int]:
    """The uid to run one call as (``None``: the caller's) and its RLIMIT_NPROC value."""
    if os.geteuid() == 0:
        uid = random.SystemRandom().randrange(*UID_RANGE)
        _ISSUED_UIDS.append(uid)
        return uid, int(limits.max_procs)
    # Not root: the sandbox runs as the caller's uid, whose processes all count against
    # RLIMIT_NPROC, so the limit is the caller's current count plus max_procs.
    return None, _own_process_count() + int(limits.max_procs)


def _own_process_count() -> int:
    uid, n = os.getuid(), 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                n += os.stat(f"/proc/{name}").st_uid == uid
            except OSError:
                pass
    return n


def run_python(code: str, limits: SandboxLimits | dict | None = None, python: str | None = None) -> SandboxResult:
    """Run ``code`` (a Python 3 program, fed on stdin) in a fresh sandbox; never raises for what
    the program does. Raises :class:`SandboxUnavailable` when the sandbox itself cannot start."""
    if not isinstance(code, str):
        raise TypeError(f"code must be a str, got {type(code).__name__}")
    limits = SandboxLimits.from_any(limits)
    python = python or default_python()
    check_available(python)
    return _run(code, limits, python)


class _Namespace:
    """The call's pid namespace, held by a pidfd of its pid 1 (bwrap's reaper), opened from the
    pid bwrap reports on ``--info-fd`` and checked to be the init of the namespace bwrap made.
    SIGKILL to it from outside ends every process of the namespace (the kernel's teardown, which
    nothing inside can block), and the pidfd turns readable only once its pid 1 has exited, which
    the kernel lets happen only after every other process of the namespace is gone."""

    def __init__(self, info: dict):
        self.fd: int | None = None
        self.pid = int(info["child-pid"])
        try:
            fd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            return  # already gone: so is its namespace
        try:
            same = os.stat(f"/proc/{self.pid}/ns/pid").st_ino == int(info["pid-namespace"])
        except OSError:
            same = False
        if same:
            self.fd = fd
        else:  # the reaper exited and its pid was reused before the pidfd was opened
            os.close(fd)

    def children_cpu_s(self) -> float:
        """CPU seconds of the reaper's reaped children (the program, once it has ended)."""
        try:
            with open(f"/proc/{self.pid}/stat") as fh:
                fields = fh.read().rpartition(")")[2].split()
            return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return 0.0

    def kill(self) -> None:
        if self.fd is not None:
            try:
                signal.pidfd_send_signal(self.fd, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def wait_gone(self, timeout: float) -> bool:
        if self.fd is None:
            return True
        ready = select.select([self.fd], [], [], timeout)[0]
        if ready:
            os.close(self.fd)
            self.fd = None
        return bool(ready)


def _run(code: str, limits: SandboxLimits, python: str) -> SandboxResult:
    plan = cgroup_plan()
    bpf, _ = seccomp_filter()
    _libc()  # loaded here, not in the child
    uid, nproc = _identity(limits)
    mount_point = _mount_point()
    cgroups = _CallCgroups(plan, limits) if plan.mode == "cgroup" else None
    t0 = time.monotonic()
    deadline = t0 + float(limits.wall_s)
    sec_r, sec_w = os.pipe()
    os.write(sec_w, bpf)  # a few hundred bytes: fits the pipe
    os.close(sec_w)
    info_r, info_w = os.pipe()
    try:
        cmd = _bwrap_command(python, limits, sec_r, info_w, mount_point)
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={},
            cwd="/",
            start_new_session=True,
            pass_fds=(sec_r, info_w),
            preexec_fn=functools.partial(_child_setup, cgroups, uid, limits, nproc, mount_point, _keyctl_nr()),
        )
    except BaseException:
        os.close(info_r)
        if cgroups is not None:
            cgroups.remove()
        raise
    finally:
        os.close(sec_r)
        os.close(info_w)
    out = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    cap = int(limits.max_output_bytes)
    status, detail, reason = None, "", ""
    pending = memoryview(code.encode("utf-8", "surrogatepass"))
    info, ns, leftovers, cpu_s = bytearray(), None, None, 0.0
    bwrap_fd = os.pidfd_open(proc.pid)
    sel = selectors.DefaultSelector()

    def read_out(fd: int) -> bool:
        """Read a chunk; False at end of file or past the output cap."""
        nonlocal status, detail, reason
        chunk = os.read(fd, 65536)
        if not chunk:
            return False
        out[fd] += chunk
        if status is None and sum(len(b) for b in out.values()) > cap:
            status, detail, reason = "output_limit", f"output limit of {cap} bytes", "output"
            return False
        return True

    try:
        stdin_fd = proc.stdin.fileno()
        os.set_blocking(stdin_fd, False)
        sel.register(stdin_fd, selectors.EVENT_WRITE)
        for fd in (*out, info_r, bwrap_fd):
            sel.register(fd, selectors.EVENT_READ)
        ended = False
        while not ended and status is None:
            left = deadline - time.monotonic()
            if left <= 0:
                status, detail, reason = "timeout", f"wall-clock limit of {limits.wall_s:g} s", "wall"
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
                elif fd == info_r:
                    chunk = os.read(fd, 4096)
                    info += chunk
                    if ns is None:
                        try:
                            ns = _Namespace(json.loads(bytes(info)))
                        except ValueError:
                            pass  # not all of it yet
                    if not chunk:
                        sel.unregister(fd)
                elif fd == bwrap_fd:
                    ended = True  # bwrap exits when the program's first process has ended
                elif not read_out(fd):
                    sel.unregister(fd)
                if status is not None:
                    break
        # The end of the call: record what is left, then end all of it.
        if cgroups is not None:
            cgroups.freeze_forks()
            leftovers = len(cgroups.pids() - {proc.pid} - ({ns.pid} if ns else set()))
        if ns is not None and ended:
            cpu_s = ns.children_cpu_s()
        if ns is not None:
            ns.kill()
            ns.wait_gone(10.0)
        try:  # bwrap itself, once it has reaped the namespace's pid 1 (no zombie left to the host's init)
            proc.wait(0.5 if ns is not None else 0)
        except subprocess.TimeoutExpired:
            pass
        if cgroups is not None:
            cgroups.kill_all()  # whatever else is left (bwrap itself, if it has not exited)
        if proc.poll() is None:
            proc.kill()  # our own unreaped child: its pid cannot have been reused
        # Everything that could write to the pipes is dead: read what is left to the end.
        for fd in out:
            if fd in sel.get_map():
                while read_out(fd):
                    pass
    finally:
        sel.close()
        os.close(bwrap_fd)
        os.close(info_r)
        if status is not None or proc.poll() is None:
            try:
                proc.kill()
            except ProcessLookupError:
                pass
        proc.wait()
        for f in (proc.stdin, proc.stdout, proc.stderr):
            if not f.closed:
                f.close()
        gone = ns.wait_gone(10.0) if ns is not None else True
        left_in_cgroup: set[int] = set()
        if cgroups is not None:
            end = time.monotonic() + 10.0
            while (left_in_cgroup := cgroups.pids()) and time.monotonic() < end:
                time.sleep(0.002)
            oom = cgroups.oom_kills()
            peak = cgroups.memory_peak_mb()
            cgroups.remove()
        else:
            oom, peak = 0, None
    if not gone or left_in_cgroup:  # never seen; a kernel or set-up fault, not the program's doing
        raise RuntimeError(
            f"the sandbox's processes outlived the call (namespace gone: {gone}, cgroup: {sorted(left_in_cgroup)})"
        )
    code_ = proc.returncode
    if status is None:
        status, detail, reason = _exit_status(code_, limits, oom, cpu_s)
    stdout, stderr = (bytes(b).decode("utf-8", "replace") for b in out.values())
    if status == "output_limit":
        both = len(stdout) + len(stderr)
        if both > cap:  # keep the cap, stdout first
            stdout = stdout[:cap]
            stderr = stderr[: max(cap - len(stdout), 0)]
    return SandboxResult(
        status,
        code_ if status in ("ok", "error") else None,
        stdout,
        stderr,
        time.monotonic() - t0,
        detail,
        reason=reason,
        leftovers=leftovers,
        memory_peak_mb=peak,
        isolation=plan.mode,
    )


def _exit_status(code: int, limits: SandboxLimits, oom_kills: int = 0, cpu_s: float = 0.0) -> tuple[str, str, str]:
    """(status, detail, reason) from bwrap's exit code: the program's exit code, or 128 + the
    signal that ended it."""
    if oom_kills and code != 0:
        return (
            "error",
            f"memory limit of {call_memory_mb(limits)} MiB for the whole call "
            f"(the kernel ended {oom_kills} process(es) at it)",
            "memory",
        )
    if code == 0:
        return "ok", "", "exit"
    sig = code - 128 if code > 128 else None
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu_s >= int(limits.cpu_s)):
        return "timeout", f"CPU time limit of {limits.cpu_s} s (killed by {signal.Signals(sig).name})", "cpu"
    if sig is not None:
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        if sig == signal.SIGKILL:
            return (
                "error",
                "killed by SIGKILL (no limit was reached: the program or one of its processes sent it)",
                "signal",
            )
        return "error", f"killed by {name}", "signal"
    return "error", f"exit code {code}", "exit"


@functools.lru_cache(maxsize=8)
def _probe(python: str) -> str | None:
    """None when a trivial program runs in the sandbox, else why not (cached per interpreter)."""
    if not os.path.exists(python):
        return f"the sandbox interpreter {python!r} does not exist; pass python= an existing python3"
    try:
        r = _run("print('ready')", SandboxLimits(wall_s=60), python)
    except SandboxUnavailable as e:
        return str(e)
    except (OSError, subprocess.SubprocessError) as e:
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
    description = (
        "Run a Python 3 program in an isolated sandbox and get back what it prints. Each "
        "call starts fresh: no network, no files kept between calls, the standard library (no project packages). "
        "Use print() to see results."
    )
    parameters = {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "the complete Python 3 program"}},
        "required": ["code"],
        "additionalProperties": False,
    }

    def __init__(
        self, limits: SandboxLimits | dict | None = None, python: str | None = None, max_result_chars: int = 2000
    ):
        self.limits = SandboxLimits.from_any(limits)
        self.python = python
        if not isinstance(max_result_chars, int) or max_result_chars <= 0:
            raise ValueError(f"max_result_chars must be a positive integer, got {max_result_chars!r}")
        self.max_result_chars = max_result_chars

    def execute(self, code: str) -> ToolResult:
        r = run_python(code, self.limits, self.python)
        return ToolResult(
            format_result(r, self.max_result_chars),
            ok=r.ok,
            metadata={"status": r.status, "exit_code": r.exit_code, "wall_s": r.wall_s, "reason": r.reason},
        )


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


__all__ = [
    "CgroupPlan",
    "DENIED_SYSCALLS",
    "PythonTool",
    "SandboxLimits",
    "SandboxResult",
    "SandboxUnavailable",
    "call_memory_mb",
    "cgroup_plan",
    "check_available",
    "default_python",
    "format_result",
    "run_python",
    "sandbox_available",
    "seccomp_filter",
]
