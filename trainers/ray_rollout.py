"""Ray rollout workers: ``rollout.workers: N`` spreads each iteration's rollout over N Ray actors.

The learner (the ``Trainer`` process) keeps the optimizer, scoring and the update; each
``RolloutWorker`` actor holds its own ``ToolVectorEnv`` of ``batch_size / N`` sub-envs and its own
generation backend with a copy of the policy. One iteration:

1. the learner splits the iteration's task indices into N equal contiguous slices (task order is
   the batch order) and sends worker ``w`` its slice with ``offset = w * slice * group_size``,
   the global index of its first sub-env;
2. each worker runs ``trainers.rollout.collect(..., offset=offset)``: its sub-env ``i`` is reset,
   sampled and grouped exactly as sub-env ``offset + i`` of the in-process vector env, so the
   concatenated slices are the in-process batch (token ids, loss masks, groups; the HF backend's
   per-request seeds make a row's samples independent of its batch neighbours, up to float
   rounding of the logits, ~1e-6);
3. the learner gathers the ``Trajectory`` objects (the env's token-exact ``Episode`` plus the
   sampler's log-probs), scores and updates as before;
4. after the update, ``load_weights`` puts the state dict into the object store once
   (``ray.put``) and hands every worker the same object ref, tagged with a version number.

Failures: a worker whose process dies (a crash, ``os.kill``, ``ray.kill``) is restarted by Ray
(``max_restarts=-1``; its constructor rebuilds env and model) and its slice is retried after the
current weights are sent again; a slice that runs past ``rollout.timeout_s`` gets its worker
killed and restarted the same way. A slice is a pure function of (weights, tasks, seed, offset),
so the retry returns the same trajectories: nothing is lost or counted twice. A restarted worker
that receives a slice before the weights (a race with the restart) refuses it, since its weights
are stale: every ``collect`` names the weights version it needs. Each slice is retried at most
``rollout.retries`` times per iteration, then the run stops with ``RolloutWorkerError``. The
restarts of an iteration are logged as ``rollout/worker_restarts``.

A worker's vLLM engine that dies (killed, out of memory, crashed) is first restarted by the worker's
own ``VLLMBackend`` (``rollout.vllm_kwargs: {max_restarts: N}``, default 1), which reloads the current
weights and reruns the call, all inside the worker; a death beyond that raises ``EngineDiedError``
in the worker, and the pool then restarts the worker (a fresh engine) and retries its slice as for a
dead worker, within the same ``rollout.retries``.

vLLM (``rollout.backend: vllm``): one engine per worker, not one engine actor shared by all workers.
Generation is the part of a rollout that needs a GPU and scales with GPUs; an engine per worker
(``rollout.worker_gpus: 1``) adds generation throughput with each worker, keeps a worker's slice
independent of the others' progress (a shared engine would serialize every worker's turns through
one queue and become the bottleneck the workers exist to remove), and confines a crash to one
worker: its restart rebuilds one engine while the others keep their caches. A shared engine pays
off only when env steps, not generation, dominate and one GPU is all there is; then run
``rollout.workers: 0`` with ``rollout.num_envs_threads`` instead. With workers, the learner's own backend
serves only the greedy evaluation and is always the HF backend on the learner's policy (no second
engine on the learner's device). A vLLM worker keeps its HF copy of the policy on the CPU (it only
seeds the engine) and leaves its GPU to the engine. Tested on vLLM's CPU build (which has Ray core
in its venv): tests/trainers/test_vllm_trainer.py.

Shutdown: ``shutdown()`` asks every worker to close its backend (a vLLM engine ends its processes
and waits for them; at most ``_CLOSE_TIMEOUT_S``), kills the actors and, when this pool started
the local Ray cluster, calls ``ray.shutdown()``, which ends the raylet, the GCS server and every
worker process.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from trainers import plugins
from trainers.backends import process_guard
from trainers.backends.base import EngineDiedError, SamplingConfig
from trainers.config import TrainConfig, from_dict, to_dict
from trainers.models import load_policy, load_tokenizer_for
from trainers.rollout import RolloutTimes, Trajectory, collect
from trainers.scale import inference_state_dict
from trainers.sources import LocalRollout, make_backend


class RolloutWorkerError(RuntimeError):
    """A rollout worker failed more often than ``rollout.retries`` allows, or could not start."""


def _ray():
    try:
        import ray
    except ImportError as e:  # pragma: no cover - ray is in the scale extra
        raise ImportError("rollout_workers > 0 needs Ray: pip install -e '.[scale]' (or set rollout_workers: 0). "
                          f"Import error: {e}") from e
    return ray


class RolloutWorker:
    """One Ray actor: a ``ToolVectorEnv`` slice, a policy copy and its backend (the class is made
    remote by ``RolloutWorkerPool``, so importing this module does not need Ray)."""

    def __init__(self, cfg_dict: dict[str, Any], worker_index: int, num_envs: int, use_gpu: bool, env_factory: Any):
        # With vLLM the engine takes the worker's GPU; the HF copy only seeds the engine, on the CPU.
        plugins.load(cfg_dict.get("plugins") or [])  # the learner's plugins, before its config is rebuilt here
        device = "cuda" if use_gpu and cfg_dict["rollout"]["backend"] == "hf" else "cpu"
        cfg = from_dict({**cfg_dict, "rollout": {**cfg_dict["rollout"], "workers": 0},
                         "model": {**cfg_dict["model"], "device": device}})
        torch.set_num_threads(cfg.model.torch_threads or 1)
        self.cfg = cfg
        self.tokenizer = load_tokenizer_for(cfg.model)
        policy = load_policy(cfg.model, self.tokenizer, seed=cfg.run.seed).eval()
        self.envs = env_factory.make_vector(num_envs)  # the learner's EnvFactory (env_server: sessions there)
        run_dir = Path(cfg.run.run_dir) / f"rollout_worker_{worker_index}"
        self.backend = make_backend(cfg.rollout, policy, self.tokenizer, run_dir, device=cfg.model.device, seed=cfg.run.seed)
        self.policy = policy if cfg.rollout.backend == "hf" else None  # the HF backend samples from this module
        self.version = -1  # no weights from the learner yet

    def pid(self) -> int:
        return os.getpid()

    def engine_processes(self) -> dict[int, str]:
        """This worker's vLLM engine processes, pid -> role (empty with the HF backend)."""
        get = getattr(self.backend, "engine_processes", None)
        return get() if get is not None else {}

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> int:
        self.backend.load_weights(state_dict)
        self.version = version
        return version

    def collect(self, task_indices: list[int], group_size: int, sampling: SamplingConfig, seed: int, offset: int,
                version: int, reset_options: dict[str, Any] | None = None) -> tuple[list[Trajectory], RolloutTimes] | None:
        """The slice's trajectories, or None when this worker does not hold weights ``version``
        (it was restarted and has not been sent them yet)."""
        if version != self.version:
            return None
        return collect(self.envs, self.backend, task_indices, group_size, sampling, seed=seed, offset=offset,
                       reset_options=reset_options)

    def close(self) -> None:
        self.backend.close()
        self.envs.close()

    def exit_for_restart(self) -> None:
        """End this process so that Ray restarts the actor (a fresh env and engine): the pool's
        answer to ``EngineDiedError``. A crash, not ``ray.actor.exit_actor()``, which would not
        restart it. The backend and envs are closed first, best effort (the engine is dead)."""
        try:
            self.close()
        finally:
            os._exit(1)


_CLOSE_TIMEOUT_S = 60.0
"""How long ``RolloutWorkerPool.shutdown`` waits for the workers to close their backends before killing them."""


class RolloutWorkerPool:
    """N ``RolloutWorker`` actors and the learner's side of the protocol (see the module docstring)."""

    def __init__(self, cfg: TrainConfig, state_dict: dict[str, torch.Tensor], env_factory: Any):
        ray = _ray()
        self.cfg = cfg
        self.n = cfg.rollout.workers
        self.tasks_per_worker = cfg.rollout.tasks_per_iter // self.n
        self.started_ray = False
        if not ray.is_initialized():
            self._init_ray(ray)
        self._check_resources(ray)
        remote_cls = ray.remote(RolloutWorker)
        cfg_dict = to_dict(cfg)
        self.actors = [remote_cls.options(num_cpus=cfg.rollout.worker_cpus, num_gpus=cfg.rollout.worker_gpus,
                                          max_restarts=-1, max_task_retries=0)
                       .remote(cfg_dict, w, self.tasks_per_worker * cfg.rollout.group_size, cfg.rollout.worker_gpus > 0,
                               env_factory)
                       for w in range(self.n)]
        try:
            ray.get([a.pid.remote() for a in self.actors], timeout=cfg.rollout.timeout_s)
        except ray.exceptions.GetTimeoutError as e:
            resources = ray.cluster_resources()  # before shutdown: afterwards Ray cannot be asked
            self.shutdown(graceful=False)  # workers still starting (or never): nothing to close
            raise RolloutWorkerError(
                f"{self.n} rollout workers did not start within rollout_timeout_s={cfg.rollout.timeout_s} s; the "
                f"cluster may lack {cfg.rollout.worker_cpus} CPU / {cfg.rollout.worker_gpus} GPU per worker "
                f"(ray.cluster_resources(): {resources}), or the machine is too busy for them to start in time. "
                "Lower rollout_worker_cpus/gpus, add nodes or raise rollout_timeout_s.") from e
        except Exception:  # a constructor that failed (bad model path, env error): no cluster left behind
            self.shutdown(graceful=False)
            raise
        self.version = 0
        self._reset_options: dict[str, Any] | None = None
        self.weights_ref = None
        self.restarts = 0
        self.load_weights(state_dict)

    # -- Ray cluster ---------------------------------------------------------------------------

    def _init_ray(self, ray: Any) -> None:
        cfg = self.cfg
        if cfg.rollout.ray_address is not None:
            ray.init(address=cfg.rollout.ray_address)
            return
        # A local cluster started for these workers: enough logical CPUs for all of them (they
        # are scheduling tokens, not cores), no dashboard, and the workers import the same
        # trainers/agent_gym as this process (a worktree or checkout, not another install).
        # With GPU workers and a learner on a GPU, the cluster sees every GPU but the learner's, so
        # Ray never hands a worker the learner's device (Ray assigns GPUs from the
        # CUDA_VISIBLE_DEVICES it started with).
        root = str(Path(__file__).resolve().parent.parent)
        env = {"PYTHONPATH": root + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")}
        if cfg.rollout.worker_gpus > 0 and cfg.model.device.startswith("cuda"):
            env["CUDA_VISIBLE_DEVICES"] = ",".join(worker_gpus(cfg.model.device, _visible_gpus()))
        with process_guard.environ(env):
            ray.init(num_cpus=max(os.cpu_count() or 1, int(-(-self.n * cfg.rollout.worker_cpus // 1))),
                     include_dashboard=False)
        self.started_ray = True

    def _check_resources(self, ray: Any) -> None:
        have = ray.cluster_resources()
        cfg = self.cfg
        for key, per in (("CPU", cfg.rollout.worker_cpus), ("GPU", cfg.rollout.worker_gpus)):
            if per > 0 and have.get(key, 0.0) < per * self.n:
                msg = (f"rollout_workers={self.n} x rollout_worker_{key.lower()}s={per} needs {per * self.n:g} {key}, "
                       f"the Ray cluster has {have.get(key, 0.0):g}"
                       + (" (a local cluster leaves out the learner's GPU)" if key == "GPU" and self.started_ray
                          and cfg.model.device.startswith("cuda") else "")
                       + f". Lower rollout_worker_{key.lower()}s or rollout_workers, or join a larger cluster (ray_address).")
                if self.started_ray:
                    ray.shutdown()
                raise RolloutWorkerError(msg)

    # -- the protocol --------------------------------------------------------------------------

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Put the weights into the object store once; every worker loads the same object."""
        ray = _ray()
        self.version += 1
        self.weights_ref = ray.put({k: v.detach().to("cpu") for k, v in state_dict.items()})
        # max_task_retries=-1: a worker that died since the last rollout gets them once restarted.
        refs = [a.load_weights.options(max_task_retries=-1).remote(self.weights_ref, self.version) for a in self.actors]
        deadline = time.monotonic() + self.cfg.rollout.timeout_s
        for w, ref in enumerate(refs):
            try:
                ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
            except EngineDiedError:  # its engine died and its backend could not restart it: a new worker starts one
                self.restarts += 1
                self._restart_live_worker(w)
                ray.get(self.actors[w].load_weights.options(max_task_retries=-1).remote(self.weights_ref, self.version),
                        timeout=self.cfg.rollout.timeout_s)

    def collect(self, task_indices: Sequence[int], group_size: int, sampling: SamplingConfig,
                seed: int, reset_options: dict[str, Any] | None = None) -> tuple[list[Trajectory], RolloutTimes]:
        """The iteration's batch: worker w's slice is tasks ``[w*k, (w+1)*k)`` (k = tasks per
        worker), returned in slice order, so the batch order is the in-process order."""
        ray = _ray()
        k = self.tasks_per_worker
        if len(task_indices) != k * self.n:
            raise ValueError(f"got {len(task_indices)} tasks for {self.n} workers x {k} tasks each")
        self._reset_options = reset_options  # the same for every slice and every retry of one
        slices = [list(task_indices[w * k:(w + 1) * k]) for w in range(self.n)]
        args = [(slices[w], group_size, sampling, seed, w * k * group_size) for w in range(self.n)]
        results: dict[int, tuple[list[Trajectory], RolloutTimes]] = {}
        attempts = [0] * self.n
        pending = {self.actors[w].collect.remote(*args[w], self.version, self._reset_options): (w, time.monotonic())
                   for w in range(self.n)}
        self.restarts = 0
        while pending:
            oldest = min(t for _, t in pending.values())
            wait_s = max(0.0, oldest + self.cfg.rollout.timeout_s - time.monotonic())
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=wait_s)
            if not ready:  # the oldest slice ran out of time: restart its worker, then retry
                ref = min(pending, key=lambda r: pending[r][1])
                w, _ = pending.pop(ref)
                ray.kill(self.actors[w], no_restart=False)
                pending[self._retry(w, attempts, args, "timed out")] = (w, time.monotonic())
                continue
            ref = ready[0]
            w, _ = pending.pop(ref)
            try:
                out = ray.get(ref)
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as e:
                pending[self._retry(w, attempts, args, f"died ({type(e).__name__})")] = (w, time.monotonic())
                continue
            except EngineDiedError:  # its vLLM engine died beyond what its backend restarts: restart the worker
                self._restart_live_worker(w)
                pending[self._retry(w, attempts, args, "lost its vLLM engine (EngineDiedError, above)")] = (w, time.monotonic())
                continue
            if out is None:  # restarted before the weights reached it
                pending[self._retry(w, attempts, args, "was restarted")] = (w, time.monotonic())
                continue
            results[w] = out
        trajs = [t for w in range(self.n) for t in results[w][0]]
        times = [results[w][1] for w in range(self.n)]
        # The workers run in parallel: the slowest one bounds the rollout's wall time.
        return trajs, RolloutTimes(generate_s=max(t.generate_s for t in times), env_s=max(t.env_s for t in times),
                                   generated_tokens=sum(t.generated_tokens for t in times))

    def _restart_live_worker(self, w: int) -> None:
        """Restart worker w, which is alive and idle (it has just answered with ``EngineDiedError``),
        and return once its old process is gone, so that the next call reaches the new one.

        Not ``ray.kill``: it is asynchronous, and a call sent right after it can still run in the
        old process (a CI run saw the weights sent after the kill reach the worker whose engine had
        died and fail with ``EngineDiedError`` again). The worker ends its own process instead; an
        actor runs one caller's calls in order, and this call's answer (the actor died) arrives
        only after the process is gone. A worker that does not end within ``rollout.timeout_s``
        is killed."""
        ray = _ray()
        try:
            ray.get(self.actors[w].exit_for_restart.options(max_task_retries=0).remote(),
                    timeout=self.cfg.rollout.timeout_s)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
            return  # the process ended, as asked
        except ray.exceptions.GetTimeoutError:
            ray.kill(self.actors[w], no_restart=False)
            return
        raise RolloutWorkerError(f"rollout worker {w} did not end when asked to restart")  # pragma: no cover

    def _retry(self, w: int, attempts: list[int], args: list[tuple], why: str) -> Any:
        """Count a restart, wait for worker w to be up again with the current weights, resubmit."""
        ray = _ray()
        attempts[w] += 1
        self.restarts += 1
        if attempts[w] > self.cfg.rollout.retries:
            raise RolloutWorkerError(f"rollout worker {w} {why} on its slice (tasks {args[w][0]}) {attempts[w]} times; "
                                     f"rollout_retries={self.cfg.rollout.retries}. See the worker's log above "
                                     "(Ray prints it to this process), raise rollout_timeout_s if it is only slow.")
        # max_task_retries=-1: this call waits through the restart instead of failing on it.
        ray.get(self.actors[w].load_weights.options(max_task_retries=-1).remote(self.weights_ref, self.version),
                timeout=self.cfg.rollout.timeout_s)
        return self.actors[w].collect.remote(*args[w], self.version, self._reset_options)

    def metrics(self) -> dict[str, float]:
        """``rollout/worker_restarts``: worker restarts (deaths, timeouts, engines lost) noticed during
        the last collect and the weight sync after it (a worker that died and came back between two
        rollouts got the weights on its restart and is not counted)."""
        return {"rollout/worker_restarts": float(self.restarts)}

    def _on_every_worker(self, method: str) -> list[Any]:
        """Each worker's answer to the no-argument actor method ``method``, in worker order."""
        ray = _ray()
        return ray.get([getattr(a, method).remote() for a in self.actors], timeout=self.cfg.rollout.timeout_s)

    def pids(self) -> list[int]:
        return self._on_every_worker("pid")

    def engine_processes(self) -> list[dict[int, str]]:
        """Each worker's vLLM engine processes, pid -> role (``VLLM::EngineCore``, ``VLLM::Worker``)."""
        return self._on_every_worker("engine_processes")

    def shutdown(self, graceful: bool = True) -> None:
        """Kill the actors (``graceful``: after each closed its backend); stop Ray when this pool
        started it. Idempotent."""
        ray = _ray()
        if not ray.is_initialized():
            return
        actors = getattr(self, "actors", [])
        # Each worker closes its backend first (a vLLM engine shuts down its processes and waits
        # for them); a kill alone leaves that to the engine's watchdog, seconds later.
        closing = [a.close.remote() for a in actors] if graceful else []
        if closing:
            ray.wait(closing, num_returns=len(closing), timeout=_CLOSE_TIMEOUT_S)
        for a in actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # already dead
                pass
        self.actors = []
        if self.started_ray:
            ray.shutdown()
            self.started_ray = False


def worker_gpus(learner_device: str, visible: list[str]) -> list[str]:
    """The GPUs a local cluster may give to rollout workers: the visible ones (``visible``: the
    CUDA_VISIBLE_DEVICES entries, or ``0..n-1``) but the learner's (``cuda`` = ``cuda:0``, the
    first visible one)."""
    idx = int(learner_device.split(":", 1)[1]) if ":" in learner_device else 0
    if not 0 <= idx < len(visible):
        raise RolloutWorkerError(f"device={learner_device!r}: this process sees {len(visible)} GPU(s) ({visible})")
    return visible[:idx] + visible[idx + 1:]


def _visible_gpus() -> list[str]:
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [x.strip() for x in env.split(",") if x.strip()]
    return [str(i) for i in range(torch.cuda.device_count())]


def start_rollout_workers(cfg: TrainConfig, policy: torch.nn.Module, env_factory: Any) -> RolloutWorkerPool:
    """``env_factory``: the learner's ``agent_gym.factory.EnvFactory``, sent (pickled) to every worker;
    the weights go under plain HF names (merged under LoRA), as the workers load them."""
    return RolloutWorkerPool(cfg, inference_state_dict(policy), env_factory)


class RayRollout:
    """The rollout source of ``rollout.workers: N`` (``trainers.sources.RolloutSource``): ``collect``
    spreads the iteration over the pool's workers; the learner keeps a ``LocalRollout`` for the
    greedy evaluation (and the task count), generated by its own HF backend."""

    learner_backend: str | None = "hf"  # the workers sample; the learner's backend only evaluates

    def __init__(self, cfg: TrainConfig, *, env_factory: Any, policy: torch.nn.Module, backend: Any, parallel: Any):
        self.local = LocalRollout(cfg, env_factory=env_factory, policy=policy, backend=backend, parallel=parallel)
        self.num_tasks = self.local.num_tasks
        try:
            self.pool = start_rollout_workers(cfg, policy, env_factory)
        except BaseException:
            self.local.close()
            raise

    def collect(self, task_indices: Sequence[int], group_size: int, sampling: SamplingConfig, seed: int,
                offset: int = 0, reset_options: dict[str, Any] | None = None) -> tuple[list[Trajectory], RolloutTimes]:
        if offset:
            raise ValueError("RayRollout collects whole iterations (offset 0); the pool slices them itself")
        return self.pool.collect(task_indices, group_size, sampling, seed, reset_options)

    def sync_weights(self, policy: torch.nn.Module) -> None:
        self.pool.load_weights(inference_state_dict(policy))

    def evaluate(self, sampling: SamplingConfig, num_tasks: int, seed: int) -> dict[str, float]:
        return self.local.evaluate(sampling, num_tasks, seed)

    def metrics(self) -> dict[str, float]:
        return self.pool.metrics()

    def close(self) -> None:
        try:
            self.pool.shutdown()
        finally:
            self.local.close()


__all__ = ["RayRollout", "RolloutWorker", "RolloutWorkerError", "RolloutWorkerPool", "start_rollout_workers",
           "worker_gpus"]
