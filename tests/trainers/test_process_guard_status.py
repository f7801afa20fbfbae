"""process_guard's process-status helpers that VLLMBackend's engine watch uses to notice a dead
engine process and say how it ended. Real processes, no vLLM needed."""

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from trainers.backends import process_guard


@pytest.mark.timeout(60)
def test_alive_exit_status_and_titled_on_real_processes():
    token = uuid.uuid4().hex
    env = {**os.environ, process_guard.ENV_VAR: token}
    # exec -a sets the title (argv[0]) as setproctitle does for VLLM::Worker.
    titled = subprocess.Popen(["bash", "-c", "exec -a VLLM::Test sleep 60"], env=env)
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        deadline = time.monotonic() + 20
        while set(process_guard.titled(token, b"VLLM::")) != {titled.pid} and time.monotonic() < deadline:
            time.sleep(0.05)  # until bash has exec'd
        assert process_guard.titled(token, b"VLLM::") == {titled.pid: "VLLM::Test"}
        assert process_guard.alive(titled.pid) and process_guard.exit_status(titled.pid) is None

        titled.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 20
        while process_guard.alive(titled.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not process_guard.alive(titled.pid)  # a zombie: exited, not reaped yet
        assert process_guard.exit_status(titled.pid) == signal.SIGKILL  # waitpid's raw status: the signal
        assert titled.pid not in process_guard.titled(token, b"VLLM::")
        titled.wait(timeout=10)  # reaped: the status is gone
        assert not process_guard.alive(titled.pid) and process_guard.exit_status(titled.pid) is None

        plain.terminate()
        plain.wait(timeout=10)
        assert not process_guard.alive(plain.pid)
    finally:
        for p in (titled, plain):
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
