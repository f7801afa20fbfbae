"""``python -m agent_gym.serve`` as a child process on 127.0.0.1: a free port, start (returns once
``/health`` answers), stop, kill, and the session table (``GET /agent_gym/sessions``).

The one implementation behind the server's tests (tests/integrations/serve_server.py,
test_openenv.py, test_serve_*.py) and benchmarks/faults/serve_soak.py (which runs by path and
imports it from ``agent_gym``). Standard library only: importing it costs nothing, and the server
itself (openenv-core, gradio, FastMCP) loads in the child.

    port = free_port()
    proc = start_server(port, {"max_turns": 4}, Path("server.log"), max_concurrent_envs=8)
    ...  # http://127.0.0.1:{port}
    stop_server(proc)    # SIGTERM, then SIGKILL after 15 s; kill_server(proc): SIGKILL at once
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[1]
"""The tree this ``agent_gym`` belongs to (the repository root of an editable install)."""
ENV_ID = "AgentR1/FactChain-v0"
HOST = "127.0.0.1"


def free_port(host: str = HOST) -> int:
    """A TCP port nothing listens on now (the OS's pick; another process may take it before the server does)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def server_command(
    port: int,
    env_kwargs: dict[str, Any] | None = None,
    *,
    env_id: str = ENV_ID,
    max_concurrent_envs: int | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The server's command line (this interpreter, ``-m agent_gym.serve``) on 127.0.0.1:``port``."""
    cmd = [
        sys.executable,
        "-m",
        "agent_gym.serve",
        env_id,
        "--host",
        HOST,
        "--port",
        str(port),
        "--env-kwargs",
        json.dumps(env_kwargs or {}),
    ]
    if max_concurrent_envs is not None:
        cmd += ["--max-concurrent-envs", str(max_concurrent_envs)]
    return cmd + list(extra_args)


def start_server(
    port: int,
    env_kwargs: dict[str, Any] | None,
    log_path: Path,
    deadline_s: float = 180.0,
    *,
    env_id: str = ENV_ID,
    tree: Path = ROOT,
    max_concurrent_envs: int | None = None,
    extra_args: Sequence[str] = (),
) -> subprocess.Popen:
    """``python -m agent_gym.serve env_id`` on 127.0.0.1:``port`` with ``env_kwargs``, its output
    appended to ``log_path``; returns once ``/health`` answers. ``tree``: the checkout whose
    ``agent_gym`` and ``envs`` serve (put first on ``PYTHONPATH``, ahead of the editable install, and
    the working directory; another commit's, for a before/after benchmark). Raises ``RuntimeError``
    with the log's tail if the process exits first or ``deadline_s`` passes (the process is stopped)."""
    tree = Path(tree)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    }
    cmd = server_command(
        port, env_kwargs, env_id=env_id, max_concurrent_envs=max_concurrent_envs, extra_args=extra_args
    )
    with open(log_path, "ab") as log:  # the child holds its own descriptor
        proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_health(f"http://{HOST}:{port}", deadline_s, proc=proc, log_path=log_path)
    except BaseException:
        stop_server(proc)
        raise
    return proc


def wait_for_health(
    url: str, deadline_s: float = 180.0, *, proc: subprocess.Popen | None = None, log_path: Path | None = None
) -> None:
    """Poll ``url/health`` every 0.2 s until it answers; ``RuntimeError`` (with the log's tail when
    ``log_path`` is given) if ``proc`` exits first or ``deadline_s`` passes."""

    def tail() -> str:
        return Path(log_path).read_text(errors="replace")[-2000:] if log_path is not None else ""

    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}: {tail()}")
        try:
            urllib.request.urlopen(url + "/health", timeout=2).read()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"the server did not answer {url}/health in {deadline_s} s: {tail()}")


def stop_server(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    """SIGTERM (uvicorn closes its sessions and exits), then SIGKILL after ``grace_s``."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def kill_server(proc: subprocess.Popen) -> None:
    """SIGKILL at once (a crash: no close frames, sessions cut mid-message) and reap it."""
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


def session_table(url: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """``GET url/agent_gym/sessions``: the envs not yet closed (``open_envs``), openenv-core's
    session count (``sessions``) and the limit (``max_concurrent_envs``)."""
    with urllib.request.urlopen(url + "/agent_gym/sessions", timeout=timeout_s) as r:
        return json.load(r)


__all__ = [
    "ENV_ID",
    "ROOT",
    "free_port",
    "kill_server",
    "server_command",
    "session_table",
    "start_server",
    "stop_server",
    "wait_for_health",
]
