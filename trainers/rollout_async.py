"""Asynchronous rollout (``rollout.mode: async``): every trajectory is a coroutine of its own.

``trainers.rollout.collect`` drives the vector env in lockstep: each turn waits for the slowest
generation and the slowest tool call of the batch before anyone moves on. Here each trajectory
alternates on its own

    one engine request with the trajectory's full token ids (token in, token out)
    -> the env's step for that trajectory alone (on a thread pool: its tools run with their timeouts
       while the other trajectories generate or run theirs)
    -> the next turn, until its episode ends,

against vLLM's asynchronous engine (``AsyncVLLMBackend``), which batches whatever requests are in
flight (continuous batching, prefix caching). The batch ends when every trajectory has ended.

What comes out is what ``collect`` returns: the same ``Trajectory`` records (the env's ``Episode``,
its masks and spans, the sampler's log-probs at the same positions, the same groups), in env order,
with the same per-request seeds (a function of ``(seed, env, turn)``), so the trainer's scoring and
loss code is unchanged, and under greedy decoding (or fixed seeds) the tokens equal the lockstep
rollout's (tests/trainers/test_rollout_async.py).

Times (``AsyncRolloutTimes``): turns overlap, so the lockstep sums would count the same wall time
twice. ``generate_s`` is the wall time during which the engine held at least one request of this
rollout (its busy time); ``env_s`` the wall time during which some env step ran and the engine held
none (time the engine waited on tools); ``wall_s`` the whole rollout. ``engine_busy`` =
``generate_s / wall_s``. For the lockstep rollout the same definitions give its
``generate_s / (generate_s + env_s)``.

Only backends with ``agenerate`` and ``run`` (``AsyncVLLMBackend``) can do this; the transformers
backend has no engine to keep full and stays lockstep (``RolloutConfig`` refuses ``rollout.mode: async``
with ``backend: hf``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from agent_gym.episode import Episode
from agent_gym.vector import ToolVectorEnv
from agent_gym.wrappers import action_checker
from trainers.backends.base import SamplingConfig
from trainers.rollout import RolloutTimes, Trajectory
from trainers.sources import LocalRollout


@dataclass
class AsyncRolloutTimes(RolloutTimes):
    """``RolloutTimes`` of an asynchronous rollout (module docstring: what each time means)."""

    wall_s: float = 0.0
    turns: int = 0
    """Engine requests made (one per turn of every trajectory)."""

    @property
    def engine_busy(self) -> float:
        """Fraction of the rollout's wall time during which the engine held at least one request."""
        return self.generate_s / self.wall_s if self.wall_s > 0 else 0.0


def turn_seed(seed: int, env: int, turn: int) -> int:
    """The generation seed of env ``env``'s turn ``turn`` (``env`` counted across the whole batch):
    the same function of ``(seed, env, turn)`` as ``trainers.rollout.collect``'s."""
    return int(np.random.SeedSequence([seed, env, turn]).generate_state(1)[0] & 0x7FFFFFFF)


class _Busy:
    """Wall time during which a count of things in flight is above zero. Used on one thread (the loop)."""

    def __init__(self) -> None:
        self.n, self.since, self.total = 0, 0.0, 0.0

    def start(self, now: float) -> None:
        if self.n == 0:
            self.since = now
        self.n += 1

    def stop(self, now: float) -> None:
        self.n -= 1
        if self.n == 0:
            self.total += now - self.since


class _Clock:
    """``generate_s`` (engine holds a request) and ``env_s`` (env steps run, engine holds none)."""

    def __init__(self) -> None:
        self.engine, self.env = _Busy(), _Busy()
        self.env_only = 0.0
        self._mark = time.perf_counter()

    def _advance(self) -> float:
        now = time.perf_counter()
        if self.engine.n == 0 and self.env.n > 0:
            self.env_only += now - self._mark
        self._mark = now
        return now

    def engine_start(self) -> None:
        self.engine.start(self._advance())

    def engine_stop(self) -> None:
        self.engine.stop(self._advance())

    def env_start(self) -> None:
        self.env.start(self._advance())

    def env_stop(self) -> None:
        self.env.stop(self._advance())


def collect_async(
    vec: ToolVectorEnv,
    backend: Any,
    task_indices: Sequence[int],
    group_size: int,
    sampling: SamplingConfig,
    seed: int,
    offset: int = 0,
    env_threads: int | None = None,
    reset_options: dict[str, Any] | None = None,
) -> tuple[list[Trajectory], AsyncRolloutTimes]:
    """Run one episode in every sub-env, each as its own coroutine; arguments and result as
    ``trainers.rollout.collect``. ``backend``: an ``AsyncVLLMBackend`` (``agenerate`` and ``run``).
    ``env_threads``: threads stepping envs (their tools) at once; default one per sub-env, at most 64.

    A sub-env whose step raises (not a tool's failure, which the env turns into a status and a
    message: a bug or an interrupt) stops the rollout: the other trajectories' requests are
    cancelled (vLLM aborts them), the steps already running finish (each bounded by its tools'
    timeouts), and the error propagates with a note naming the sub-env and turn.
    """
    if not (hasattr(backend, "agenerate") and hasattr(backend, "run")):
        raise TypeError(
            f"collect_async needs a backend with agenerate() and run() (AsyncVLLMBackend: rollout: async "
            f"with backend: vllm), got {type(backend).__name__}; use trainers.rollout.collect (rollout: "
            "lockstep) for this backend"
        )
    n = vec.num_envs
    if offset % group_size:
        raise ValueError(f"offset {offset} must be a multiple of group_size {group_size} (slices hold whole groups)")
    threads = min(n, 64) if env_threads is None else int(env_threads)
    if threads <= 0:
        raise ValueError(f"env_threads must be positive, got {env_threads}")
    times = AsyncRolloutTimes()
    t_start = time.perf_counter()
    obs, infos = vec.reset(
        seed=[seed + offset + i for i in range(n)],
        options={"task_indices": list(task_indices), "group_size": group_size, **(reset_options or {})},
    )
    t_reset = time.perf_counter() - t_start
    stop = list(infos[0]["stop_token_ids"])
    sampling = SamplingConfig(**{**sampling.__dict__, "stop_token_ids": stop})
    first = [np.asarray(obs["input_ids"][i]) for i in range(n)]
    pool = cf.ThreadPoolExecutor(threads, thread_name_prefix="rollout_async-env")
    clock = _Clock()

    def step_env(i: int, action: np.ndarray):
        env = vec.envs[i]
        action_checker(env)(action)
        return env.step(action)

    async def trajectory(i: int) -> Trajectory:
        loop = asyncio.get_running_loop()
        ids, lps, turn = first[i], {}, 0
        stop_strings = list(infos[i].get("stop_strings") or [])  # a scaffolded turn's (agent_gym/scaffold.py)
        while True:
            prompt = ids.tolist()
            clock.engine_start()
            try:
                g = await backend.agenerate(
                    prompt,
                    sampling,
                    turn_seed(seed, offset + i, turn),
                    **({"stop": stop_strings} if stop_strings else {}),
                )
            finally:
                clock.engine_stop()
            times.generated_tokens += len(g.token_ids)
            times.turns += 1
            for k, lp in enumerate(g.logprobs):
                lps[len(prompt) + k] = float(lp)
            clock.env_start()
            try:
                o, _, term, trunc, info = await loop.run_in_executor(
                    pool, step_env, i, np.asarray(g.token_ids, dtype=np.int64)
                )
            except BaseException as e:
                e.add_note(f"collect_async: sub-env {i}'s step of turn {turn} raised")
                raise
            finally:
                clock.env_stop()
            if term or trunc:
                vec.active[i] = False
                ep: Episode = info["trajectory"]
                slp = [0.0] * len(ep.token_ids)
                for pos, lp in lps.items():
                    slp[pos] = lp
                return Trajectory(ep, slp, (offset + i) // group_size)
            ids, turn = o["input_ids"], turn + 1
            stop_strings = list(info.get("stop_strings") or [])

    async def everyone() -> list[Trajectory]:
        try:
            async with asyncio.TaskGroup() as tg:  # one failing cancels the others (their requests aborted)
                tasks = [tg.create_task(trajectory(i)) for i in range(n)]
        except BaseExceptionGroup as group:
            raise group.exceptions[0] from None
        return [t.result() for t in tasks]

    try:
        trajs = backend.run(everyone())
    finally:
        pool.shutdown(wait=True)
    times.wall_s = time.perf_counter() - t_start
    times.generate_s = clock.engine.total
    times.env_s = clock.env_only + t_reset
    return trajs, times


class AsyncRollout(LocalRollout):
    """The rollout source of ``rollout.mode: async`` (``trainers.sources.RolloutSource``):
    ``collect_async`` over this process's ``ToolVectorEnv`` against the learner's backend, which
    ``trainers.sources.make_backend`` builds as an ``AsyncVLLMBackend`` for this mode (``rollout.vllm_kwargs``
    as for ``backend: vllm``). Evaluation's greedy (lockstep) episodes and the weight sync after each
    update go through the same engine (``LocalRollout``'s). ``metrics``: ``rollout/engine_busy`` of the
    last ``collect``."""

    def __init__(self, cfg: Any, *, env_factory: Any, policy: Any, backend: Any, parallel: Any):
        super().__init__(cfg, env_factory=env_factory, policy=policy, backend=backend, parallel=parallel)
        self._last: AsyncRolloutTimes | None = None

    def collect(
        self,
        task_indices: Sequence[int],
        group_size: int,
        sampling: SamplingConfig,
        seed: int,
        offset: int = 0,
        reset_options: dict[str, Any] | None = None,
    ) -> tuple[list[Trajectory], AsyncRolloutTimes]:
        trajs, self._last = collect_async(
            self.envs,
            self.backend,
            list(task_indices),
            group_size,
            sampling,
            seed=seed,
            offset=offset,
            reset_options=reset_options,
        )
        return trajs, self._last

    def metrics(self) -> dict[str, float]:
        return {} if self._last is None else {"rollout/engine_busy": self._last.engine_busy}
