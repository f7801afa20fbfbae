"""Ray rollout workers (trainers/ray_rollout.py) on a local Ray cluster, with an untrained tiny
model (no SFT fixture: only equality with the in-process run matters here, not learning)."""

import os
import signal
import time

import psutil
import pytest
import torch

from tests.trainers.conftest import COMPACT_ENV, tiny_rl_config
from trainers.config import ConfigError
from trainers.rollout import collect
from trainers.trainer import Trainer, make_vector_env


def _cfg(run_dir, **kw):
    # 4 tasks x 2 rollouts, at most 2 turns of 12 tokens: the smallest batch with 2 groups per worker.
    base = dict(iterations=2, max_turn_tokens=12, eval_tasks=2, log_trajectories=1, checkpoint_every=100,
                env_kwargs={**COMPACT_ENV, "max_turns": 2})
    base.update(kw)
    return tiny_rl_config(run_dir, "grpo", None, **base)


def _key(trajs):
    """What must be identical between two rollouts: tokens, masks, rewards, groups, tasks."""
    return [(t.episode.token_ids, t.episode.loss_mask, t.episode.step_rewards, t.group, t.episode.task_index) for t in trajs]


def _record_rollouts(tr, on_iteration=None):
    seen = {}
    orig = tr.rollout

    def rollout(it):
        if on_iteration is not None:
            on_iteration(it)
        trajs, rt = orig(it)
        seen[it] = trajs
        return trajs, rt

    tr.rollout = rollout
    return seen


def test_rollout_worker_keys_are_checked(tmp_path):
    with pytest.raises(ConfigError, match="rollout_workers=3 must divide tasks_per_iter=4"):
        _cfg(tmp_path, rollout_workers=3)
    with pytest.raises(ConfigError, match="rollout_workers must be >= 0"):
        _cfg(tmp_path, rollout_workers=-1)
    with pytest.raises(ConfigError, match="rollout_timeout_s must be positive"):
        _cfg(tmp_path, rollout_workers=2, rollout_timeout_s=0)


@pytest.mark.timeout(300)
def test_slices_with_offsets_are_the_in_process_batch(tmp_path):
    """The seam the workers use, without Ray: two half-size vector envs, each collecting its
    slice with its offset, give the one full-size collect's trajectories."""
    tr = Trainer(_cfg(tmp_path))
    tr.setup()
    try:
        tasks, seed = tr.task_indices(0), 1234
        full, _ = collect(tr.envs, tr.backend, tasks, 2, tr.sampling, seed)
        half = make_vector_env(tr.cfg.env_id, 4, {"tokenizer": tr.tokenizer, **tr.cfg.env_kwargs,
                                                  "vocab_size": tr.policy.get_input_embeddings().num_embeddings})
        parts = []
        for w in range(2):
            part, _ = collect(half, tr.backend, tasks[2 * w: 2 * w + 2], 2, tr.sampling, seed, offset=4 * w)
            parts += part
        half.close()
        assert _key(parts) == _key(full)
        assert len({tuple(k[0]) for k in _key(full)}) > 1  # the rows differ: a real sample, not one repeated row
        with pytest.raises(ValueError, match="multiple of group_size"):
            collect(half, tr.backend, tasks[:2], 2, tr.sampling, seed, offset=3)
    finally:
        tr.cleanup()


def _alive(pids):
    out = []
    for p in pids:
        try:
            if psutil.Process(p).status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.mark.timeout(600)
def test_two_ray_workers_match_in_process_survive_a_kill_and_shut_down(tmp_path):
    """One Ray cluster start for three checks (Ray's start-up is most of the cost):
    - determinism: 2 iterations (a GRPO update and a weight push between them) with 2 workers give
      the in-process run's trajectories and losses;
    - a worker killed (SIGKILL of its process) before iteration 1 is restarted and its slice
      retried: the batch is still the in-process one, nothing lost or duplicated, and
      rollout/worker_restarts says 1;
    - cleanup (the pool started Ray, so it calls ray.shutdown) leaves no Ray process behind."""
    import ray

    ref = Trainer(_cfg(tmp_path / "inproc"))
    ref.setup()
    ref_rollouts = _record_rollouts(ref)
    ref_last = ref.train()
    ref.cleanup()

    was_running = ray.is_initialized()
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    t0 = time.perf_counter()
    tr = Trainer(_cfg(tmp_path / "ray", rollout_workers=2, rollout_timeout_s=240))
    tr.setup()
    start_s = time.perf_counter() - t0
    try:
        assert tr.workers.started_ray == (not was_running)
        first_pids = tr.workers.pids()
        assert len(set(first_pids)) == 2 and os.getpid() not in first_pids

        def kill_worker_0(it):
            if it == 1:
                os.kill(first_pids[0], signal.SIGKILL)
                psutil.Process(first_pids[0]).wait(timeout=30)

        seen = _record_rollouts(tr, kill_worker_0)
        ray_procs = {p.pid for p in psutil.Process().children(recursive=True)} - before
        last = tr.train()
        new_pids = tr.workers.pids()
        ray_procs |= {p.pid for p in psutil.Process().children(recursive=True)} - before
        names = " ".join(" ".join(psutil.Process(p).cmdline()) for p in _alive(ray_procs))
    finally:
        t1 = time.perf_counter()
        tr.cleanup()
        shutdown_s = time.perf_counter() - t1
    print(f"ray pool start {start_s:.1f} s, shutdown {shutdown_s:.1f} s")

    for it in (0, 1):
        assert len(seen[it]) == len(ref_rollouts[it]) == 8
        assert _key(seen[it]) == _key(ref_rollouts[it]), f"iteration {it}: the Ray batch differs from the in-process one"
        for a, b in zip(seen[it], ref_rollouts[it]):
            assert torch.allclose(torch.tensor(a.sampler_logprobs), torch.tensor(b.sampler_logprobs), atol=1e-4)
    for k in ("policy/loss", "rollout/reward_mean", "rollout/length_mean"):
        assert last[k] == pytest.approx(ref_last[k], abs=1e-5), k
    import json

    recs = [json.loads(x) for x in (tmp_path / "ray" / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout/worker_restarts"] for r in recs] == [0.0, 1.0]
    assert new_pids[0] != first_pids[0] and new_pids[1] == first_pids[1]

    # Nothing survives: the workers (killed and restarted ones), and when the pool started Ray,
    # the raylet, the GCS server and every other process Ray started.
    assert set(first_pids) | set(new_pids) <= ray_procs | set(first_pids)
    watch = (ray_procs if not was_running else set(new_pids)) | set(first_pids)
    deadline = time.monotonic() + 60
    while _alive(watch) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = [(p, " ".join(psutil.Process(p).cmdline())[:120]) for p in _alive(watch)]
    assert not left, f"processes left after shutdown: {left}"
    if not was_running:  # the watched set did hold the cluster's own processes
        assert "raylet" in names and "gcs_server" in names, names[:500]
        assert not ray.is_initialized()
