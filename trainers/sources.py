"""Where a trainer's trajectories come from: a *rollout source* the ``Trainer`` is given
(``trainers.compose.choose_parts`` picks one from the config), and the overlap part that may wrap
it (``Prefetching``, ``rollout.max_staleness: 1``).

The protocol (implement it to plug a new source into the loop, e.g. asynchronous rollout):

    class MySource:                                   # structural: no base class needed
        learner_backend = None                        # the backend the learner builds: None = rollout.backend
        def __init__(self, cfg, *, env_factory, policy, backend, parallel): ...
        num_tasks: int                                # tasks in the training env (the data cursor's range)
        def collect(self, task_indices, group_size, sampling, seed, offset=0, reset_options=None)
            -> tuple[list[Trajectory], RolloutTimes]
        def sync_weights(self, policy) -> None        # after each update (and after --resume)
        def evaluate(self, sampling, num_tasks, seed) -> dict[str, float]   # greedy eval, ``eval/*`` keys
        def metrics(self) -> dict[str, float]         # the source's own metrics of the last iteration
        def close(self) -> None

- ``collect``: ``group_size`` episodes of each task of ``task_indices`` sampled with ``sampling``,
  in task order; each ``Trajectory.group`` names its group (trajectories of one group share a task:
  what GRPO/RLOO compare). Randomness must be a pure function of ``seed`` and the episode's
  position, so a batch is a pure function of ``(weights, task_indices, seed)`` and a resumed run
  repeats it. ``offset`` is the global index of the first sub-env when a process collects only its
  share of the iteration (FSDP ranks; ``trainers.rollout.collect`` says how it seeds and groups);
  a source that cannot split an iteration raises on a non-zero one. ``reset_options`` (only passed
  when the run sets ``rollout.scaffold_drop``): more options for every env's reset
  (``scaffold_drop_prob``). A ``Trajectory`` is the env's
  token-exact ``Episode`` plus the sampler's per-token log-probs; a subclass may add fields
  (``AgentTrajectory.agent``), which go into the trajectory records.
- ``sync_weights``: make the next ``collect`` sample from ``policy``'s current weights (an HF
  backend that shares the module has nothing to do).
- ``staleness`` (optional; read after each ``collect``): by how many updates the batch's weights
  are behind the learner's. A source without it samples the weights of the last ``sync_weights``
  (0); the overlap part ``Prefetching`` has it.
- ``evaluate`` runs on the main process only (the trainer calls it under its parallelism's
  ``full_params``); ``metrics`` is logged with the iteration's metrics (``rollout/worker_restarts``,
  ``team/*``).

Sources: ``LocalRollout`` (here: the lockstep rollout of ``trainers.rollout.collect`` over a
``ToolVectorEnv``, one backend call per turn for every live sub-env), ``RayRollout``
(``trainers.ray_rollout``: N Ray actors, one slice each) and ``TeamRollout``
(``trainers.multiagent``: a multi-agent id's ``ParallelEnv``s, one trajectory per agent) and
``AsyncRollout`` (``trainers.rollout_async``, ``rollout.mode: async``: each trajectory a coroutine
against vLLM's asynchronous engine).

``Prefetching`` wraps any of them (``rollout.max_staleness: 1``): it collects the next iteration
while the learner trains on this one (its class docstring).

Also here, because sources, workers and the trainer all build them: ``make_vector_env``,
``make_backend``, ``derive_seed``, ``evaluate_greedy`` and ``episode_record``.
"""

from __future__ import annotations

import dataclasses
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import numpy as np
import torch

from agent_gym.episode import Episode
from agent_gym.factory import EnvFactory
from agent_gym.tokenizer import pad_token_id
from agent_gym.vector import ToolVectorEnv
from trainers import scale
from trainers.backends.base import SamplingConfig
from trainers.backends.hf_backend import HFBackend
from trainers.config import RolloutConfig
from trainers.rollout import RolloutTimes, Trajectory, collect, summarize


class RolloutSource(Protocol):
    """The trainer's source of trajectories (the module docstring)."""

    learner_backend: str | None
    num_tasks: int

    def collect(
        self,
        task_indices: Sequence[int],
        group_size: int,
        sampling: SamplingConfig,
        seed: int,
        offset: int = 0,
        reset_options: dict[str, Any] | None = None,
    ) -> tuple[list[Trajectory], RolloutTimes]: ...

    def sync_weights(self, policy: torch.nn.Module) -> None: ...

    def evaluate(self, sampling: SamplingConfig, num_tasks: int, seed: int) -> dict[str, float]: ...

    def metrics(self) -> dict[str, float]: ...

    def close(self) -> None: ...


def make_vector_env(env_id: str, num_envs: int, env_kwargs: dict[str, Any], threads: int = 0) -> ToolVectorEnv:
    """Kept for callers of the old name: ``EnvFactory(env_id, env_kwargs, num_threads=threads).make_vector(num_envs)``."""
    return EnvFactory(env_id, env_kwargs, num_threads=threads).make_vector(num_envs)


def make_backend(
    rollout: RolloutConfig,
    policy: torch.nn.Module,
    tokenizer: Any,
    run_dir: Path,
    *,
    device: str,
    seed: int,
    lone: bool = False,
):
    """The rollout section's ``backend`` (with its ``vllm_kwargs``; ``mode: async``: the asynchronous
    engine) over ``policy`` on ``device`` (``model.device``), seeded with ``seed`` (``run.seed``).
    ``lone``: the engine is the only thing working while it generates (a lockstep trainer or an
    evaluator, not a Ray worker beside others or an overlapped rollout), so on the CPU its OpenMP
    threads take every core (``omp_threads_bind: all``) unless ``vllm_kwargs`` or the environment
    (``VLLM_CPU_OMP_THREADS_BIND``) says otherwise: a QA rollout 1.6x faster on 2 cores than vLLM's
    own placement, which keeps one core for its scheduler (docs/vllm.md)."""
    if rollout.backend == "hf":
        return HFBackend(policy, pad_token_id=pad_token_id(tokenizer), device=device, tokenizer=tokenizer)
    from trainers.backends.vllm_backend import AsyncVLLMBackend, VLLMBackend  # optional: vLLM (extra vllm)

    kwargs = vllm_engine_kwargs(rollout, lone)
    path = scale.save_for_inference(policy, tokenizer, run_dir / "vllm_init")
    if rollout.mode == "async":  # trainers/rollout_async.py's engine
        return AsyncVLLMBackend(path, seed=seed, **kwargs)
    return VLLMBackend(path, seed=seed, **kwargs)


def vllm_engine_kwargs(rollout: RolloutConfig, lone: bool) -> dict[str, Any]:
    """``rollout.vllm_kwargs``, with ``omp_threads_bind: all`` for a ``lone`` lockstep engine
    (``make_backend``) unless the kwargs or ``VLLM_CPU_OMP_THREADS_BIND`` already place it."""
    kwargs = dict(rollout.vllm_kwargs)
    placed = "omp_threads_bind" in kwargs or "VLLM_CPU_OMP_THREADS_BIND" in os.environ
    if lone and rollout.mode != "async" and not placed:
        kwargs["omp_threads_bind"] = "all"
    return kwargs


def derive_seed(*parts: int) -> int:
    """A 31-bit seed derived from ``parts`` (e.g. ``(seed, iteration)``): the run's randomness per iteration."""
    return int(np.random.SeedSequence(list(parts)).generate_state(1)[0] & 0x7FFFFFFF)


def eval_keys(metrics: dict[str, float], prefix: str = "eval/") -> dict[str, float]:
    """rollout/x -> eval/x; reward/x and tools/x -> eval/reward/x, eval/tools/x (``prefix`` for eval/)."""
    return {(prefix + k[len("rollout/") :] if k.startswith("rollout/") else prefix + k): v for k, v in metrics.items()}


def evaluate_greedy(
    eval_envs: ToolVectorEnv,
    eval_sets: dict[str, ToolVectorEnv],
    backend: Any,
    sampling: SamplingConfig,
    num_tasks: int,
    seed: int,
) -> dict[str, float]:
    """Greedy episodes on the first ``num_tasks`` tasks of ``eval_envs`` (``eval/*``) and of each
    named set (``eval/<name>/*``). RL and SFT both report through this."""
    greedy = dataclasses.replace(sampling, temperature=0.0)
    out: dict[str, float] = {}
    for prefix, envs in [("eval/", eval_envs)] + [(f"eval/{n}/", e) for n, e in eval_sets.items()]:
        trajs, _ = collect(envs, backend, list(range(num_tasks)), 1, greedy, seed=seed)
        out.update(eval_keys(summarize(trajs), prefix))
    return out


def episode_record(ep: Episode, tokenizer: Any, **extra: Any) -> dict[str, Any]:
    """One episode as a JSON record (the trajectory files, ``trainers.evaluate``'s output, the
    viewer's input): every ``Episode`` field, its totals, and the decoded text."""
    return {
        **dataclasses.asdict(ep),
        **extra,
        "reward": ep.reward,
        "turns": ep.turns,
        "reward_components": ep.reward_components,
        "call_statuses": ep.call_statuses,
        "text": tokenizer.decode(ep.token_ids, skip_special_tokens=False),
    }


class LocalRollout:
    """The in-process source: ``trainers.rollout.collect`` over a ``ToolVectorEnv`` of this process's
    share of ``batch_size`` sub-envs, generated by the learner's own ``backend``; the evaluation
    envs (the main process only) are built here too, from the run's ``env_factory``: the rollout's on
    ``env_server`` when set, evaluation's in this process (its env kwargs overrides cannot reach a
    served env)."""

    learner_backend: str | None = None  # the learner's backend is cfg.backend (it samples the rollout)

    def __init__(self, cfg: Any, *, env_factory: EnvFactory, policy: torch.nn.Module, backend: Any, parallel: Any):
        self.cfg, self.backend = cfg, backend
        self.envs = env_factory.make_vector(cfg.rollout.batch_size // parallel.world)
        self.eval_envs, self.eval_set_envs = None, {}
        if parallel.is_main:  # only the main process evaluates
            evals = env_factory.local()
            self.eval_envs = evals.make_vector(cfg.eval.tasks, **cfg.eval.env_kwargs)
            self.eval_set_envs = {name: evals.make_vector(cfg.eval.tasks, **kw) for name, kw in cfg.eval.sets.items()}
        self.num_tasks = EnvFactory.num_tasks(self.envs)

    def collect(
        self,
        task_indices: Sequence[int],
        group_size: int,
        sampling: SamplingConfig,
        seed: int,
        offset: int = 0,
        reset_options: dict[str, Any] | None = None,
    ) -> tuple[list[Trajectory], RolloutTimes]:
        return collect(
            self.envs,
            self.backend,
            list(task_indices),
            group_size,
            sampling,
            seed=seed,
            offset=offset,
            reset_options=reset_options,
        )

    def sync_weights(self, policy: torch.nn.Module) -> None:
        """The HF backend samples from the policy module itself (nothing to do) or, under the
        overlap part, from a copy of it (the weights are copied in); another engine gets the
        weights."""
        if self.cfg.rollout.backend != "hf":
            self.backend.load_weights(scale.inference_state_dict(policy))
        elif self.backend.model is not policy:
            with torch.no_grad():
                self.backend.model.load_state_dict(policy.state_dict())

    def evaluate(self, sampling: SamplingConfig, num_tasks: int, seed: int) -> dict[str, float]:
        return evaluate_greedy(self.eval_envs, self.eval_set_envs, self.backend, sampling, num_tasks, seed)

    def metrics(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        for envs in [self.envs, self.eval_envs, *self.eval_set_envs.values()]:
            if envs is not None:
                envs.close()


Request = tuple[tuple, dict[str, Any]]
"""A ``collect`` call's positional and keyword arguments."""


class Prefetching:
    """Overlapping rollout with training (``rollout.max_staleness: 1``) as a part: a rollout source
    around any other (``inner``) that collects the next iteration while the learner trains on this one.

    ``collect`` hands out the batch in flight when it was started for this very call (else it
    collects now), then, the inner source idle, gives it the learner's newest weights and starts the
    call ``ahead()`` names (the next iteration's; None: none, the run ends or stops) in a background
    thread (named ``rollout``). So iteration i+1 samples with the weights before update i: one
    version old, never more, since weights are pushed only between rollouts. The part holds its own
    weight versions: the learner's (one per ``sync_weights``, which only records the weights) and
    the one the inner source's engine holds; ``staleness`` is by how many updates the last batch
    handed out is behind the learner. ``evaluate`` waits for the rollout in flight (kept for its
    call) and pushes the learner's weights first, so evaluations see the learner; ``close`` waits
    for it too, never killing it mid-episode, and drops its result or error (the run has ended
    with its own outcome). An in-process HF sampler must be a copy of the policy, not the learner's
    module (the trainer makes it one). docs/design.md, "Overlapping rollout with training"."""

    def __init__(self, inner: RolloutSource, ahead: Callable[[], Request | None]):
        self.inner, self.ahead = inner, ahead
        self.learner_backend = inner.learner_backend
        self.num_tasks = inner.num_tasks
        self.learner_version = 0
        """``sync_weights`` calls: the learner's updates (and a resume's restore) so far."""
        self.engine_version = 0
        """The learner version the inner source samples with (it starts with the learner's weights)."""
        self.staleness = 0
        self._policy: torch.nn.Module | None = None
        self._pending: tuple[Request, Future, int] | None = None
        """The call in flight, its future and the learner version it samples with."""
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout")

    def collect(self, *args: Any, **kwargs: Any) -> tuple[list[Trajectory], RolloutTimes]:
        request = (args, kwargs)
        if self._pending is not None:
            started, future, version = self._pending
            if started != request:  # cannot happen in Trainer.train; a caller driving iterations by hand gets told
                raise RuntimeError(
                    "a collect other than the one in flight: the overlapped rollout serves the calls "
                    "in the order ahead() names them"
                )
            self._pending = None
            out = future.result()
        else:
            self._push()
            version = self.engine_version
            out = self.inner.collect(*args, **kwargs)
        self.staleness = self.learner_version - version
        following = self.ahead()
        if following is not None:
            self._push()
            self._pending = (
                following,
                self._pool.submit(self.inner.collect, *following[0], **following[1]),
                self.engine_version,
            )
        return out

    def sync_weights(self, policy: torch.nn.Module) -> None:
        """Record the learner's new weights; they reach the inner source before its next rollout."""
        self._policy = policy
        self.learner_version += 1

    def _push(self) -> None:
        """The learner's weights to the inner source, if it has older ones (no rollout is in flight)."""
        if self.engine_version != self.learner_version:
            self.inner.sync_weights(self._policy)
            self.engine_version = self.learner_version

    def evaluate(self, sampling: SamplingConfig, num_tasks: int, seed: int) -> dict[str, float]:
        if self._pending is not None:
            self._pending[1].result()
        self._push()
        return self.inner.evaluate(sampling, num_tasks, seed)

    def metrics(self) -> dict[str, float]:
        return self.inner.metrics()

    def close(self) -> None:
        self._pending = None
        self._pool.shutdown(wait=True)
        self.inner.close()

    def __getattr__(self, name: str) -> Any:  # the inner source's own attributes (envs, pool, ...)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


__all__ = [
    "LocalRollout",
    "Prefetching",
    "Request",
    "RolloutSource",
    "derive_seed",
    "episode_record",
    "eval_keys",
    "evaluate_greedy",
    "make_backend",
    "vllm_engine_kwargs",
    "make_vector_env",
]
