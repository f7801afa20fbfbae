"""PPO and GRPO with ``backend: vllm`` end to end on vLLM's CPU build (run under .venv-vllm).

One engine serves both runs (an engine start is ~20 s of the 2 cores): the trainer's
``make_backend`` is pointed at it, and it first syncs the trainer's initial policy into the
engine with ``load_weights``, the same call every iteration's sync makes, so each run starts
from its own weights exactly as with a fresh engine.

The engine-death tests come last: they kill the module engine's processes, and the
last one leaves the engine dead for good.
"""

import json
import signal
import threading
import time

import pytest

from tests.trainers.conftest import tiny_rl_config

try:
    import vllm  # noqa: F401

    _VLLM_MISSING = ""
except Exception as e:  # ImportError, or a broken CUDA torchvision raising at import
    _VLLM_MISSING = f"vllm is not importable here ({type(e).__name__}: {e}); run under .venv-vllm (`make vllm-cpu`)"
# A marker-level skip, not a module-level importorskip: the core suite deselects these tests (-m "not
# vllm") instead of skipping the module at collection; in the vLLM suite, where `make test` requires
# vLLM, a skip for a missing vLLM fails the run (tests/conftest.py).
pytestmark = [pytest.mark.vllm, pytest.mark.skipif(bool(_VLLM_MISSING), reason=_VLLM_MISSING or "-")]

VLLM_KWARGS = {"max_model_len": 1024}


class _Shared:
    """The module's engine for one run: ``close()`` leaves it running for the next run, and its
    ``restarts`` count from this run's start, as a fresh engine's would."""

    def __init__(self, engine):
        self.engine = engine
        self._restarts_before = engine.restarts

    @property
    def restarts(self):
        return self.engine.restarts - self._restarts_before

    def generate(self, *args, **kwargs):
        return self.engine.generate(*args, **kwargs)

    def load_weights(self, state_dict):
        self.engine.load_weights(state_dict)

    def close(self):
        pass


@pytest.fixture(scope="module")
def engine(sft_model):
    from trainers.backends.vllm_backend import VLLMBackend

    backend = VLLMBackend(sft_model, seed=0, **VLLM_KWARGS)
    yield backend
    backend.close()


# The first test's set-up runs the session's SFT fixture (600 steps) and starts the engine:
# 10 minutes at a load average of ~25 on the 2 cores, hence a longer deadline than the default.
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("algo,lora_r", [("ppo", 0), ("grpo", 0), ("grpo", 4)])
def test_rl_with_vllm_backend_end_to_end(tmp_path, sft_model, engine, algo, lora_r, monkeypatch):
    """``lora_r: 4``: the engine gets the adapters merged into the base weights (scale.py), so after
    an update its log-probs still agree with the trainer's; pushing the base weights alone would not."""
    import torch

    import trainers.trainer as trainer_mod
    from trainers import scale
    from trainers.compose import build_trainer

    def shared_backend(rollout, policy, tokenizer, run_dir, *, device, seed, lone=False):
        assert rollout.backend == "vllm" and rollout.vllm_kwargs == VLLM_KWARGS and seed == 0
        engine.load_weights(scale.inference_state_dict(policy))  # what make_backend saves for the engine
        return _Shared(engine)

    monkeypatch.setattr(trainer_mod, "make_backend", shared_backend)
    lora = {"lora_r": lora_r, "lora_alpha": 2 * lora_r} if lora_r else {}
    cfg = tiny_rl_config(
        tmp_path / algo, algo, sft_model, backend="vllm", iterations=2, eval_every=1, vllm_kwargs=VLLM_KWARGS, **lora
    )
    tr = build_trainer(cfg)
    tr.setup()
    try:
        before = {k: v.detach().clone() for k, v in tr.policy.named_parameters()}
        last = tr.train()
        changed = [k for k, v in tr.policy.named_parameters() if not torch.equal(v, before[k])]
        assert changed, "no policy parameter changed"
        # After the last sync vLLM samples from the updated weights: its log-probs of its own
        # samples agree with the trainer's recomputation.
        assert last["train/logprob_mismatch_max"] < 1e-3
    finally:
        tr.cleanup()
    recs = [json.loads(x) for x in (tmp_path / algo / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in recs] == [0, 1] and "eval/success_rate" in recs[-1]


@pytest.mark.timeout(900)
def test_overlapped_rollout_with_vllm_is_one_version_old(tmp_path, sft_model, engine, monkeypatch):
    """``rollout.max_staleness: 1`` with the vLLM engine: the next rollout runs in the background
    thread while the learner trains, the engine gets the weights between rollouts, and the
    trajectories are exactly one version old after the first iteration."""
    import torch

    import trainers.trainer as trainer_mod
    from trainers import scale
    from trainers.compose import build_trainer

    threads, pushed = [], []

    class Recording(_Shared):
        def generate(self, *args, **kwargs):
            threads.append(threading.current_thread().name)
            return super().generate(*args, **kwargs)

        def load_weights(self, state_dict):
            pushed.append(float(sum(v.double().sum() for v in state_dict.values())))
            super().load_weights(state_dict)

    def shared_backend(rollout, policy, tokenizer, run_dir, *, device, seed, lone=False):
        engine.load_weights(policy.state_dict())
        return Recording(engine)

    monkeypatch.setattr(trainer_mod, "make_backend", shared_backend)
    cfg = tiny_rl_config(
        tmp_path / "stale", "grpo", sft_model, backend="vllm", iterations=3, eval_every=100, vllm_kwargs=VLLM_KWARGS
    )
    cfg.rollout.max_staleness = 1
    tr = build_trainer(cfg)
    tr.setup()
    try:
        versions = []
        orig = tr.update

        def update(batch, it):
            out = orig(batch, it)
            sd = scale.inference_state_dict(tr.policy)  # what the trainer pushes to the engine
            versions.append(float(sum(v.detach().double().sum() for v in sd.values())))
            return out

        tr.update = update
        last = tr.train()
        assert all(torch.isfinite(torch.tensor(v)) for v in last.values() if isinstance(v, float))
    finally:
        tr.cleanup()
    recs = [json.loads(x) for x in (tmp_path / "stale" / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout/staleness_max"] for r in recs] == [0.0, 1.0, 1.0]
    assert [r["rollout/policy_version"] for r in recs] == [0.0, 0.0, 1.0]
    assert any(t.startswith("rollout") for t in threads)  # the engine served the background rollout
    # Weights reached the engine after update 0 (before rollout 2) and before the final evaluation.
    assert any(p == pytest.approx(versions[0], rel=1e-12) for p in pushed)
    assert pushed[-1] == pytest.approx(versions[-1], rel=1e-12)
    # The stale iterations' behaviour weights: a mean over tokens of min(ratio, 2) and the share cut at 2
    # (both depend on the sampled tokens; the weight mean is a ratio of two nearby policies, so near 1).
    assert 0.5 < recs[1]["policy/is_weight_mean"] <= 2.0 and 0.0 <= recs[1]["policy/is_truncated_frac"] <= 1.0


# Starts a local Ray cluster and, in its one rollout worker, a second vLLM engine, twice: about 4 minutes
# on 2 idle cores.
@pytest.mark.timeout(1500)
def test_ray_worker_with_its_own_vllm_engine_matches_in_process(tmp_path, sft_model, engine, monkeypatch):
    """``rollout_workers: 1`` with ``backend: vllm``: the worker starts its own engine (docs/scaling.md
    says why not one shared engine actor), generates its slice with it, and gets the learner's
    weights after every update. Two GRPO iterations give the in-process vLLM run's trajectories
    token for token (vLLM's sampler differs from the HF backend's, so a worker that fell back to HF
    would not match), and after cleanup no engine process and no Ray cluster is left.

    The worker's engine core is SIGKILLed during the second rollout (before the fix the worker
    hung until rollout_timeout_s), in two runs:
    - ``max_restarts: 0``: its backend raises EngineDiedError at once; the pool restarts the worker
      (a new engine), sends it the current weights and retries its slice;
    - ``max_restarts: 1``: the worker's own backend restarts its engine, with the current weights,
      and reruns the slice; the worker lives on, and the restart reaches the learner's metrics
      through the pool (``rollout/engine_restarts`` 1 in that iteration's row, worker restarts 0).
    Both runs' trajectories still match the in-process run's."""
    ray = pytest.importorskip("ray", reason="Ray is not in this venv (make vllm-cpu installs it)")
    import psutil
    import torch

    import trainers.trainer as trainer_mod
    from trainers.compose import build_trainer
    from trainers.ray_rollout import RayRollout

    kw = dict(
        backend="vllm",
        iterations=2,
        eval_every=100,
        vllm_kwargs=VLLM_KWARGS,
        max_turn_tokens=40,
        env_kwargs={
            "tools_in_prompt": False,
            "max_turns": 3,
            "system_prompt": "Follow the chain of facts with lookup, innermost relation first.",
            "rewards": {"extra": {"hop": 0.2}},
        },
    )

    def module_engine(
        rollout, policy, tokenizer, run_dir, *, device, seed, lone=False
    ):  # synced to the run's initial policy
        engine.load_weights(policy.state_dict())
        return _Shared(engine)

    runs, killed = {}, {}
    # max_restarts 0: the worker's backend does not restart its engine itself, so the pool's own
    # path runs; max_restarts 1: the backend's restart, inside the worker.
    ray_extra = {"rollout_workers": 1, "rollout_timeout_s": 600}
    for name, extra in (
        ("inproc", {}),
        ("ray", {**ray_extra, "vllm_kwargs": {**VLLM_KWARGS, "max_restarts": 0}}),
        ("ray_engine_restart", {**ray_extra, "vllm_kwargs": {**VLLM_KWARGS, "max_restarts": 1}}),
    ):
        if name == "inproc":
            monkeypatch.setattr(trainer_mod, "make_backend", module_engine)
        else:  # the learner's own backend (HF, for evaluation) and the worker's engine are real
            monkeypatch.undo()
        tr = build_trainer(tiny_rl_config(tmp_path / name, "grpo", sft_model, **{**kw, **extra}))
        tr.setup()
        seen, orig, engines = {}, tr.rollout, {}

        # The worker's engine processes as its backend knows them (the core from vLLM's process
        # manager), not by process name: a CI run saw all four children of the Ray worker named
        # "python" by psutil (/proc/PID/comm) after a rollout its engine served.
        def rollout(it, tr=tr, seen=seen, orig=orig, engines=engines, name=name):
            if it == 1 and isinstance(tr.source, RayRollout):  # the worker's engine core dies during this rollout
                [procs] = tr.source.pool.engine_processes()
                [core] = [pid for pid, role in procs.items() if role == "VLLM::EngineCore"]
                killed[name] = _kill_mid_call(psutil.Process(core), delay_s=2.0)
            trajs, rt = orig(it)
            seen[it] = trajs
            if isinstance(tr.source, RayRollout):  # the worker's own engine processes, while they run
                for procs in tr.source.pool.engine_processes():
                    engines.update(procs)
                for pid in tr.source.pool.pids():
                    engines.update(
                        {p.pid: engines.get(p.pid, _title(p)) for p in psutil.Process(pid).children(recursive=True)}
                    )
            return trajs, rt

        tr.rollout = rollout
        try:
            last = tr.train()
        finally:
            tr.cleanup()
        runs[name] = (seen, last, engines, tr.run_dir)
    ref, ref_last, _, _ = runs["inproc"]
    assert any(any(t.episode.step_rewards) for t in ref[0]), "no reward in iteration 0: the update would be void"
    assert ref_last["rollout/engine_restarts"] == 0
    # (worker restarts, engine restarts) in the row of iteration 1, the one the kill happened in:
    # max_restarts 0, the pool restarted the worker; max_restarts 1, the worker's backend restarted
    # its engine and the worker lived on. (Iteration 0's row is not checked: on a loaded machine a
    # slow engine can be declared dead there too and counted, as it was once beside another vLLM
    # engine bound to the same core.)
    expected = {"ray": (1.0, 0.0), "ray_engine_restart": (0.0, 1.0)}
    for name, (worker_restarts, engine_restarts) in expected.items():
        got, last, engines, run_dir = runs[name]
        assert "VLLM::EngineCore" in engines.values(), f"{name}: the worker started no vLLM engine: {engines}"
        dead_core = killed[name].pid  # a new engine core ran after it
        assert [p for p, n in engines.items() if n == "VLLM::EngineCore" and p != dead_core], (name, engines)
        assert _column(run_dir, "rollout/worker_restarts")[1] == worker_restarts, name
        assert _column(run_dir, "rollout/engine_restarts")[1] == engine_restarts, name
        for it in (0, 1):
            assert [(t.episode.token_ids, t.episode.loss_mask, t.group) for t in got[it]] == [
                (t.episode.token_ids, t.episode.loss_mask, t.group) for t in ref[it]
            ], f"{name}: iteration {it} differs"
            for a, b in zip(got[it], ref[it]):
                assert torch.allclose(torch.tensor(a.sampler_logprobs), torch.tensor(b.sampler_logprobs), atol=1e-4)
        assert last["policy/loss"] == pytest.approx(ref_last["policy/loss"], abs=1e-5), name
    assert not ray.is_initialized()
    engines = {p: n for _, _, e, _ in runs.values() for p, n in e.items()}

    def alive(pid):
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + 30  # the kernel reaps them; a survivor stays
    while (left := [pid for pid in engines if alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"processes of the worker's engine left behind: {[(p, engines[p]) for p in left]}"


# -- a dead engine ------------------------------------------------------------------------------


def _kill_mid_call(proc, delay_s: float) -> threading.Thread:
    """Stop ``proc`` (a psutil.Process of an engine) now and SIGKILL it ``delay_s`` later: a call
    made meanwhile waits on the stopped engine, so the kill lands while it runs. Returns the killer
    thread, with ``pid`` set."""
    proc.suspend()

    def kill():
        time.sleep(delay_s)
        proc.send_signal(signal.SIGKILL)

    t = threading.Thread(target=kill, daemon=True)
    t.pid = proc.pid
    t.start()
    return t


def _title(proc) -> str:
    """A process's title: the first word of its command line (what ``setproctitle`` rewrites)."""
    import psutil

    try:
        return (proc.cmdline() or [proc.name()])[0]
    except psutil.Error:
        return "?"


def _engine_process(engine, role: str):
    """The process of ``engine`` in ``role`` (``VLLM::EngineCore``, ``VLLM::Worker``), as the backend knows it."""
    import psutil

    [pid] = [pid for pid, r in engine.engine_processes().items() if r.startswith(role)]
    return psutil.Process(pid)


def _grpo_run(tmp_path, sft_model, engine, monkeypatch, name, before_rollout=None, before_sync=None, **kw):
    """A GRPO run on the module's engine: ``before_rollout(it)``/``before_sync(it)`` run before
    that step of iteration ``it``. Returns (trainer, {iteration: trajectories}, last metrics or the
    exception that ended the run)."""
    import trainers.trainer as trainer_mod
    from trainers.compose import build_trainer

    def module_engine(rollout, policy, tokenizer, run_dir, *, device, seed, lone=False):
        engine.load_weights(policy.state_dict())
        return _Shared(engine)

    monkeypatch.setattr(trainer_mod, "make_backend", module_engine)
    tr = build_trainer(
        tiny_rl_config(tmp_path / name, "grpo", sft_model, backend="vllm", vllm_kwargs=VLLM_KWARGS, **kw)
    )
    tr.setup()
    seen, rollout, sync, syncs = {}, tr.rollout, tr.sync_weights, []

    def hooked_rollout(it):
        if before_rollout:
            before_rollout(it)
        trajs, rt = rollout(it)
        seen[it] = trajs
        return trajs, rt

    def hooked_sync():  # once per iteration, after its update
        if before_sync:
            before_sync(len(syncs))
        syncs.append(1)
        sync()

    tr.rollout, tr.sync_weights = hooked_rollout, hooked_sync
    try:
        out = tr.train()
    except Exception as e:  # the caller checks it
        out = e
    finally:
        tr.cleanup()
    return tr, seen, out


@pytest.mark.timeout(900)
def test_engine_killed_mid_rollout_is_restarted_and_the_run_is_unchanged(tmp_path, sft_model, engine, monkeypatch):
    """GRPO, the engine core SIGKILLed while iteration 1 generates (before the fix the trainer then hung
    with no error): the backend restarts the engine, loads the current weights and reruns the
    batch with the same seeds, so every iteration's trajectories equal an undisturbed run's, token
    for token, and the update after it is the same."""
    engine.max_restarts = engine.restarts + 1
    _, ref, ref_last = _grpo_run(tmp_path, sft_model, engine, monkeypatch, "undisturbed", iterations=3)
    killed = []

    def kill_core(it):
        if it == 1:
            killed.append(_kill_mid_call(_engine_process(engine, "VLLM::EngineCore"), delay_s=1.0))

    restarts = engine.restarts
    _, got, last = _grpo_run(tmp_path, sft_model, engine, monkeypatch, "killed", before_rollout=kill_core, iterations=3)
    assert not isinstance(last, Exception), f"the run failed: {last!r}"
    assert killed and engine.restarts == restarts + 1
    death = engine.deaths[-1]
    assert death.during == "generate" and f"VLLM::EngineCore (pid {killed[0].pid}) was killed by SIGKILL" in death.cause
    assert _engine_process(engine, "VLLM::EngineCore").pid != killed[0].pid  # a new engine core serves
    assert any(any(t.episode.step_rewards) for t in ref[1]), "no reward in iteration 1: the comparison would be weak"
    for it in (0, 1, 2):
        assert [(t.episode.token_ids, t.episode.loss_mask, t.group) for t in got[it]] == [
            (t.episode.token_ids, t.episode.loss_mask, t.group) for t in ref[it]
        ], f"iteration {it} differs"
        for a, b in zip(got[it], ref[it]):
            assert a.sampler_logprobs == pytest.approx(b.sampler_logprobs, abs=1e-5)
    assert last["policy/loss"] == pytest.approx(ref_last["policy/loss"], abs=1e-6)
    # The restart is in the run's metrics, in the row of the iteration it happened in (per iteration,
    # as rollout/worker_restarts), and only there.
    assert _column(tmp_path / "killed", "rollout/engine_restarts") == [0.0, 1.0, 0.0]
    assert _column(tmp_path / "undisturbed", "rollout/engine_restarts") == [0.0, 0.0, 0.0]


def _column(run_dir, key):
    """``key`` of every row of the run's metrics.jsonl (None where a row lacks it)."""
    return [json.loads(line).get(key) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# Last in the module: the engine stays dead.
@pytest.mark.timeout(600)
def test_engine_death_beyond_max_restarts_raises_a_clear_error_and_keeps_the_checkpoint(
    tmp_path, sft_model, engine, monkeypatch
):
    """No restart left: the engine's worker SIGKILLed during iteration 1's weight sync ends the run
    with EngineDiedError (before 2026-11-25 a dead engine hung the call for good), naming the process,
    the signal and what to do; iteration 0's checkpoint is intact and no engine process is left."""
    from trainers.backends import EngineDiedError, process_guard
    from trainers.checkpoint import latest_checkpoint, load_checkpoint

    engine.max_restarts = engine.restarts
    killed = []

    def kill_worker(it):
        if it == 1:
            killed.append(_kill_mid_call(_engine_process(engine, "VLLM::Worker"), delay_s=1.0))

    tr, _, err = _grpo_run(tmp_path, sft_model, engine, monkeypatch, "dies", before_sync=kill_worker, iterations=3)
    assert isinstance(err, EngineDiedError), f"expected EngineDiedError, got {err!r}"
    msg = str(err)
    # "was killed by SIGKILL" when the backend saw the zombie, "is gone" when the engine core had
    # reaped it first (a reaped process's status is lost): both name the process.
    assert f"VLLM::Worker (pid {killed[0].pid})" in msg and "load_weights" in msg
    assert "--resume" in msg and "max_restarts" in msg and str(engine.model_path) in msg
    ckpt = latest_checkpoint(tr.run_dir)
    assert ckpt is not None and load_checkpoint(ckpt)["iteration"] == 0
    with pytest.raises(EngineDiedError, match="died earlier"):  # no silent second try on a dead engine
        engine.generate([[5, 6, 7]], tr.sampling)
    assert not process_guard.marked_pids(engine._token), "processes of the dead engine are left"
