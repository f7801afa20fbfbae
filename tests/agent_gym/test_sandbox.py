"""The sandbox (agent_gym.sandbox) and its hostile-code battery.

Every hostile program goes through a real ``ToolEnv`` step with the ``python`` tool: it must come
back as a ``tool_error`` call (or, where the program itself ends normally, ``ok``) with the
reason in the tool response, leave nothing behind (no process of a sandbox uid, no file outside
the sandbox, no child of this process), and the env's next call must still work.

The sandbox needs bubblewrap (``make setup`` installs it); without it these tests skip, naming
the fix. Limits are short (1 s CPU, 2 s wall, 128 MiB) to keep the battery cheap.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest

from agent_gym import ToolEnv
from agent_gym.sandbox import (
    PythonTool,
    SandboxLimits,
    SandboxUnavailable,
    check_available,
    format_result,
    issued_uids,
    run_python,
    sandbox_available,
)
from agent_gym.tools import run_tool

LIMITS = SandboxLimits(wall_s=2.0, cpu_s=1, memory_mb=128, max_procs=16, max_output_bytes=65_536)
SECRET = "agent-gym-fake-secret-7f3a9c"

pytestmark = pytest.mark.skipif(
    not sandbox_available(),
    reason=(
        "the sandbox does not run here: install bubblewrap (apt-get install -y bubblewrap; make setup does) "
        "and allow user namespaces"
    ),
)


class PyEnv(ToolEnv):
    """One question, one tool: the python tool under the battery's limits."""

    def __init__(self, **kw):
        super().__init__(tools=[PythonTool(LIMITS)], max_turns=50, max_context_tokens=60_000, **kw)

    def num_tasks(self):
        return 1

    def get_task(self, index):
        return {"id": "py", "question": "Run code.", "answer": "x"}

    def score_answer(self, answer, task):
        return {"em": float(answer == task["answer"])}


def call(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"


def sandbox_pids() -> list[int]:
    """Processes running as a uid of one of this process's sandboxes (the per-call uids used as root;
    other processes' sandboxes, e.g. a benchmark running beside the tests, have other uids)."""
    mine = issued_uids()
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                uid = os.stat(f"/proc/{name}").st_uid
            except OSError:
                continue
            if uid in mine:
                pids.append(int(name))
    return pids


def own_children() -> list[int]:
    """Children of this process (a bwrap or helper a call left behind), except the math checker's
    worker pool (agent_gym/math_answer.py), which lives as long as the process by design: an
    earlier Math-v0 test on the same xdist worker starts it, and it starts a spare in the
    background, so it must not count as left behind by a sandbox call."""
    import psutil

    out = []
    for c in psutil.Process().children(recursive=True):
        try:
            if "_agent_gym_math_worker" in " ".join(c.cmdline()):
                continue
        except psutil.Error:  # gone meanwhile
            continue
        out.append(c.pid)
    return out


def wait_clean(deadline_s: float = 5.0) -> tuple[list[int], list[int]]:
    """Sandbox processes and children of this process still there after up to ``deadline_s``
    (a killed pid namespace is torn down by the kernel shortly after its init dies)."""
    end = time.monotonic() + deadline_s
    while True:
        left = (sandbox_pids(), own_children())
        if not any(left) or time.monotonic() > end:
            return left
        time.sleep(0.05)


@pytest.fixture(scope="module")
def env():
    e = PyEnv()
    yield e
    e.close()


@pytest.fixture(scope="module")
def outside(tmp_path_factory):
    """A directory of the host that hostile code tries to write into."""
    return tmp_path_factory.mktemp("outside")


def step_code(env, code: str) -> tuple[str, str]:
    """Run ``code`` through one env step: (call status, tool response text)."""
    env.reset(seed=0)
    *_, info = env.step(env.encode_turn(call(code)))
    (c,) = info["tool_calls"]
    return c["status"], env.transcript[-1][1]


SPIN = "import threading\ndef spin():\n    while True:\n        pass\n"
# name -> (program, expected status, a check of the tool response)
BATTERY = {
    "infinite_loop": ("while True:\n    pass", "tool_error", "limit"),
    "sleep_forever": ("import time\ntime.sleep(3600)", "tool_error", "wall-clock limit"),
    "fork_bomb": ("import os\nwhile True:\n    os.fork()", "tool_error", ""),
    "memory_bomb": ("x = bytearray(10 ** 10)", "tool_error", "MemoryError"),
    "memory_bomb_growing": ("l = []\nwhile True:\n    l.append(bytearray(10 ** 6))", "tool_error", ""),
    "print_1gb": (
        "import sys\nb = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(b)",
        "tool_error",
        "output limit",
    ),
    "read_shadow": ("print(open('/etc/shadow').read())", "tool_error", "No such file"),
    "read_env_secret": (
        "import os, glob\n"
        f"found = [k for k, v in os.environ.items() if {SECRET!r} in v]\n"
        "for p in glob.glob('/proc/*/environ'):\n"
        "    try:\n"
        f"        found += [p] if {SECRET!r}.encode() in open(p, 'rb').read() else []\n"
        "    except OSError:\n"
        "        pass\n"
        "print(sorted(os.environ))\n"
        "raise SystemExit('secret found: ' + str(found) if found else 'no secret')",
        "tool_error",
        "no secret",
    ),
    "socket": (
        "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)",
        "tool_error",
        "Network is unreachable",
    ),
    "socket_localhost": (
        "import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)",
        "tool_error",
        "Connection refused",
    ),
    "recursion": (
        "import sys\nsys.setrecursionlimit(10 ** 6)\ndef f():\n    return f.__call__()\nf()",
        "tool_error",
        "SIGSEGV",
    ),
    "os_exit": ("import os\nprint('before')\nos._exit(3)", "tool_error", "exit code 3"),
    "ctypes_segfault": ("import ctypes\nctypes.string_at(0)", "tool_error", "SIGSEGV"),
    "thread_left_running": (SPIN + "threading.Thread(target=spin).start()", "tool_error", "limit"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(BATTERY))
def test_hostile_code_is_a_contained_tool_error(env, name):
    code, want, needle = BATTERY[name]
    t0 = time.monotonic()
    status, text = step_code(env, code)
    took = time.monotonic() - t0
    assert status == want, text
    assert needle in text, text
    assert took < LIMITS.wall_s + 10, f"{name} took {took:.1f} s past a {LIMITS.wall_s} s wall limit"
    assert wait_clean() == ([], []), "processes left behind"
    status, text = step_code(env, "print(6 * 7)")  # the env and the tool still work
    assert (status, text.strip()) == ("ok", "42")


@pytest.mark.timeout(60)
def test_secret_in_parent_env_never_reaches_the_sandbox(env, monkeypatch):
    monkeypatch.setenv("AGENT_GYM_FAKE_SECRET", SECRET)
    assert os.environ["AGENT_GYM_FAKE_SECRET"] == SECRET
    r = run_python("import os\nprint(dict(os.environ))", LIMITS)
    assert r.ok and SECRET not in r.stdout and "AGENT_GYM_FAKE_SECRET" not in r.stdout
    assert set(eval(r.stdout)) == {"PATH", "HOME", "LANG", "TMPDIR", "PWD"}  # a clean environment


@pytest.mark.timeout(60)
def test_writes_outside_the_sandbox_fail_and_leave_nothing(env, outside):
    target = outside / "pwned.txt"
    here = os.path.abspath(os.path.dirname(__file__))
    for path in (str(target), os.path.join(here, "pwned.txt"), "/pwned.txt", "/usr/pwned.txt", "/dev/pwned"):
        status, text = step_code(env, f"open({path!r}, 'w').write('x')")
        assert status == "tool_error" and ("No such file" in text or "Read-only" in text), (path, text)
        assert not os.path.exists(path)
    assert list(outside.iterdir()) == []


@pytest.mark.timeout(60)
def test_os_kill_of_the_parent_cannot_reach_it(env):
    status, text = step_code(env, f"import os\nos.kill({os.getpid()}, 9)\nos.kill(os.getppid() or 1, 9)")
    assert status == "tool_error"
    assert "ProcessLookupError" in text or "PermissionError" in text, text
    os.kill(os.getpid(), 0)  # this process is alive (it would not get here otherwise)


@pytest.mark.timeout(60)
def test_daemon_thread_and_background_process_do_not_outlive_the_call(env):
    # The program itself ends normally (status ok); what it left running must die with it.
    for code in (
        SPIN + "threading.Thread(target=spin, daemon=True).start()\nprint('bye')",
        "import os, time\nif os.fork() == 0:\n    time.sleep(3600)\nprint('bye')",
    ):
        t0 = time.monotonic()
        status, text = step_code(env, code)
        assert (status, text.strip()) == ("ok", "bye")
        assert time.monotonic() - t0 < LIMITS.wall_s, "the call waited for what the program left running"
        assert wait_clean() == ([], [])


@pytest.mark.timeout(60)
def test_private_tmp_is_writable_capped_and_not_kept():
    r = run_python("open('a.txt', 'w').write('hello')\nimport os\nprint(os.getcwd(), os.listdir('.'))", LIMITS)
    assert r.ok and r.stdout.strip() == "/tmp ['a.txt']"
    r = run_python("import os\nprint(os.listdir('/tmp'))", LIMITS)
    assert r.ok and r.stdout.strip() == "[]"  # nothing persists between calls
    r = run_python("open('/tmp/big', 'wb').write(b'x' * (17 << 20))", LIMITS)  # max_file_mb=16
    assert r.status == "error" and "File too large" in r.stderr
    small = SandboxLimits(wall_s=5, max_file_mb=4, tmpfs_mb=8)
    r = run_python("for i in range(4):\n    open(f'/tmp/f{i}', 'wb').write(b'x' * (3 << 20))", small)
    assert r.status == "error" and "No space left" in r.stderr


@pytest.mark.timeout(60)
def test_output_limit_keeps_the_head_and_cpu_limit_reports_timeout():
    r = run_python("print('a' * 100_000)", SandboxLimits(max_output_bytes=1000))
    assert r.status == "output_limit" and r.stdout == "a" * 1000 and r.exit_code is None
    r = run_python(
        "import time\nt = time.process_time()\nwhile time.process_time() - t < 3:\n    pass",
        SandboxLimits(wall_s=30, cpu_s=1),
    )
    assert r.status == "timeout" and "CPU time limit" in r.detail, r


def test_limits_and_tool_arguments_are_checked():
    with pytest.raises(ValueError, match="unknown sandbox limit"):
        SandboxLimits.from_any({"wall": 1})
    with pytest.raises(ValueError, match="wall_s must be a positive number"):
        SandboxLimits(wall_s=0)
    with pytest.raises(ValueError, match="cpu_s must be a whole number"):
        SandboxLimits(cpu_s=1.5)
    with pytest.raises(TypeError, match="code must be a str"):
        run_python(b"print(1)")  # type: ignore[arg-type]
    status, result = run_tool(PythonTool(LIMITS), {"code": 3})
    assert status == "bad_arguments" and "is not of type 'string'" in result.content


def test_unavailable_sandbox_names_the_fix(monkeypatch, tmp_path):
    with pytest.raises(SandboxUnavailable, match="does not exist"):
        check_available(str(tmp_path / "no-python"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on PATH
    from agent_gym import sandbox

    sandbox._probe.cache_clear()
    try:
        with pytest.raises(SandboxUnavailable, match="apt-get install -y bubblewrap"):
            run_python("print(1)", python="/usr/bin/python3")
    finally:
        monkeypatch.undo()
        sandbox._probe.cache_clear()


def test_format_result_shows_output_and_reason():
    r = run_python("import sys\nprint('out')\nprint('err', file=sys.stderr)\nraise SystemExit(2)", LIMITS)
    text = format_result(r)
    assert text.startswith("out\nstderr:\nerr") and text.endswith("the program stopped: exit code 2.")
    assert format_result(run_python("", LIMITS)) == "(no output)"


@pytest.mark.timeout(300)
def test_thousand_calls_leak_no_process_file_or_descriptor():
    """1,000 calls in a row through the tool, each minimal (an empty program): nothing leaks."""
    t = PythonTool(SandboxLimits(wall_s=30))  # a loaded machine must not turn a call into a timeout
    tmp = os.environ.get("TMPDIR", "/tmp")
    fds_before = len(os.listdir("/proc/self/fd"))
    t0 = time.monotonic()
    statuses = [run_tool(t, {"code": ""})[0] for _ in range(1000)]
    took = time.monotonic() - t0
    print(f"1000 sandbox calls: {took:.1f} s, {took:.1f} ms per call, load {os.getloadavg()[0]:.1f}")
    assert statuses == ["ok"] * 1000
    assert wait_clean() == ([], [])
    assert len(os.listdir("/proc/self/fd")) == fds_before
    # The host's temporary directory is shared with other jobs: check that no entry there belongs to a
    # uid of these sandboxes (they cannot see it at all: their /tmp is their own tmpfs).
    mine = issued_uids()
    assert len(mine) >= 990  # a fresh uid per call (collisions in a range of a million are rare)
    owned = []
    for name in os.listdir(tmp):
        try:
            owned += [name] if os.lstat(os.path.join(tmp, name)).st_uid in mine else []
        except OSError:
            pass
    assert owned == []
    status, text = run_tool(t, {"code": "print(sum(range(10)))"})
    assert (status, text.content) == ("ok", "45\n")


def test_python_tool_pickles():
    import pickle

    t = pickle.loads(pickle.dumps(PythonTool(LIMITS, max_result_chars=10)))
    assert t.limits == LIMITS and t.max_result_chars == 10
    status, r = run_tool(t, {"code": "print('x' * 50)"})
    assert status == "ok" and r.content == "[... 41 characters cut]\n" + "x" * 9 + "\n"  # the last 10 of 51
    np.testing.assert_equal(r.metadata["exit_code"], 0)


@pytest.mark.timeout(120)
def test_the_mount_point_directory_is_removed_at_exit():
    """Each process that used the sandbox left an empty /tmp/agent_gym_sandbox_* behind."""
    import subprocess
    import sys

    code = (
        "import os\nfrom agent_gym.sandbox import run_python, _MOUNT_POINT\n"
        "r = run_python('print(1)')\nassert r.stdout.strip() == '1', r\n"
        "assert os.path.isdir(_MOUNT_POINT[0])\nprint(_MOUNT_POINT[0])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100)
    assert out.returncode == 0, out.stderr
    made = out.stdout.strip().splitlines()[-1]
    assert "agent_gym_sandbox_" in made and not os.path.exists(made)
