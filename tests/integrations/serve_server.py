"""``python -m agent_gym.serve`` as a real process on 127.0.0.1 for the server's tests
(tests/integrations/test_serve_abuse.py): a free port, start (waits for ``/health``), stop, and the
session table (``GET /agent_gym/sessions``). benchmarks/faults/serve_soak.py starts its server the
same way, with code of its own (it runs by path, where ``tests`` is not importable)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV_ID = "AgentR1/FactChain-v0"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, env_kwargs: dict, log_path: Path, deadline_s: float = 180.0,
                 env_id: str = ENV_ID) -> subprocess.Popen:
    """The server of this tree serving ``env_id`` with ``env_kwargs`` on ``port``, its output
    appended to ``log_path``; returns once ``/health`` answers (raises with the log's tail if the
    process exits first or ``deadline_s`` passes)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "agent_gym.serve", env_id, "--port", str(port),
                                 "--env-kwargs", json.dumps(env_kwargs)],
                                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}: {log_path.read_text()[-2000:]}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read()
            return proc
        except OSError:
            time.sleep(0.2)
    stop_server(proc)
    raise RuntimeError(f"the server did not answer /health in {deadline_s} s: {log_path.read_text()[-2000:]}")


def stop_server(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 15 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def session_table(url: str, timeout_s: float = 10.0) -> dict:
    """``GET URL/agent_gym/sessions``: the envs not yet closed (``open_envs``) and openenv-core's
    session count (``sessions``)."""
    with urllib.request.urlopen(url + "/agent_gym/sessions", timeout=timeout_s) as r:
        return json.load(r)
