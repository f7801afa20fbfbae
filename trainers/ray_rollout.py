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
restarts of an iteration are logged as ``rollout/worker_restarts``; the engine restarts the workers'
``VLLMBackend`` made (below), reported with their answers, as ``rollout/engine_restarts``.

A lost node (docs/scaling.md, "A lost node"): a worker whose node left the cluster (the worker's call
failed, or the GCS lists the node dead; the pool looks every ``_PROBE_S`` while it waits) is not
waited for: its slice is collected again by a remaining worker (one slice at a time per worker), so
the batch is unchanged, and so are its slices of the next iterations until Ray restarts it on another
node; the pool takes it back (with the current weights) at the start of a collect.
``rollout/workers_lost`` counts the workers missing. With none left, the pool waits
``rollout.timeout_s`` for one to come back, then stops with a one-line ``RolloutWorkerError`` naming
the lost nodes and ``--resume``.

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
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from trainers import plugins
from trainers.backends import process_guard
from trainers.backends.base import EngineDiedError, SamplingConfig
from trainers.config import TrainConfig, from_dict, to_dict
from trainers.models import load_policy, load_tokenizer_for
from trainers.rollout import ENGINE_RESTARTS, EngineRestarts, RolloutTimes, Trajectory, collect
from trainers.scale import inference_state_dict
from trainers.sources import LocalRollout, make_backend


class RolloutWorkerError(RuntimeError):
    """A rollout worker failed more often than ``rollout.retries`` allows, or could not start."""


def _ray():
    try:
        import ray  # optional: ray (extra scale)
    except ImportError as e:  # pragma: no cover - ray is in the scale extra
        raise ImportError(
            f"rollout_workers > 0 needs Ray: pip install -e '.[scale]' (or set rollout_workers: 0). Import error: {e}"
        ) from e
    return ray


class RolloutWorker:
    """One Ray actor: a ``ToolVectorEnv`` slice, a policy copy and its backend (the class is made
    remote by ``RolloutWorkerPool``, so importing this module does not need Ray)."""

    def __init__(self, cfg_dict: dict[str, Any], worker_index: int, num_envs: int, use_gpu: bool, env_factory: Any):
        # With vLLM the engine takes the worker's GPU; the HF copy only seeds the engine, on the CPU.
        plugins.load(cfg_dict.get("plugins") or [])  # the learner's plugins, before its config is rebuilt here
        device = "cuda" if use_gpu and cfg_dict["rollout"]["backend"] == "hf" else "cpu"
        cfg = from_dict(
            {
                **cfg_dict,
                "rollout": {**cfg_dict["rollout"], "workers": 0},
                "model": {**cfg_dict["model"], "device": device},
            }
        )
        torch.set_num_threads(cfg.model.torch_threads or 1)
        self.cfg = cfg
        self.tokenizer = load_tokenizer_for(cfg.model)
        policy = load_policy(cfg.model, self.tokenizer, seed=cfg.run.seed).eval()
        self.envs = env_factory.make_vector(num_envs)  # the learner's EnvFactory (env_server: sessions there)
        run_dir = Path(cfg.run.run_dir) / f"rollout_worker_{worker_index}"
        self.backend = make_backend(
            cfg.rollout, policy, self.tokenizer, run_dir, device=cfg.model.device, seed=cfg.run.seed
        )
        self.policy = policy if cfg.rollout.backend == "hf" else None  # the HF backend samples from this module
        self.version = -1  # no weights from the learner yet
        self.engine_restarts = EngineRestarts(self.backend)  # reported with each answer, then forgotten

    def pid(self) -> int:
        return os.getpid()

    def where(self) -> tuple[int, str, str]:
        """This worker's process id, and the id and address of the Ray node it runs on."""
        import ray  # optional: ray (extra scale)

        ctx = ray.get_runtime_context()
        return os.getpid(), ctx.get_node_id(), ray.util.get_node_ip_address()

    def engine_processes(self) -> dict[int, str]:
        """This worker's vLLM engine processes, pid -> role (empty with the HF backend)."""
        get = getattr(self.backend, "engine_processes", None)
        return get() if get is not None else {}

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> tuple[int, int]:
        """Load the weights; returns their version and the engine restarts (``rollout/engine_restarts``)
        since this worker last reported them."""
        self.backend.load_weights(state_dict)
        self.version = version
        return version, self._take_engine_restarts()

    def collect(
        self,
        task_indices: list[int],
        group_size: int,
        sampling: SamplingConfig,
        seed: int,
        offset: int,
        version: int,
        reset_options: dict[str, Any] | None = None,
    ) -> tuple[list[Trajectory], RolloutTimes, int] | None:
        """The slice's trajectories, its times and the engine restarts since this worker last
        reported them; None when this worker does not hold weights ``version`` (it was restarted and
        has not been sent them yet)."""
        if version != self.version:
            return None
        trajs, times = collect(
            self.envs,
            self.backend,
            task_indices,
            group_size,
            sampling,
            seed=seed,
            offset=offset,
            reset_options=reset_options,
        )
        return trajs, times, self._take_engine_restarts()

    def _take_engine_restarts(self) -> int:
        return int(self.engine_restarts.take().get(ENGINE_RESTARTS, 0))

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


class _NodeLost(Exception):
    """Worker ``w``'s Ray node left the cluster (the pool's own signal; never reaches a caller)."""

    def __init__(self, w: int):
        super().__init__(w)
        self.w = w


_PROBE_S = 1.0
"""How often a wait on a worker looks whether the worker's node is still in the cluster."""


class RolloutWorkerPool:
    """N ``RolloutWorker`` actors and the learner's side of the protocol (see the module docstring)."""

    def __init__(self, cfg: TrainConfig, state_dict: dict[str, torch.Tensor], env_factory: Any):
        ray = _ray()
        self.cfg = cfg
        self.n = cfg.rollout.workers
        self.tasks_per_worker = cfg.rollout.tasks_per_iter // self.n
        self.started_ray = False
        self.lost: dict[int, tuple[str, str, Any]] = {}
        """Workers lost with their node: w -> (node id, node address, a call that answers once Ray
        has restarted the worker on another node)."""
        if not ray.is_initialized():
            self._init_ray(ray)
        self._check_resources(ray)
        remote_cls = ray.remote(RolloutWorker)
        cfg_dict = to_dict(cfg)
        self.actors = [
            remote_cls.options(
                num_cpus=cfg.rollout.worker_cpus, num_gpus=cfg.rollout.worker_gpus, max_restarts=-1, max_task_retries=0
            ).remote(
                cfg_dict, w, self.tasks_per_worker * cfg.rollout.group_size, cfg.rollout.worker_gpus > 0, env_factory
            )
            for w in range(self.n)
        ]
        try:
            where = ray.get([a.where.remote() for a in self.actors], timeout=cfg.rollout.timeout_s)
        except ray.exceptions.GetTimeoutError as e:
            resources = ray.cluster_resources()  # before shutdown: afterwards Ray cannot be asked
            self.shutdown(graceful=False)  # workers still starting (or never): nothing to close
            raise RolloutWorkerError(
                f"{self.n} rollout workers did not start within rollout_timeout_s={cfg.rollout.timeout_s} s; the "
                f"cluster may lack {cfg.rollout.worker_cpus} CPU / {cfg.rollout.worker_gpus} GPU per worker "
                f"(ray.cluster_resources(): {resources}), or the machine is too busy for them to start in time. "
                "Lower rollout_worker_cpus/gpus, add nodes or raise rollout_timeout_s."
            ) from e
        except Exception:  # a constructor that failed (bad model path, env error): no cluster left behind
            self.shutdown(graceful=False)
            raise
        self.nodes: list[tuple[str, str]] = [(node, ip) for _, node, ip in where]
        """Each worker's Ray node (id, address), as last seen."""
        self.version = 0
        self._reset_options: dict[str, Any] | None = None
        self.weights_ref = None
        self.restarts = 0
        self.engine_restarts = 0
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
        # address="local": a new cluster of our own even when another one runs on this machine. With
        # no address Ray joins the newest local cluster it finds (another run's, another test's),
        # and then refuses num_cpus ("When connecting to an existing cluster, num_cpus and num_gpus
        # must not be provided"); seen with two test processes starting Ray at once.
        with process_guard.environ(env):
            ray.init(
                address="local",
                num_cpus=max(os.cpu_count() or 1, int(-(-self.n * cfg.rollout.worker_cpus // 1))),
                include_dashboard=False,
            )
        self.started_ray = True

    def _check_resources(self, ray: Any) -> None:
        have = ray.cluster_resources()
        cfg = self.cfg
        for key, per in (("CPU", cfg.rollout.worker_cpus), ("GPU", cfg.rollout.worker_gpus)):
            if per > 0 and have.get(key, 0.0) < per * self.n:
                msg = (
                    f"rollout_workers={self.n} x rollout_worker_{key.lower()}s={per} needs {per * self.n:g} {key}, "
                    f"the Ray cluster has {have.get(key, 0.0):g}"
                    + (
                        " (a local cluster leaves out the learner's GPU)"
                        if key == "GPU" and self.started_ray and cfg.model.device.startswith("cuda")
                        else ""
                    )
                    + f". Lower rollout_worker_{key.lower()}s or rollout_workers, or join a larger cluster (ray_address)."
                )
                if self.started_ray:
                    ray.shutdown()
                raise RolloutWorkerError(msg)

    # -- the protocol --------------------------------------------------------------------------

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Put the weights into the object store once; every worker loads the same object (a
        worker lost with its node gets them when it is back)."""
        ray = _ray()
        self.version += 1
        self.weights_ref = ray.put({k: v.detach().to("cpu") for k, v in state_dict.items()})
        refs = {w: self._send_weights(w) for w in self._live()}
        deadline = time.monotonic() + self.cfg.rollout.timeout_s
        for w, ref in refs.items():
            try:
                try:
                    self._weights_arrived(self._wait_for(w, ref, max(0.0, deadline - time.monotonic())))
                except EngineDiedError:  # its engine died and its backend could not restart it: a new worker starts one
                    self.restarts += 1
                    self._restart_live_worker(w)
                    self._weights_arrived(self._wait_for(w, self._send_weights(w), self.cfg.rollout.timeout_s))
            except _NodeLost:
                self._lose(w, None)

    def collect(
        self,
        task_indices: Sequence[int],
        group_size: int,
        sampling: SamplingConfig,
        seed: int,
        reset_options: dict[str, Any] | None = None,
    ) -> tuple[list[Trajectory], RolloutTimes]:
        """The iteration's batch: slice s is tasks ``[s*k, (s+1)*k)`` (k = tasks per worker), the
        slice of worker s (of another worker while s is lost with its node), returned in slice
        order, so the batch order is the in-process order."""
        ray = _ray()
        k = self.tasks_per_worker
        if len(task_indices) != k * self.n:
            raise ValueError(f"got {len(task_indices)} tasks for {self.n} workers x {k} tasks each")
        self._reset_options = reset_options  # the same for every slice and every retry of one
        self.restarts = self.engine_restarts = 0
        self._take_back_restarted()
        args = [
            (list(task_indices[s * k : (s + 1) * k]), group_size, sampling, seed, s * k * group_size)
            for s in range(self.n)
        ]
        results: dict[int, tuple[list[Trajectory], RolloutTimes, int]] = {}
        ran_on: dict[int, int] = {}  # slice -> the worker that collected it
        attempts = [0] * self.n
        pending: dict[Any, tuple[int, int, float]] = {}  # ref -> (slice, worker, when sent)
        todo: list[int] = []  # slices waiting for a worker: a lost worker's

        def send(s: int, w: int) -> None:
            ref = self.actors[w].collect.remote(*args[s], self.version, self._reset_options)
            pending[ref] = (s, w, time.monotonic())

        def again(s: int, w: int, why: str) -> None:
            """Slice s failed on worker w: retry it there once w is back, or, w's node lost, on another worker."""
            self._count_attempt(s, w, attempts, args, why)
            try:
                if self._node_lost(w):
                    raise _NodeLost(w)
                self._back_with_weights(w)
                send(s, w)
            except _NodeLost:
                self._lose(w, args[s][0])
                todo.append(s)

        for s in range(self.n):
            if s in self.lost:
                todo.append(s)
            else:
                send(s, s)
        while pending or todo:
            busy = {w for _, w, _ in pending.values()}
            for w in self._live():  # a waiting slice goes to an idle worker (a worker runs one slice at a time)
                if todo and w not in busy:
                    send(todo.pop(0), w)
            if not pending:  # slices wait and every worker is lost: Ray may restart one on another node
                self._wait_for_a_lost_worker()
                continue
            oldest = min(t for _, _, t in pending.values())
            wait_s = max(0.0, oldest + self.cfg.rollout.timeout_s - time.monotonic())
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=min(wait_s, _PROBE_S))
            if not ready:
                gone = self._lost_nodes({self.nodes[w][0] for _, w, _ in pending.values()})
                for ref in [r for r, (_, w, _) in pending.items() if self.nodes[w][0] in gone]:
                    s, w, _ = pending.pop(ref)  # its node left before Ray failed the call
                    again(s, w, "was lost with its node")
                if pending and not gone:
                    ref = min(pending, key=lambda r: pending[r][2])
                    s, w, sent = pending[ref]
                    if time.monotonic() >= sent + self.cfg.rollout.timeout_s:  # out of time: restart its worker, retry
                        del pending[ref]
                        ray.kill(self.actors[w], no_restart=False)
                        again(s, w, "timed out")
                continue
            ref = ready[0]
            s, w, _ = pending.pop(ref)
            try:
                out = ray.get(ref)
            except (
                ray.exceptions.RayActorError,
                ray.exceptions.ActorUnavailableError,
                ray.exceptions.ObjectLostError,
            ) as e:
                again(s, w, f"died ({type(e).__name__})")
                continue
            except EngineDiedError:  # its vLLM engine died beyond what its backend restarts: restart the worker
                self._restart_live_worker(w)
                again(s, w, "lost its vLLM engine (EngineDiedError, above)")
                continue
            if out is None:  # restarted before the weights reached it
                again(s, w, "was restarted")
                continue
            results[s], ran_on[s] = out, w
            self.engine_restarts += out[2]
        trajs = [t for s in range(self.n) for t in results[s][0]]
        # The workers run in parallel, each its slices one after another: the busiest one bounds
        # the rollout's wall time.
        per_worker: dict[int, list[RolloutTimes]] = {}
        for s, w in ran_on.items():
            per_worker.setdefault(w, []).append(results[s][1])
        return trajs, RolloutTimes(
            generate_s=max(sum(t.generate_s for t in ts) for ts in per_worker.values()),
            env_s=max(sum(t.env_s for t in ts) for ts in per_worker.values()),
            generated_tokens=sum(results[s][1].generated_tokens for s in results),
        )

    # -- failures ------------------------------------------------------------------------------

    def _live(self) -> list[int]:
        return [w for w in range(self.n) if w not in self.lost]

    def _send_weights(self, w: int) -> Any:
        # max_task_retries=-1: a worker that died since the last rollout gets them once restarted.
        return self.actors[w].load_weights.options(max_task_retries=-1).remote(self.weights_ref, self.version)

    def _weights_arrived(self, answer: tuple[int, int]) -> None:
        self.engine_restarts += answer[1]  # the worker's engine restarts since it last said

    def _wait_for(self, w: int, ref: Any, timeout_s: float) -> Any:
        """``ray.get(ref)``, a call to worker w; raises ``_NodeLost`` as soon as w's node is seen
        gone from the cluster (a call to a worker that Ray cannot restart would wait for good) and
        ``GetTimeoutError`` after ``timeout_s``."""
        ray = _ray()
        deadline = time.monotonic() + timeout_s
        while True:
            ready, _ = ray.wait([ref], timeout=max(0.0, min(_PROBE_S, deadline - time.monotonic())))
            if ready:
                return ray.get(ref)
            if self._node_lost(w):
                raise _NodeLost(w)
            if time.monotonic() >= deadline:
                raise ray.exceptions.GetTimeoutError(f"rollout worker {w} did not answer within {timeout_s:g} s")

    def _back_with_weights(self, w: int) -> None:
        """Wait for worker w to be up again (Ray restarts a dead one), send it the current weights,
        note its node (a restart may place it on another) and count the restart."""
        timeout_s = self.cfg.rollout.timeout_s
        self._weights_arrived(self._wait_for(w, self._send_weights(w), timeout_s))
        _, node, ip = self._wait_for(w, self.actors[w].where.options(max_task_retries=-1).remote(), timeout_s)
        self.nodes[w] = (node, ip)
        self.restarts += 1

    def _count_attempt(self, s: int, w: int, attempts: list[int], args: list[tuple], why: str) -> None:
        attempts[s] += 1
        if attempts[s] > self.cfg.rollout.retries:
            raise RolloutWorkerError(
                f"rollout worker {w} {why} on its slice (tasks {args[s][0]}) {attempts[s]} times; "
                f"rollout_retries={self.cfg.rollout.retries}. See the worker's log above "
                "(Ray prints it to this process), raise rollout_timeout_s if it is only slow."
            )

    def _lost_nodes(self, nodes: set[str]) -> set[str]:
        """Which of ``nodes`` (Ray node ids) have left the cluster, as the GCS knows it."""
        ray = _ray()
        try:
            alive = {n["NodeID"]: n["Alive"] for n in ray.nodes()}
        except Exception:  # the GCS does not answer now: nothing is known lost
            return set()
        return {node for node in nodes if not alive.get(node, False)}

    def _node_lost(self, w: int) -> bool:
        return bool(self._lost_nodes({self.nodes[w][0]}))

    def _lose(self, w: int, tasks: list[int] | None) -> None:
        """Worker w went with its node: its slices go to the other workers until Ray restarts it elsewhere."""
        if w in self.lost:
            return
        node, ip = self.nodes[w]
        self.lost[w] = (node, ip, self._probe(w))
        what = (
            f"its slice (tasks {tasks}) is collected again by the remaining workers, and so are its next slices"
            if tasks is not None
            else "the remaining workers collect its slices"
        )
        print(
            f"warning: rollout worker {w} was lost with its node {node} ({ip}), which left the Ray cluster; {what} "
            "until Ray restarts it on another node (the batch is unchanged; rollout/workers_lost counts the "
            "workers missing)",
            file=sys.stderr,
            flush=True,
        )

    def _probe(self, w: int) -> Any:
        """A call that answers once Ray has restarted lost worker w (on a node with room for it).
        Not retried by Ray (``max_task_retries=0``): while the worker is down it fails, and the
        pool asks again at its next look (Ray's own retries would log each attempt, every second,
        for as long as the worker stays lost)."""
        return self.actors[w].where.options(max_task_retries=0).remote()

    def _take_back_restarted(self) -> None:
        """Lost workers that Ray has restarted on another node rejoin, with the current weights."""
        for w in list(self.lost):
            where = self._answer(w)
            if where is None:
                continue
            node, ip, _ = self.lost[w]
            self.nodes[w] = where[1:]
            try:
                self._weights_arrived(self._wait_for(w, self._send_weights(w), self.cfg.rollout.timeout_s))
            except (_ray().exceptions.RayActorError, _ray().exceptions.GetTimeoutError, EngineDiedError, _NodeLost):
                self.lost[w] = (node, ip, self._probe(w))  # down again: ask again next time
                continue
            del self.lost[w]
            self.restarts += 1
            print(
                f"rollout worker {w}, lost with node {node} ({ip}), is back on node {where[1]} ({where[2]}) and "
                "collects its own slices again",
                file=sys.stderr,
                flush=True,
            )

    def _answer(self, w: int) -> tuple[int, str, str] | None:
        """Lost worker w's ``where()`` when it is up again, else None (its probe renewed when it failed)."""
        ray = _ray()
        node, ip, probe = self.lost[w]
        for wait_s in (0.0, _PROBE_S):
            if not ray.wait([probe], timeout=wait_s)[0]:
                return None
            try:
                return ray.get(probe)
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
                # Down when asked, which may be a while ago: ask again (now, then at the next look).
                probe = self._probe(w)
                self.lost[w] = (node, ip, probe)
        return None

    def _wait_for_a_lost_worker(self) -> None:
        """Every worker is lost: wait up to ``rollout.timeout_s`` for Ray to restart one elsewhere,
        else stop the run with one line naming the lost nodes."""
        ray = _ray()
        deadline = time.monotonic() + self.cfg.rollout.timeout_s
        while not self._live():
            left = deadline - time.monotonic()
            if left <= 0:
                r = self.cfg.rollout
                nodes = "; ".join(f"worker {w}: node {node} ({ip})" for w, (node, ip, _) in sorted(self.lost.items()))
                raise RolloutWorkerError(
                    f"every rollout worker was lost with its node ({nodes}): the nodes left the Ray cluster and Ray "
                    f"restarted none of the workers on another node within rollout.timeout_s={r.timeout_s:g} s. The "
                    f"run's last checkpoint is intact: rerun the same command with --resume once the cluster has room "
                    f"for rollout.workers={self.n} workers of {r.worker_cpus:g} CPU and {r.worker_gpus:g} GPU each, or "
                    "with fewer rollout.workers."
                )
            ready, _ = ray.wait(
                [probe for _, _, probe in self.lost.values()], num_returns=1, timeout=min(left, _PROBE_S)
            )
            self._take_back_restarted()
            if ready and not self._live():  # a probe failed (the worker is still down) and was renewed
                time.sleep(max(0.0, min(_PROBE_S, deadline - time.monotonic())))

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
            ray.get(
                self.actors[w].exit_for_restart.options(max_task_retries=0).remote(), timeout=self.cfg.rollout.timeout_s
            )
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
            return  # the process ended, as asked
        except ray.exceptions.GetTimeoutError:
            ray.kill(self.actors[w], no_restart=False)
            return
        raise RolloutWorkerError(f"rollout worker {w} did not end when asked to restart")  # pragma: no cover

    def metrics(self) -> dict[str, float]:
        """``rollout/worker_restarts``: worker restarts (deaths, timeouts, engines lost, a lost worker
        back on another node) noticed during the last collect and the weight sync after it (a worker
        that died and came back between two rollouts got the weights on its restart and is not
        counted). ``rollout/workers_lost``: workers lost with their node and not back (their slices
        are collected by the others). With vLLM, ``rollout/engine_restarts``: the workers' engine
        restarts done by their ``VLLMBackend``, reported by the workers during the same span."""
        out = {"rollout/worker_restarts": float(self.restarts), "rollout/workers_lost": float(len(self.lost))}
        if self.cfg.rollout.backend == "vllm":
            out[ENGINE_RESTARTS] = float(self.engine_restarts)
        return out

    def _on_every_worker(self, method: str) -> list[Any]:
        """Each worker's answer to the no-argument actor method ``method``, in worker order (None
        for a worker lost with its node)."""
        ray = _ray()
        live = self._live()
        answers = ray.get([getattr(self.actors[w], method).remote() for w in live], timeout=self.cfg.rollout.timeout_s)
        out: list[Any] = [None] * self.n
        for w, a in zip(live, answers):
            out[w] = a
        return out

    def pids(self) -> list[int]:
        return self._on_every_worker("pid")

    def engine_processes(self) -> list[dict[int, str]]:
        """Each worker's vLLM engine processes, pid -> role (``VLLM::EngineCore``, ``VLLM::Worker``)."""
        return self._on_every_worker("engine_processes")

    def shutdown(self, graceful: bool = True) -> None:
        """Kill the actors (``graceful``: after each closed its backend; not a worker lost with its
        node, which has no process to close); stop Ray when this pool started it. Idempotent."""
        ray = _ray()
        if not ray.is_initialized():
            return
        actors = getattr(self, "actors", [])
        lost = getattr(self, "lost", {})
        # Each worker closes its backend first (a vLLM engine shuts down its processes and waits
        # for them); a kill alone leaves that to the engine's watchdog, seconds later.
        closing = [a.close.remote() for w, a in enumerate(actors) if w not in lost] if graceful else []
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
    return visible[:idx] + visible[idx + 1 :]


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

    def collect(
        self,
        task_indices: Sequence[int],
        group_size: int,
        sampling: SamplingConfig,
        seed: int,
        offset: int = 0,
        reset_options: dict[str, Any] | None = None,
    ) -> tuple[list[Trajectory], RolloutTimes]:
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


__all__ = [
    "RayRollout",
    "RolloutWorker",
    "RolloutWorkerError",
    "RolloutWorkerPool",
    "start_rollout_workers",
    "worker_gpus",
]
