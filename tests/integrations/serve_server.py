"""``python -m agent_gym.serve`` as a real process on 127.0.0.1 for the server's tests: the helpers
of :mod:`agent_gym.serve_process` (one implementation, shared with benchmarks/faults/serve_soak.py,
which runs by path and imports it from ``agent_gym``), plus :class:`Server`, one server the tests
start, stop, kill (SIGKILL) and start again on the same port."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from agent_gym.serve_process import ENV_ID, ROOT, free_port, kill_server, session_table, start_server, stop_server  # noqa: F401


class Server:
    """One ``python -m agent_gym.serve`` on 127.0.0.1:``port`` (a free one by default), its output
    appended to ``log``; ``start`` waits for ``/health``, and may be called again after ``stop`` or
    ``kill`` (the same port: a restarted server)."""

    def __init__(
        self,
        log: Path,
        env_kwargs: dict[str, Any],
        port: int | None = None,
        *,
        env_id: str = ENV_ID,
        max_concurrent_envs: int | None = None,
    ):
        self.log, self.env_kwargs, self.env_id = Path(log), dict(env_kwargs), env_id
        self.port = port if port is not None else free_port()
        self.max_concurrent_envs = max_concurrent_envs
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None

    def start(self, deadline_s: float = 180.0) -> Server:
        self.proc = start_server(
            self.port,
            self.env_kwargs,
            self.log,
            deadline_s,
            env_id=self.env_id,
            max_concurrent_envs=self.max_concurrent_envs,
        )
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop_server(self.proc)

    def kill(self) -> None:
        """SIGKILL: the server dies mid-whatever, no close frame sent."""
        if self.proc is not None:
            kill_server(self.proc)

    def table(self) -> dict:
        return session_table(self.url)

    def open_envs(self) -> int:
        return self.table()["open_envs"]

    def wait_open_envs(self, n: int, deadline_s: float = 20.0) -> int:
        end = time.monotonic() + deadline_s
        while (got := self.open_envs()) != n and time.monotonic() < end:
            time.sleep(0.1)
        return got
