"""Ray rollout workers (trainers/ray_rollout.py) on a local Ray cluster, with an untrained tiny
model (no SFT fixture: only equality with the in-process run matters here, not learning)."""

import dataclasses
import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest
import torch

from tests.trainers.conftest import COMPACT_ENV, tiny_rl_config
from trainers.compose import build_trainer, check
from trainers.config import ConfigError
from trainers.rollout import collect
from trainers.sources import make_vector_env


def _cfg(run_dir, **kw):
    # 4 tasks x 2 rollouts, at most 2 turns of 12 tokens: the smallest batch with 2 groups per worker.
    base = dict(
        iterations=2,
        max_turn_tokens=12,
        eval_tasks=2,
        log_trajectories=1,
        checkpoint_every=100,
        env_kwargs={**COMPACT_ENV, "max_turns": 2},
    )
    base.update(kw)
    return tiny_rl_config(run_dir, "grpo", None, **base)


def _key(trajs):
    """What must be identical between two rollouts: tokens, masks, rewards, groups, tasks."""
    return [
        (t.episode.token_ids, t.episode.loss_mask, t.episode.step_rewards, t.group, t.episode.task_index) for t in trajs
    ]


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
    with pytest.raises(ConfigError, match="rollout.workers=3 must divide tasks_per_iter=4"):
        check(_cfg(tmp_path, rollout_workers=3))
    with pytest.raises(ConfigError, match="rollout.workers must be >= 0"):
        _cfg(tmp_path, rollout_workers=-1)
    with pytest.raises(ConfigError, match="rollout.timeout_s must be positive"):
        _cfg(tmp_path, rollout_workers=2, rollout_timeout_s=0)


@pytest.mark.timeout(180)
def test_workers_that_do_not_start_in_time_give_a_clear_error_and_stop_ray(tmp_path):
    """The pool starts a local cluster, its workers cannot start within 1 ms: the error names the
    timeout and the cluster's resources (it once raised Ray's "Ray has not been started yet"
    instead, asked after the shutdown), and the cluster it started is stopped. In a fresh process:
    the pool must start its own cluster, whatever Ray session an earlier test of this worker left."""
    import subprocess
    import sys

    code = f"""
import re, ray
from tests.trainers.test_ray_rollout import _cfg
from trainers.ray_rollout import RolloutWorkerError, RolloutWorkerPool
cfg = _cfg({str(tmp_path)!r}, rollout_workers=2, rollout_timeout_s=0.001)
try:
    RolloutWorkerPool(cfg, {{}}, None)  # no weights are pushed: the workers never start
except RolloutWorkerError as e:
    assert re.search(r"did not start within rollout_timeout_s=0.001 s.*ray.cluster_resources\\(\\): \\{{.*'CPU'", str(e),
                     re.S), e
    print("refused; ray running after:", ray.is_initialized())
"""
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=170,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "refused; ray running after: False" in out.stdout, out.stdout + out.stderr


def test_a_local_cluster_gives_workers_every_gpu_but_the_learners():
    from trainers.ray_rollout import RolloutWorkerError, worker_gpus

    assert worker_gpus("cuda", ["0", "1", "2", "3"]) == ["1", "2", "3"]
    assert worker_gpus("cuda:2", ["4", "5", "6"]) == ["4", "5"]  # cuda:2 is the third visible device
    assert worker_gpus("cuda:0", ["0"]) == []
    with pytest.raises(RolloutWorkerError, match=r"device='cuda:3': this process sees 2 GPU\(s\)"):
        worker_gpus("cuda:3", ["0", "1"])


def _check_slices(tr):
    """The seam the workers use, without Ray: two half-size vector envs, each collecting its
    slice with its offset, give the one full-size collect's trajectories."""
    tasks, seed = tr.task_indices(0), 1234
    full, _ = collect(tr.source.envs, tr.backend, tasks, 2, tr.sampling, seed)
    half = make_vector_env(
        tr.cfg.rollout.env_id,
        4,
        {
            "tokenizer": tr.tokenizer,
            **tr.cfg.rollout.env_kwargs,
            "vocab_size": tr.policy.get_input_embeddings().num_embeddings,
        },
    )
    parts = []
    for w in range(2):
        part, _ = collect(half, tr.backend, tasks[2 * w : 2 * w + 2], 2, tr.sampling, seed, offset=4 * w)
        parts += part
    assert _key(parts) == _key(full)
    assert len({tuple(k[0]) for k in _key(full)}) > 1  # the rows differ: a real sample, not one repeated row
    with pytest.raises(ValueError, match="multiple of group_size"):
        collect(half, tr.backend, tasks[:2], 2, tr.sampling, seed, offset=3)
    half.close()


def _alive(pids):
    out = []
    for p in pids:
        try:
            if psutil.Process(p).status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def _cpu_s(pid):
    try:
        return sum(psutil.Process(pid).cpu_times()[:2])
    except psutil.NoSuchProcess:
        return 0.0


def _marked(token):
    """Live processes (not this one) whose environment carries ``token``: everything the Ray
    cluster started, since the GCS server and raylet inherit this process's environment and the
    workers the raylet's, including a worker spawned after any snapshot we could take."""
    out = {}
    for p in psutil.process_iter(["pid", "name"]):
        try:
            if p.pid != os.getpid() and p.status() != psutil.STATUS_ZOMBIE and p.environ().get(TOKEN_VAR) == token:
                out[p.pid] = " ".join(p.cmdline())[:100] or p.info["name"]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return out


TOKEN_VAR = "AGENT_GYM_RAY_TEST_TOKEN"
CORPUS = str(Path(__file__).resolve().parents[1] / "fixtures" / "qa" / "corpus.jsonl")
QUERIES = ["who directed The Glass Orchard", "film director born in Quillhaven"]


def _remote_search():
    """In a Ray worker process: a client of the shared retriever, as a rollout worker's env is."""
    from agent_gym.retrievers import make_retriever

    r = make_retriever("ray", inner="bm25", corpus=CORPUS, cache=False, name="test_retriever")
    return r.search(QUERIES, 2), r.actor()._actor_id.hex(), os.getpid()


def _check_shared_retriever(ray):
    """The retriever actor (agent_gym/retrievers/ray_actor.py), on the pool's cluster: clients in
    two processes share one actor and get the in-process BM25's answers, also after the actor's
    process is killed and restarted."""
    from agent_gym.retrievers import make_retriever

    t0 = time.perf_counter()
    direct = make_retriever("bm25", corpus=CORPUS, cache=False).search(QUERIES, 2)
    here = make_retriever("ray", inner="bm25", corpus=CORPUS, cache=False, name="test_retriever")
    assert here.search(QUERIES, 2) == direct
    assert direct[0][0].title == "The Glass Orchard"
    hits, actor_id, pid = ray.get(ray.remote(num_cpus=0)(_remote_search).remote(), timeout=240)
    assert hits == direct and actor_id == here.actor()._actor_id.hex() and pid != os.getpid()
    ray.kill(here.actor(), no_restart=False)  # its process dies; Ray restarts it, the next search waits
    assert here.search(QUERIES[:1], 2) == direct[:1]
    return time.perf_counter() - t0


@pytest.mark.timeout(600)
def test_two_ray_workers_match_in_process_survive_a_kill_and_shut_down(tmp_path, monkeypatch):
    """One Ray cluster start for all the Ray checks (its start-up is most of the cost):
    - the slicing seam in-process (``collect(offset=...)``, no Ray);
    - determinism: 2 iterations (a GRPO update and a weight push between them) with 2 workers give
      the in-process run's trajectories and losses;
    - a worker killed (SIGKILL of its process) while iteration 1's slices are in flight is
      restarted and its slice retried: the batch is still the in-process one, nothing lost or
      duplicated, and rollout/worker_restarts says 1;
    - the shared retriever actor (kind ``ray``) serves clients in two processes;
    - a slice past rollout_timeout_s with no retries left stops the rollout with a clear error;
    - cleanup (the pool started Ray, so it calls ray.shutdown) leaves no Ray process behind."""
    import ray

    from trainers.ray_rollout import RolloutWorkerError

    ref = build_trainer(_cfg(tmp_path / "inproc"))
    ref.setup()
    _check_slices(ref)
    ref_rollouts = _record_rollouts(ref)
    ref_last = ref.train()
    ref.cleanup()

    was_running = ray.is_initialized()
    token = f"{os.getpid()}-{time.time_ns()}"
    monkeypatch.setenv(TOKEN_VAR, token)
    t0 = time.perf_counter()
    tr = build_trainer(_cfg(tmp_path / "ray", rollout_workers=2, rollout_timeout_s=240))
    tr.setup()
    start_s = time.perf_counter() - t0
    try:
        workers = tr.source.pool  # the RayRollout source's worker pool
        assert workers.started_ray == (not was_running)
        first_pids = workers.pids()
        assert len(set(first_pids)) == 2 and os.getpid() not in first_pids
        assert workers.engine_processes() == [{}, {}]  # HF backends: no engine process (vLLM's: test_vllm_trainer)

        real_wait, kills = ray.wait, []

        def wait_after_killing_worker_0(*a, **kw):
            # The pool's first ray.wait of iteration 1: both slices are submitted, none returned.
            if kills == [1]:
                os.kill(first_pids[0], signal.SIGKILL)
                deadline = time.monotonic() + 30
                while _alive([first_pids[0]]) and time.monotonic() < deadline:
                    time.sleep(0.1)
                kills.append("done")
            return real_wait(*a, **kw)

        monkeypatch.setattr(ray, "wait", wait_after_killing_worker_0)
        seen = _record_rollouts(tr, lambda it: kills.append(it) if it == 1 else None)
        t1 = time.perf_counter()
        last = tr.train()
        train_s = time.perf_counter() - t1
        new_pids = workers.pids()
        # The pool's restart of a live worker (its answer to EngineDiedError) returns only once the
        # old process is gone: the very next call reaches the new one. (With ray.kill, asynchronous,
        # a call right after it could still run in the old process: a CI run saw it.)
        workers._restart_live_worker(1)
        assert not _alive([new_pids[1]]), "the old process still runs: a call now could reach it"
        restarted = ray.get(workers.actors[1].pid.options(max_task_retries=-1).remote(), timeout=240)
        assert restarted != new_pids[1]
        ray.get(workers.actors[1].load_weights.remote(workers.weights_ref, workers.version), timeout=240)
        live_pids = [new_pids[0], restarted]
        retrieval_s = _check_shared_retriever(ray)
        cluster = _marked(token)
        cpu_s = sum(_cpu_s(p) for p in cluster)
        print(
            f"CPU seconds so far: this process {sum(psutil.Process().cpu_times()[:2]):.1f}, the Ray cluster's "
            f"live processes {cpu_s:.1f} (the killed worker's not counted)"
        )

        # A slice that outlives rollout_timeout_s: its worker is killed; with no retries left
        # the rollout stops naming the worker, instead of waiting forever. Worker 0 is hung for
        # real (SIGSTOP), so its slice cannot finish in time however fast this machine is (a
        # 0.05 s timeout alone did not fire on a faster machine: both slices came back in time).
        # Worker 0's slice is the oldest, so it is the one that times out first.
        workers.cfg = dataclasses.replace(
            workers.cfg, rollout=dataclasses.replace(workers.cfg.rollout, timeout_s=2.0, retries=0)
        )
        hung = workers.pids()[0]
        os.kill(hung, signal.SIGSTOP)
        try:
            with pytest.raises(
                RolloutWorkerError, match=r"rollout worker 0 timed out on its slice .* rollout_retries=0"
            ):
                tr.rollout(2)
        finally:
            if _alive([hung]):  # let it run, so Ray's kill and shutdown can end it
                os.kill(hung, signal.SIGCONT)
    finally:
        t1 = time.perf_counter()
        tr.cleanup()
        shutdown_s = time.perf_counter() - t1
    print(
        f"ray pool start {start_s:.1f} s, 2 iterations {train_s:.1f} s, shared retriever checks {retrieval_s:.1f} s, "
        f"shutdown {shutdown_s:.1f} s"
    )

    for it in (0, 1):
        assert len(seen[it]) == len(ref_rollouts[it]) == 8
        assert _key(seen[it]) == _key(ref_rollouts[it]), (
            f"iteration {it}: the Ray batch differs from the in-process one"
        )
        for a, b in zip(seen[it], ref_rollouts[it]):
            assert torch.allclose(torch.tensor(a.sampler_logprobs), torch.tensor(b.sampler_logprobs), atol=1e-4)
    for k in ("policy/loss", "rollout/reward_mean", "rollout/length_mean"):
        assert last[k] == pytest.approx(ref_last[k], abs=1e-5), k
    recs = [json.loads(x) for x in (tmp_path / "ray" / "metrics.jsonl").read_text().splitlines()]
    assert kills == [1, "done"]
    assert [r["rollout/worker_restarts"] for r in recs] == [0.0, 1.0]
    print("iteration seconds (the second includes the restart):", [round(r["time/iteration_s"], 1) for r in recs])
    assert new_pids[0] != first_pids[0] and new_pids[1] == first_pids[1]

    # Nothing survives: the workers (killed and restarted ones) and, when the pool started Ray,
    # the raylet, the GCS server and every other process of the cluster.
    if was_running:  # another test's cluster: only our actors must be gone
        watch = lambda: {p: "" for p in _alive(set(first_pids) | set(new_pids) | set(live_pids))}  # noqa: E731
    else:
        assert set(live_pids) <= set(cluster), cluster
        names = " ".join(cluster.values())
        assert "raylet" in names and "gcs_server" in names, names[:500]
        watch = lambda: _marked(token)  # noqa: E731
    deadline = time.monotonic() + 60
    while watch() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not watch(), f"processes left after shutdown: {watch()}"
    assert ray.is_initialized() == was_running
