"""Hostile programs against the sandbox's containment (processes outliving a call, memory
beyond the bound, the caller's keyring, the reported end reasons).

Each class of attack runs through the public tool API (``gym.make("AgentR1/Math-v0")``'s python
tool, or ``PythonTool`` / ``run_python``, which the code envs use), in both isolation modes this
machine can give: ``cgroup`` (per-call cgroups, detected) and ``namespace`` (cgroups turned off
with ``AGENT_GYM_SANDBOX_CGROUP=none``: what a machine without cgroup delegation gets). After each
call nothing of it may be left: no process of a sandbox uid, no cgroup, nothing in the tmpfs's
mount point.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap
import time

import gymnasium as gym
import pytest

import agent_gym  # noqa: F401  (registers the AgentR1 envs)
from agent_gym import sandbox
from agent_gym.sandbox import (
    DENIED_SYSCALLS,
    PythonTool,
    SandboxLimits,
    call_memory_mb,
    cgroup_plan,
    issued_uids,
    run_python,
    sandbox_available,
    seccomp_filter,
)
from agent_gym.tools import run_tool

pytestmark = pytest.mark.skipif(
    not sandbox_available(),
    reason=(
        "the sandbox does not run here: install bubblewrap (apt-get install -y bubblewrap; make setup does), "
        "pyseccomp and libseccomp2, and allow user namespaces"
    ),
)

LIMITS = SandboxLimits(wall_s=3.0, cpu_s=2, memory_mb=128, max_procs=8)
X86_64 = platform.machine() == "x86_64"


@pytest.fixture(params=["cgroup", "namespace"])
def mode(request, monkeypatch):
    """Run the test with the cgroups this machine gives, and again without any."""
    if request.param == "namespace":
        monkeypatch.setenv(sandbox.CGROUP_ENV, "none")
    else:
        monkeypatch.delenv(sandbox.CGROUP_ENV, raising=False)
        if cgroup_plan("").mode != "cgroup":
            pytest.skip("no usable cgroup here (neither a writable v2 cgroup nor v1 memory/pids hierarchies)")
    yield request.param


def sandbox_pids(zombies: bool = True) -> list[int]:
    """Processes running as a uid of this process's sandboxes; ``zombies=False``: only live ones (a
    zombie holds no memory and runs nothing; bwrap's pid 1, once bwrap has exited, is left for the
    host's init to reap)."""
    mine, pids = issued_uids(), []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid not in mine:
                    continue
                with open(f"/proc/{name}/stat") as fh:
                    state = fh.read().rpartition(")")[2].split()[0]
            except (OSError, IndexError):
                continue
            if zombies or state not in ("Z", "X"):
                pids.append(int(name))
    return pids


def own_cgroups() -> list[str]:
    plan, found = cgroup_plan(""), []
    for where in {plan.kill, *(w[1] for w in (plan.memory, plan.pids) if w)} - {None}:
        found += [n for n in os.listdir(where) if n.startswith(f"agent_gym-{os.getpid()}-")]
    return found


def assert_nothing_left() -> None:
    """Checked at once, no waiting: the call must have ended everything before returning."""
    left = sandbox_pids(zombies=False)
    for pid in left:  # do not let a failure leak into the next tests
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    assert left == [], f"processes of the sandbox outlived the call: {left}"
    end = time.monotonic() + 10
    while sandbox_pids() and time.monotonic() < end:  # zombies: reaped by the host's init
        time.sleep(0.01)
    assert sandbox_pids() == []
    assert own_cgroups() == []
    assert os.listdir(sandbox._mount_point()) == []


# The pid-1 reaper's code is rewritten through /proc/1/mem (open to the program: same uid, no
# Yama) so that, once the program's first process ends, the reaper clears its parent-death signal
# and pauses for ever: bwrap is never told that the program ended, and killing bwrap no longer
# kills the reaper. A child left sleeping must still die with the call.
REAPER_HIJACK = textwrap.dedent("""\
    import os, time
    pc = int(open('/proc/1/syscall').read().split()[-1], 16)
    # prctl(PR_SET_PDEATHSIG, 0); for (;;) pause();
    code = bytes.fromhex('b89d000000' 'bf01000000' '31f6' '0f05' 'b822000000' '0f05' 'ebf7')
    with open('/proc/1/mem', 'r+b', buffering=0) as m:
        m.seek(pc)
        m.write(code)
    if os.fork() == 0:
        os.setsid()
        time.sleep(120)
        os._exit(0)
    print('hijacked', flush=True)
    """)

PTRACE_REAPER = textwrap.dedent("""\
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    out = {}
    for name, call in (('ptrace_attach', lambda: libc.ptrace(16, 1, 0, 0)),
                       ('ptrace_seize', lambda: libc.ptrace(0x4206, 1, 0, 0)),
                       ('process_vm_readv', lambda: libc.process_vm_readv(1, None, 0, None, 0, 0))):
        r = call()
        out[name] = 'ok' if r >= 0 else os.strerror(ctypes.get_errno())
    print(out)
    """)


@pytest.mark.timeout(60)
@pytest.mark.skipif(not X86_64, reason="the reaper hijack's machine code is x86-64")
def test_hijacked_reaper_does_not_let_anything_outlive_the_call(mode):
    env = gym.make("AgentR1/Math-v0", sandbox={"wall_s": 2, "cpu_s": 2}).unwrapped
    try:
        env.reset(seed=0)
        call = "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": REAPER_HIJACK}}) + "</tool_call>"
        *_, info = env.step(env.encode_turn(call))
        (c,) = info["tool_calls"]
        text = env.transcript[-1][1]
        assert "hijacked" in text, text  # the attack ran (its write to the reaper's memory worked)
        assert c["status"] == "tool_error" and "wall-clock limit" in text, text
        assert_nothing_left()
    finally:
        env.close()


@pytest.mark.timeout(60)
def test_ptrace_and_process_vm_on_the_reaper_are_denied(mode):
    r = run_python(PTRACE_REAPER, LIMITS)
    assert r.ok, r
    assert eval(r.stdout) == {
        "ptrace_attach": "Operation not permitted",
        "ptrace_seize": "Operation not permitted",
        "process_vm_readv": "Operation not permitted",
    }
    assert_nothing_left()


# Each grandchild says it is running (a byte down a pipe) and the first process waits for all three
# and reaps the middle ones before it goes on: all three daemons exist however slow the machine is.
DAEMONS = textwrap.dedent("""\
    import os, signal
    r, w = os.pipe()
    for _ in range(3):
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:  # a grandchild in its own session: orphaned at once
                for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
                    signal.signal(s, signal.SIG_IGN)
                os.write(w, b'x')
                while True:
                    pass
            os._exit(0)
        os.wait()
    os.close(w)
    got = b''
    while len(got) < 3:
        got += os.read(r, 3)
    print('bye')
    """)


@pytest.mark.timeout(60)
def test_orphaned_daemons_that_ignore_signals_end_with_the_call(mode):
    limits = SandboxLimits(wall_s=5, cpu_s=2, max_procs=16)
    status, result = run_tool(PythonTool(limits), {"code": DAEMONS})
    assert (status, result.content.strip()) == ("ok", "bye")
    assert_nothing_left()
    r = run_python(DAEMONS, limits)
    # the program exited by itself: the kernel is tearing the namespace down while the parent
    # counts, so the count is a lower bound (docs/sandbox.md); nothing is left either way
    assert r.reason == "exit" and (r.leftovers in (0, 1, 2, 3) if mode == "cgroup" else r.leftovers is None), r
    assert_nothing_left()
    # a limit ends the call while the program and its three daemons run: counted before any kill
    r = run_python(
        DAEMONS.replace("print('bye')", "print('bye', flush=True)\nwhile True:\n    pass"),
        SandboxLimits(wall_s=2, cpu_s=30, max_procs=16),
    )
    assert r.reason == "wall" and r.stdout == "bye\n", r
    assert r.leftovers == (4 if mode == "cgroup" else None), r
    assert_nothing_left()


SYSV_SHM = textwrap.dedent("""\
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    got = 0
    for _ in range(8):  # 8 x 32 MiB segments, each attached, filled and detached: kept, unmapped
        sid = libc.shmget(0, 32 << 20, 0o1600)
        if sid < 0:
            print('shmget:', os.strerror(ctypes.get_errno()))
            break
        addr = libc.shmat(sid, None, 0)
        ctypes.memset(addr, 1, 32 << 20)
        libc.shmdt(ctypes.c_void_p(addr))
        got += 32
    print('held MiB', got)
    """)
MEMFD = textwrap.dedent("""\
    import os
    fds = []
    try:
        for _ in range(20):
            fd = os.memfd_create('x')
            os.write(fd, b'x' * (16 << 20))
            fds.append(fd)
    except OSError as e:
        print('memfd:', e.strerror)
    print('held MiB', 16 * len(fds))
    """)
POSIX_SHM_AND_FILES = textwrap.dedent("""\
    import os
    held = 0
    for d in ('/dev/shm', '/tmp'):
        try:
            for i in range(200):
                with open(f'{d}/f{i}', 'wb') as f:
                    f.write(b'x' * (4 << 20))
                held += 4
        except OSError as e:
            print(d, e.strerror)
    print('held MiB', held)
    """)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("program", ["sysv_shm", "memfd", "posix_shm_and_files"])
def test_memory_outside_the_address_space_is_bounded(mode, program):
    code = {"sysv_shm": SYSV_SHM, "memfd": MEMFD, "posix_shm_and_files": POSIX_SHM_AND_FILES}[program]
    r = run_python(code, LIMITS)
    held = int(r.stdout.rsplit("held MiB", 1)[1]) if "held MiB" in r.stdout else 0
    # the whole private tmpfs (/tmp and /dev/shm together) is tmpfs_mb; nothing else is allowed
    assert held <= LIMITS.tmpfs_mb, r
    if program == "sysv_shm":
        assert "shmget: Operation not permitted" in r.stdout, r
    elif program == "memfd":
        assert "memfd: Operation not permitted" in r.stdout, r
    else:
        assert "No space left on device" in r.stdout, r
    if mode == "cgroup" and cgroup_plan("").memory:
        assert r.memory_peak_mb is not None and r.memory_peak_mb <= call_memory_mb(LIMITS), r
    assert_nothing_left()


MANY_PROCESSES = textwrap.dedent("""\
    import os, time
    for _ in range(5):
        if os.fork() == 0:
            b = bytearray(100 << 20)  # 100 MiB each, under the 128 MiB address-space limit
            for i in range(0, len(b), 4096):
                b[i] = 1
            time.sleep(1)  # all five alive at once
            os._exit(0)
    killed = [os.wait()[1] for _ in range(5)]
    raise SystemExit(f'children ended by {killed}' if any(killed) else 0)
    """)


@pytest.mark.timeout(60)
def test_memory_of_all_processes_together_is_held_to_the_call_limit(mode):
    """Each process keeps under RLIMIT_AS; together (500 MiB) they pass the call's memory cgroup
    limit (224 MiB here): the kernel's OOM killer ends them and the reason says memory."""
    if mode != "cgroup" or not cgroup_plan("").memory:
        pytest.skip("no memory cgroup: the bound is RLIMIT_AS per process (docs/sandbox.md)")
    r = run_python(MANY_PROCESSES, SandboxLimits(wall_s=20, cpu_s=5, memory_mb=128, max_procs=8))
    assert r.reason == "memory" and "memory limit of 224 MiB" in r.detail, r
    assert r.memory_peak_mb <= call_memory_mb(LIMITS)
    assert_nothing_left()


INODE_FLOOD = textwrap.dedent("""\
    import os
    n = 0
    try:
        while True:
            os.mkdir(f'/tmp/d{n}')
            n += 1
    except OSError as e:
        print(n, e.strerror)
    m = 0
    try:
        while True:
            open(f'/dev/shm/f{m}', 'w').close()
            m += 1
    except OSError as e:
        print(m, e.strerror)
    """)


@pytest.mark.timeout(60)
def test_inode_flood_in_the_private_tmpfs_is_bounded(mode):
    r = run_python(INODE_FLOOD, SandboxLimits(wall_s=20, cpu_s=10, max_inodes=2000))
    lines = r.stdout.split("\n")
    n, why = lines[0].split(" ", 1)
    assert why == "No space left on device" and 1900 < int(n) < 2000, r  # /tmp and /dev/shm share 2,000
    assert lines[1] == "0 No space left on device", r
    assert_nothing_left()


KEYRING_HELPER = textwrap.dedent("""\
    import ctypes, json, sys
    from agent_gym.sandbox import run_python
    libc = ctypes.CDLL(None, use_errno=True)
    KEYCTL = 250  # x86-64
    assert libc.syscall(KEYCTL, 1, b"agent-gym-test-session") > 0  # join a new named session keyring
    assert libc.syscall(248, b"user", b"agent_gym_secret", b"s3cret-7f3a", 11, -3) > 0  # add_key into @s
    program = sys.stdin.read()
    first = run_python(program, {"wall_s": 5})
    second = run_python(program, {"wall_s": 5})
    planted = libc.syscall(KEYCTL, 10, -3, b"user", b"planted_by_sandbox", 0)  # KEYCTL_SEARCH in @s
    print(json.dumps({"first": first.stdout, "second": second.stdout, "planted_seen_by_caller": planted > 0}))
    """)
KEYRING_ATTACK = textwrap.dedent("""\
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    out = {}
    kid = libc.syscall(250, 10, -3, b"user", b"agent_gym_secret", 0)  # KEYCTL_SEARCH in @s
    if kid > 0:
        buf = ctypes.create_string_buffer(256)
        n = libc.syscall(250, 11, kid, buf, 256)  # KEYCTL_READ
        out["secret"] = buf.raw[:max(n, 0)].decode()
    else:
        out["search"] = os.strerror(ctypes.get_errno())
    seen = libc.syscall(250, 10, -3, b"user", b"planted_by_sandbox", 0)
    out["planted_seen"] = seen > 0
    r = libc.syscall(248, b"user", b"planted_by_sandbox", b"x", 1, -3)  # add_key into @s
    out["plant"] = "ok" if r > 0 else os.strerror(ctypes.get_errno())
    print(out)
    """)


@pytest.mark.timeout(60)
@pytest.mark.skipif(not X86_64, reason="the keyctl syscall numbers used are x86-64's")
def test_callers_session_keyring_is_out_of_reach(mode):
    """The caller runs inside a session keyring holding a secret (as pam logins and container
    runtimes set up): the program can neither read it nor plant a key that a later call or the
    caller would see."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p = subprocess.run(
        [sys.executable, "-c", KEYRING_HELPER],
        input=KEYRING_ATTACK,
        capture_output=True,
        text=True,
        timeout=50,
        cwd=root,
    )
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout.strip().splitlines()[-1])
    first, second = eval(got["first"]), eval(got["second"])
    assert "secret" not in first and first["search"] == "Operation not permitted", first
    assert first["plant"] == "Operation not permitted" and not second["planted_seen"], second
    assert not got["planted_seen_by_caller"]
    assert_nothing_left()


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "name,code,reason,needle",
    [
        ("self_sigkill", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", "signal", "no limit was reached"),
        (
            "child_kills_parent",
            "import os, signal, time\nif os.fork() == 0:\n    os.kill(os.getppid(), 9)\n"
            "    os._exit(0)\ntime.sleep(10)",
            "signal",
            "no limit was reached",
        ),
        ("self_sigterm", "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)", "signal", "killed by SIGTERM"),
        ("cpu", "while True:\n    pass", "cpu", "CPU time limit of 1 s"),
        (
            "cpu_sigxcpu_ignored",
            "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass",
            "cpu",
            "CPU time limit of 1 s (killed by SIGKILL)",
        ),
        ("wall", "import time\ntime.sleep(60)", "wall", "wall-clock limit of 3 s"),
        ("output", "while True:\n    print('x' * 1000)", "output", "output limit"),
        ("exit", "raise SystemExit(4)", "exit", "exit code 4"),
        ("ok", "print(1)", "exit", ""),
    ],
)
def test_each_end_has_its_real_reason(mode, name, code, reason, needle):
    r = run_python(code, SandboxLimits(wall_s=3 if name == "wall" else 20, cpu_s=1))
    assert r.reason == reason and needle in r.detail, r
    if reason != "cpu":
        assert "CPU" not in r.detail, r
    assert r.isolation == mode
    assert_nothing_left()


def test_the_filter_denies_what_the_docs_list():
    bpf, unknown = seccomp_filter()
    assert len(bpf) % 8 == 0 and len(bpf) > 8 * len(DENIED_SYSCALLS)  # one BPF instruction is 8 bytes
    assert set(unknown) <= {"memfd_secret"}, unknown  # newer than some libseccomp 2.5 releases
    doc = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "sandbox.md")).read()
    missing = [n for n in DENIED_SYSCALLS if f"`{n}`" not in doc]
    assert missing == [], f"docs/sandbox.md does not list {missing}"
    r = run_python(
        textwrap.dedent("""\
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        res = {}
        for name, nr, args in (('unshare_user', 272, (0x10000000,)), ('clone_newuser', 56, (0x10000000 | 17, 0, 0, 0, 0)),
                               ('personality_norandom', 135, (0x0040000,)), ('personality_high_bits', 135, (0x100040000,)),
                               ('bpf', 321, (0, 0, 0)), ('perf_event_open', 298, (0, 0, -1, -1, 0)),
                               ('userfaultfd', 323, (0,)), ('io_uring_setup', 425, (1, 0)), ('mount', 165, (0, 0, 0, 0, 0)),
                               ('keyctl', 250, (0, -3, 0))):
            r = libc.syscall(nr, *[ctypes.c_ulong(a & (2**64 - 1)) for a in args])
            res[name] = os.strerror(ctypes.get_errno()) if r < 0 else 'ok'
        res['personality_linux'] = libc.syscall(135, ctypes.c_ulong(0))
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        res['fork'] = os.waitpid(pid, 0)[1]
        print(res)
        """),
        LIMITS,
    )
    assert r.ok, r
    res = eval(r.stdout)
    assert res.pop("personality_linux") == 0 and res.pop("fork") == 0
    assert res == {k: "Operation not permitted" for k in res}, res


# -- soak: many hostile calls in a row ------------------------------------------------------------

LEAVE_DAEMON_WITH_SHM = textwrap.dedent("""\
    import os, time
    open('/dev/shm/held', 'wb').write(b'x' * (8 << 20))
    if os.fork() == 0:
        os.setsid()
        time.sleep(600)
        os._exit(0)
    print('left a daemon')
    """)
SOAK_PROGRAMS = {  # name -> (program, the reasons it may end with)
    "leave_daemon_with_shm": (LEAVE_DAEMON_WITH_SHM, {"exit"}),
    "sysv_shm": (SYSV_SHM, {"exit"}),
    "memfd": (MEMFD, {"exit"}),
    "fill_tmpfs": (POSIX_SHM_AND_FILES, {"exit"}),
    "inode_flood": (INODE_FLOOD, {"exit"}),
    "self_sigkill": ("import os\nopen('/tmp/x', 'wb').write(b'x' * (4 << 20))\nos.kill(os.getpid(), 9)", {"signal"}),
    "many_processes": (MANY_PROCESSES.replace("time.sleep(1)", "pass"), {"exit", "memory"}),
}
SOAK_LIMITS = SandboxLimits(wall_s=15, cpu_s=5, memory_mb=128, max_procs=8, tmpfs_mb=16, max_inodes=500)


def host_state() -> dict:
    """What a leak would raise: shared memory and tmpfs pages of the host (``Shmem``), processes of
    the sandboxes' uids, files of theirs in the host's temporary directory, this process's cgroups
    and descriptors, and entries under the tmpfs mount point."""
    with open("/proc/meminfo") as fh:
        mem = {k: int(v.split()[0]) // 1024 for k, v in (line.split(":", 1) for line in fh)}
    tmp, mine = os.environ.get("TMPDIR", "/tmp"), issued_uids()
    files = []
    for name in os.listdir(tmp):
        try:
            files += [name] if os.lstat(os.path.join(tmp, name)).st_uid in mine else []
        except OSError:
            pass
    return {
        "shmem_mb": mem["Shmem"],
        "slab_unreclaimable_mb": mem["SUnreclaim"],
        "mem_available_mb": mem["MemAvailable"],
        "processes": sandbox_pids(zombies=False),
        "files": files,
        "cgroups": own_cgroups(),
        "fds": len(os.listdir("/proc/self/fd")),
        "mount_point": os.listdir(sandbox._mount_point()),
    }


def soak(n_calls: int, hijack_every: int = 50) -> tuple[dict, dict, dict[str, int]]:
    """``n_calls`` hostile calls in a row (every ``hijack_every``-th one the reaper hijack, with a
    1 s wall limit): (host state before, after, how many calls ended for each reason)."""
    names = sorted(SOAK_PROGRAMS)
    before = host_state()
    reasons: dict[str, int] = {}
    for i in range(n_calls):
        if X86_64 and hijack_every and i % hijack_every == hijack_every - 1:
            r, allowed = run_python(REAPER_HIJACK, SandboxLimits(wall_s=1, cpu_s=2)), {"wall"}
        else:
            code, allowed = SOAK_PROGRAMS[names[i % len(names)]]
            r = run_python(code, SOAK_LIMITS)
        assert r.reason in allowed, (i, r)
        reasons[r.reason] = reasons.get(r.reason, 0) + 1
    end = time.monotonic() + 10
    while sandbox_pids() and time.monotonic() < end:  # zombies left to the host's init
        time.sleep(0.01)
    return before, host_state(), reasons


@pytest.mark.timeout(300)
def test_soak_of_hostile_calls_leaves_the_host_as_it_was():
    """120 hostile calls (benchmarks/perf/sandbox_cost.py --soak 1000 runs 1,000): each
    would leave at least 8 MiB of shared memory and a process behind if its call leaked."""
    before, after, reasons = soak(120, hijack_every=40)
    print("soak of 120:", before, after, reasons)
    assert after["processes"] == [] and after["files"] == [] and after["cgroups"] == []
    assert after["mount_point"] == [] and after["fds"] == before["fds"]
    # one leaked call in seven would hold 8 x 120 / 7 = 137 MiB; other jobs on the machine move it a little
    assert after["shmem_mb"] - before["shmem_mb"] < 64, (before, after)


def test_cgroups_left_by_a_dead_process_are_removed_at_detection():
    plan = cgroup_plan("")
    if plan.mode != "cgroup":
        pytest.skip("no usable cgroup here")
    parent = plan.kill or (plan.memory or plan.pids)[1]
    dead = 2**22 + 1  # above the largest pid_max (2**22): never a live process
    stale = os.path.join(parent, f"agent_gym-{dead}-0")
    os.mkdir(stale)
    try:
        sandbox._cgroup_plan.cache_clear()
        assert cgroup_plan("") == plan
        assert not os.path.exists(stale)
    finally:
        if os.path.exists(stale):
            os.rmdir(stale)
