"""process_guard without vLLM: a parent starts a marked grandchild tree, then dies or closes.

The vLLM end-to-end version (real engine processes) is test_vllm_backend.py's
``test_no_orphan_processes_after_any_exit``; this one runs in the core suite in ~2 s.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from tests.helpers import LineReader, kill_all
from trainers.backends import process_guard

REPO = Path(__file__).resolve().parents[2]

# The parent marks its environment, starts a child that starts a grandchild (both sleep), prints
# their pids, then either closes normally (end_marked + release) or waits to be SIGKILLed.
_PARENT = """
import os, subprocess, sys, time
from trainers.backends import process_guard
token, how = sys.argv[1], sys.argv[2]
dog = process_guard.start_watchdog(token)
os.environ[process_guard.ENV_VAR] = token
child = subprocess.Popen([sys.executable, "-c",
    "import subprocess, sys, time; g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']);"
    "print(g.pid, flush=True); time.sleep(600)"], stdout=subprocess.PIPE, text=True)
grandchild = int(child.stdout.readline())
print(child.pid, grandchild, flush=True)
if how == "close":
    left = process_guard.end_marked(token, grace_s=0.5)
    dog.release()
    print("LEFT", sorted(left), flush=True)
else:
    time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="process_guard needs /proc (Linux)")
@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["close", "sigkill"])
def test_marked_processes_end_on_close_and_on_parent_death(tmp_path, how):
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(_PARENT))
    token = uuid.uuid4().hex
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    parent = subprocess.Popen([sys.executable, str(script), token, how], stdout=subprocess.PIPE, text=True, env=env)
    out = LineReader(parent.stdout)  # every read below has its own deadline
    try:
        line = out.next_line(timeout=90)  # the parent imports torch first: seconds, more on busy cores
        child, grandchild = map(int, line.split())
        assert _alive(child) and _alive(grandchild)
        deadline = time.monotonic() + 10  # a process just started may still be exec'ing
        while not {child, grandchild} <= process_guard.marked_pids(token) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert {child, grandchild} <= process_guard.marked_pids(token)
        if how == "close":
            assert out.next_line(timeout=30).strip() == "LEFT []"
            parent.wait(timeout=30)
        else:
            parent.send_signal(signal.SIGKILL)  # no atexit, no handler: only the watchdog acts
            parent.wait(timeout=30)
        deadline = time.monotonic() + 30
        while (_alive(child) or _alive(grandchild)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child) and not _alive(grandchild), f"left behind after {how}"
        assert process_guard.marked_pids(token) == set()
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(timeout=30)
        kill_all(process_guard.marked_pids(token))  # by the mark, which a reused pid does not carry


@pytest.mark.timeout(60)
def test_reads_from_a_child_have_a_deadline_of_their_own():
    """``LineReader.next_line`` returns the lines in order, then raises instead of blocking while a
    silent process holds the pipe open (as the survivor that hung `make test` did), then ``""``
    once the pipe closed."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; print('one', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        out = LineReader(child.stdout)
        assert out.next_line(timeout=30) == "one\n"
        with pytest.raises(TimeoutError, match=r"no line from the child within 0.5 s; read so far:\none"):
            out.next_line(timeout=0.5)  # a plain readline would block until the child's exit
    finally:
        child.kill()
        child.wait(timeout=30)
    assert out.next_line(timeout=30) == "" and out.eof.is_set()


@pytest.mark.timeout(60)
def test_environ_is_inherited_inside_and_restored_after_even_on_error(monkeypatch):
    monkeypatch.setenv("AGENT_GYM_TEST_KEPT", "before")
    monkeypatch.delenv("AGENT_GYM_TEST_NEW", raising=False)
    env = {"AGENT_GYM_TEST_KEPT": "inside", "AGENT_GYM_TEST_NEW": "inside"}
    probe = [
        sys.executable,
        "-c",
        "import os; print(os.environ['AGENT_GYM_TEST_KEPT'], os.environ['AGENT_GYM_TEST_NEW'])",
    ]
    with pytest.raises(KeyError):
        with process_guard.environ(env):
            assert subprocess.run(probe, capture_output=True, text=True, timeout=30).stdout.split() == [
                "inside",
                "inside",
            ]
            raise KeyError("an error inside the block")
    assert os.environ["AGENT_GYM_TEST_KEPT"] == "before" and "AGENT_GYM_TEST_NEW" not in os.environ
