"""The env server's session budget and its death, with ``python -m agent_gym.serve`` as a real process:

- a vector env (a trainer's batch) that needs more sessions than the server allows is refused before
  any session opens, with the numbers (needed, allowed, open) and what to change (the server's
  ``--max-concurrent-envs``, or ``rollout.tasks_per_iter * rollout.group_size``); a session refused
  for capacity anyway (another client came first) says so, never "the server stopped or restarted";
- a server SIGKILLed mid-episode ends the vector env's step with ``EnvServerGoneError`` naming the
  URL, at once; with ``reconnect_s`` the vector env waits for a server on the same port, replays the
  episodes in flight there (reset with the same arguments, the same actions, checked token for
  token) and goes on: the rollout loop collects the same batch as in-process;
- a trainer whose server is killed mid-run ends with one line (exit status 2) naming the URL and
  ``--resume RUN_DIR``, and the resumed run, on a restarted server, finishes;
- ``agent_gym.serve_process`` starts the server of another tree (the soak benchmark's ``--ref``).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip(
    "openenv.core.env_server", reason="openenv-core is not installed (pip install -e '.[openenv]'; make setup does)"
)

import agent_gym  # noqa: E402,F401
from agent_gym.env_client import AgentGymClient, RemoteVectorEnv  # noqa: E402
from tests.integrations.serve_server import ROOT, Server  # noqa: E402

ENV_ID = "AgentR1/FactChain-v0"
LIMIT = 4


def _vocab() -> int:
    from agent_gym.tokenizer import load_tokenizer

    return -(-len(load_tokenizer(None)) // 64) * 64  # the tiny model's embedding rows (build_tiny_qwen2)


ENV_KWARGS = {"vocab_size": _vocab(), "max_turns": 4}
LOOKUP = '<tool_call>{"name": "lookup", "arguments": {"entity": "x", "relation": "y"}}</tool_call>'


@pytest.fixture(scope="module")
def small_server(tmp_path_factory):
    """A server that allows LIMIT sessions."""
    s = Server(tmp_path_factory.mktemp("serve_faults") / "server.log", ENV_KWARGS, max_concurrent_envs=LIMIT)
    s.start()
    yield s
    s.stop()


def _hold(url: str, n: int) -> list:
    """``n`` sessions held open by another client (raw WebSockets, each reset once); ``_release`` closes them."""
    from websockets.sync.client import connect

    held = []
    for i in range(n):
        cm = connect(url.replace("http", "ws", 1) + "/ws", open_timeout=30, close_timeout=10)
        ws = cm.__enter__()
        held.append(cm)
        ws.send(json.dumps({"type": "reset", "data": {"seed": i}}))
        assert json.loads(ws.recv(timeout=30))["type"] == "observation"
    return held


def _release(held: list) -> None:
    for cm in held:
        cm.__exit__(None, None, None)


@pytest.mark.timeout(120)
def test_a_batch_larger_than_the_server_allows_is_refused_up_front_with_the_numbers(small_server):
    from agent_gym.cli_errors import describe
    from agent_gym.env_client import EnvServerFullError

    s = small_server
    assert s.wait_open_envs(0) == 0
    assert s.table()["max_concurrent_envs"] == LIMIT
    with pytest.raises(EnvServerFullError) as e:
        RemoteVectorEnv(s.url, LIMIT + 4)
    msg = str(e.value)
    assert msg == (
        f"env server {s.url} cannot open the 8 sessions this run needs (one per env): it allows {LIMIT} "
        f"at once (python -m agent_gym.serve --max-concurrent-envs {LIMIT}) and 0 are open. Restart it with "
        "--max-concurrent-envs 8 or more, or need fewer sessions: a trainer opens "
        f"rollout.tasks_per_iter * rollout.group_size of them, so make that at most {LIMIT}"
    )
    assert (e.value.needed, e.value.limit, e.value.open) == (8, LIMIT, 0)
    assert describe(e.value) == msg  # a command prints it as its one line
    assert s.wait_open_envs(0) == 0  # refused before any session opened

    # Sessions other clients hold count: 3 of 4 taken leaves room for 1.
    held = _hold(s.url, 3)
    try:
        assert s.wait_open_envs(3) == 3
        with pytest.raises(
            EnvServerFullError,
            match=rf"cannot open the 2 sessions this run needs \(one per env\): "
            rf"it allows {LIMIT} at once .* and 3 are open\. Restart it with "
            r"--max-concurrent-envs 5 or more, .* make that at most 1$",
        ):
            RemoteVectorEnv(s.url, 2)
        with RemoteVectorEnv(s.url, 1) as one:  # what fits is not refused
            obs, _ = one.reset(seed=[0])
            assert len(obs["input_ids"][0]) > 0 and s.open_envs() == 4
    finally:
        _release(held)
    assert s.wait_open_envs(0) == 0


@pytest.mark.timeout(120)
def test_a_session_refused_for_capacity_names_the_limit_not_a_restart(small_server):
    """Another client takes the last sessions between the check and the connections (a race): the
    server accepts the WebSocket, answers CAPACITY_REACHED and closes it. The error says that."""
    from agent_gym.env_client import EnvServerFullError

    s = small_server
    assert s.wait_open_envs(0) == 0
    held = _hold(s.url, LIMIT)
    try:

        async def one_reset():
            c = AgentGymClient(base_url=s.url, message_timeout_s=30)
            await c.connect()
            try:
                await asyncio.sleep(0.5)  # the refusal and the close arrive before the reset goes out
                return await c.reset(seed=0)
            finally:
                await c.close()

        with pytest.raises(
            EnvServerFullError,
            match=rf"env server {s.url} refused a session: it is at its limit of "
            rf"{LIMIT} sessions \({LIMIT} open\)\. Restart it with a larger "
            r"--max-concurrent-envs, or need fewer sessions",
        ) as e:
            asyncio.run(one_reset())
        assert "stopped or restarted" not in str(e.value)

        class Racing(RemoteVectorEnv):
            """Another client's sessions open right after this vector env checked for room."""

            def _check_room(self):
                super()._check_room()
                _release(held)
                held[:] = _hold(s.url, LIMIT - 1)

        _release(held)
        held[:] = []
        assert s.wait_open_envs(0) == 0
        vec = Racing(s.url, 2)  # room for 2 when it looked; 1 left when it connected
        try:
            with pytest.raises(
                EnvServerFullError,
                match=rf"env server {s.url} refused 1 of the 2 sessions this run "
                rf"opened: it is at its limit of {LIMIT} sessions \({LIMIT} "
                r"open\)\. Restart it with a larger --max-concurrent-envs",
            ):
                vec.reset(seed=[0, 1])
        finally:
            vec.close()
    finally:
        _release(held)
    assert s.wait_open_envs(0) == 0


@pytest.mark.timeout(300)
def test_a_trainer_whose_batch_the_server_cannot_hold_ends_in_one_line_before_its_first_rollout(small_server, tmp_path):
    """A trainer config whose batch (tasks_per_iter * group_size = 8) is more than the server's
    limit (4): one line, exit status 2, naming the numbers and the keys; no session was opened."""
    s = small_server
    assert s.wait_open_envs(0) == 0
    run_dir = tmp_path / "run"
    cfg = _train_config(tmp_path, run_dir, s.url, tasks_per_iter=4, group_size=2)
    p = _train("--config", str(cfg))
    try:
        out, err = p.communicate(timeout=240)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 2, err[-3000:]
    assert err.strip().splitlines() == [
        f"error: env server {s.url} cannot open the 8 sessions this run needs (one per env): it allows {LIMIT} at once "
        f"(python -m agent_gym.serve --max-concurrent-envs {LIMIT}) and 0 are open. Restart it with "
        "--max-concurrent-envs 8 or more, or need fewer sessions: a trainer opens "
        f"rollout.tasks_per_iter * rollout.group_size of them, so make that at most {LIMIT}"
    ], err[-3000:]
    assert not (run_dir / "metrics.jsonl").exists()  # it stopped at set-up
    assert s.wait_open_envs(0) == 0


def _mid_episode(vec, local):
    """Reset both vector envs alike, then step every slot once with a tool call (no episode ends)."""
    obs, _ = vec.reset(seed=[5, 6], options={"task_indices": [1, 2]})
    l_obs, _ = local.reset(seed=[5, 6], options={"task_indices": [1, 2]})
    u = local.envs[0]
    act = [u.encode_turn(LOOKUP)] * 2
    obs, _, term, trunc, _ = vec.step(act)
    local.step(act)
    assert not any(term) and not any(trunc)
    return obs


@pytest.mark.timeout(240)
def test_a_killed_server_ends_the_step_at_once_naming_it_and_reconnect_s_bounds_the_wait(tmp_path):
    from agent_gym.cli_errors import describe
    from agent_gym.env_client import EnvServerGoneError
    from agent_gym.factory import EnvFactory

    s = Server(tmp_path / "server.log", ENV_KWARGS).start()
    local = EnvFactory(ENV_ID, ENV_KWARGS).make_vector(2)
    u = local.envs[0]
    answer = [u.encode_turn("<answer>x</answer>")] * 2
    try:
        plain, waiting = RemoteVectorEnv(s.url, 2), RemoteVectorEnv(s.url, 2, reconnect_s=3.0)
        for vec in (plain, waiting):
            _mid_episode(vec, local)
        s.kill()
        t0 = time.monotonic()
        with pytest.raises(EnvServerGoneError) as e:
            plain.step(answer)
        took = time.monotonic() - t0
        assert took < 5, took
        assert e.value.url == s.url
        msg = str(e.value)
        assert msg.startswith(f"env server {s.url} is gone (")
        assert msg.endswith(
            "): its sessions and the episodes in them are lost. Restart it (python -m agent_gym.serve "
            "with the same env, env kwargs and port) and start those episodes again"
        )
        assert describe(e.value) == msg
        t0 = time.monotonic()
        with pytest.raises(
            EnvServerGoneError,
            match=r"is gone \(.*\) and did not come back within reconnect_s=3\.0 s: "
            "its sessions and the episodes in them are lost",
        ):
            waiting.step(answer)
        took = time.monotonic() - t0
        assert 3 <= took < 10, took
        plain.close()
        waiting.close()
    finally:
        s.stop()


@pytest.mark.timeout(300)
def test_reconnect_replays_the_episodes_in_flight_on_a_restarted_server(tmp_path):
    """The rollout loop (``trainers.rollout.collect``, tiny model) on 4 sessions; the server is
    SIGKILLed mid-rollout and a new one started on the same port: with ``reconnect_s`` the batch is
    the one an in-process vector env gives (ids, loss masks, rewards, sampler log-probs)."""
    pytest.importorskip("torch")
    from agent_gym.factory import EnvFactory
    from agent_gym.tokenizer import load_tokenizer
    from trainers.backends.base import SamplingConfig
    from trainers.backends.hf_backend import HFBackend
    from trainers.rollout import collect
    from trainers.tiny_model import build_tiny_qwen2

    tok = load_tokenizer(None)
    backend = HFBackend(build_tiny_qwen2(tok, seed=0), pad_token_id=tok.pad_token_id)
    sampling = SamplingConfig(max_new_tokens=24, temperature=1.0)
    local = EnvFactory(ENV_ID, ENV_KWARGS).make_vector(4)
    expected, _ = collect(local, backend, [3, 11], 2, sampling, seed=5)
    local.close()
    assert sum(t.episode.turns for t in expected) > 4  # multi-turn: the kill after turn 1 is mid-episode

    s = Server(tmp_path / "server.log", ENV_KWARGS).start()
    restarted: list = []

    class KillAfterTurnOne:
        """The sampler, which kills the server once the first turn's observations are in."""

        calls = 0

        def __init__(self, inner):
            self.inner = inner

        def generate(self, *args, **kwargs):
            KillAfterTurnOne.calls += 1
            if KillAfterTurnOne.calls == 2:
                s.kill()
                threading.Thread(target=lambda: restarted.append(s.start()), daemon=True).start()
            return self.inner.generate(*args, **kwargs)

    try:
        with RemoteVectorEnv(s.url, 4, reconnect_s=150.0) as remote:
            got, _ = collect(remote, KillAfterTurnOne(backend), [3, 11], 2, sampling, seed=5)
            assert remote.reconnects == 1 and restarted
            assert got == expected  # Trajectory dataclasses: Episode (ids, masks, reward), log-probs, group
            assert s.open_envs() == 4  # its sessions are on the new server
        assert s.wait_open_envs(0) == 0
    finally:
        s.stop()


def _train(*args: str) -> subprocess.Popen:
    """``python trainers/train_grpo.py ARGS`` as users run it (stdout and stderr piped)."""
    return subprocess.Popen(
        [sys.executable, str(ROOT / "trainers" / "train_grpo.py"), *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _train_config(
    tmp_path: Path, run_dir: Path, url: str, iterations: int = 6, tasks_per_iter: int = 2, group_size: int = 2
) -> Path:
    """A GRPO run of the tiny model on the server at ``url`` (FactChain, max_turns 4), checkpointed every iteration."""
    import yaml

    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "run": {
                    "run_dir": str(run_dir),
                    "seed": 3,
                    "iterations": iterations,
                    "checkpoint_every": 1,
                    "tensorboard": False,
                    "progress_bar": False,
                },
                "model": {"name": "tiny", "torch_threads": 1},
                "rollout": {
                    "env_id": ENV_ID,
                    "env_kwargs": {"max_turns": 4},
                    "tasks_per_iter": tasks_per_iter,
                    "group_size": group_size,
                    "max_turn_tokens": 16,
                    "env_server": url,
                },
                "algorithm": {"algo": "grpo", "minibatch_size": 4},
                "eval": {"every": 100, "tasks": 2},
            }
        )
    )
    return cfg


@pytest.mark.timeout(540)
def test_a_trainer_whose_server_is_killed_ends_in_one_line_and_resumes(tmp_path):
    s = Server(tmp_path / "server.log", ENV_KWARGS).start()
    run_dir = tmp_path / "run"
    cfg = _train_config(tmp_path, run_dir, s.url)
    try:
        p = _train("--config", str(cfg))
        try:
            ckpt = run_dir / "checkpoints"
            end = time.monotonic() + 240
            while not (ckpt.is_dir() and any(ckpt.glob("iter_*"))) and p.poll() is None and time.monotonic() < end:
                time.sleep(0.1)
            assert p.poll() is None, p.communicate(timeout=30)
            s.kill()  # mid-run: the next rollout's messages find no server
            out, err = p.communicate(timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
        assert p.returncode == 2, err[-3000:]
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
        assert lines[0].startswith(f"error: the env server at {s.url} is gone mid-run (")
        assert lines[0].endswith(
            f"the rollout's sessions and the episodes in them are lost. Restart the server "
            f"(python -m agent_gym.serve with this run's env and env kwargs, on port {s.port}), then "
            f"continue the run from its last checkpoint with --resume {run_dir}"
        )

        s.start()  # the advice, followed
        p = _train("--resume", str(run_dir))
        try:
            out, err = p.communicate(timeout=300)
        finally:
            if p.poll() is None:
                p.kill()
        assert p.returncode == 0, err[-3000:]
        assert "rollout/success_rate" in json.loads(out.strip().splitlines()[-1])
        its = [json.loads(x)["iteration"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert its[-1] == 5 and sorted(set(its)) == list(range(6))
    finally:
        s.stop()


@pytest.mark.timeout(240)
def test_serve_process_starts_the_server_of_another_tree(tmp_path):
    """The soak benchmark's ``--ref``: ``start_server(tree=...)`` serves that tree's agent_gym."""
    from agent_gym.provenance import git_tree
    from agent_gym.serve_process import free_port, session_table, start_server, stop_server

    tree = git_tree("HEAD", tmp_path / "tree", ["agent_gym", "envs"])
    port = free_port()
    proc = start_server(port, {"max_turns": 4}, tmp_path / "server.log", tree=tree, max_concurrent_envs=3)
    try:
        assert Path(f"/proc/{proc.pid}/cwd").resolve() == tree.resolve()
        environ = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
        pythonpath = next(v for v in environ if v.startswith(b"PYTHONPATH=")).decode()
        assert pythonpath.split("=", 1)[1].split(":")[0] == str(tree)
        table = session_table(f"http://127.0.0.1:{port}")
        assert table["max_concurrent_envs"] == 3 and table["open_envs"] == 0
    finally:
        stop_server(proc)
    assert proc.returncode is not None


def test_the_soak_benchmark_uses_the_shared_helper():
    """benchmarks/faults/serve_soak.py (run by path) starts its server with agent_gym.serve_process."""
    import importlib.util

    import agent_gym.serve_process as sp

    spec = importlib.util.spec_from_file_location("serve_soak", ROOT / "benchmarks" / "faults" / "serve_soak.py")
    soak = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(soak)
    assert soak.start_server is sp.start_server and soak.stop_server is sp.stop_server
    assert soak.free_port is sp.free_port and soak.session_table is sp.session_table
