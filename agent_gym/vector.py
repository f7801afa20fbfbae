"""``ToolVectorEnv``: a vector env for trainers.

It differs from Gymnasium's ``SyncVectorEnv`` where agent rollouts need it to:

- it steps only the *active* sub-envs: pass ``None`` as the action of a finished or idle env;
- ``reset(options=...)`` takes per-env tasks, or GRPO groups (the same task G times);
- it does not autoreset by default (an episode's end is where a trainer stops collecting);
- sub-env steps run on a thread pool, so tools that wait on I/O (an HTTP retriever) overlap.

Reset options (all optional)::

    {"task_indices": [k0, k1, ...]}          # one per env
    {"tasks": [row0, row1, ...]}             # one task dict per env
    {"task_indices": [k0, k1], "group_size": G}   # env i gets task k[i // G]; len(k) * G == num_envs

``info_format="gymnasium"`` (default) returns infos as Gymnasium's dict of arrays with ``_key``
masks; ``"list"`` returns one plain dict per env (``{}`` for an env that was not stepped), which
is what the trainer uses.

``step`` checks every slot's action before stepping any sub-env: a bad one raises (naming the
slot) and no sub-env is stepped, so the vector env is usable after. A sub-env is checked in its own
action space by :func:`agent_gym.wrappers.action_checker`: by a ``ToolEnv``'s or a view's
(``PaddedTokens``, ``TextView``, ``ChatView``) ``check_action``, looking through wrappers that
pass actions unchanged (those ``gym.make`` adds: ``OrderEnforcing``, ``PassiveEnvChecker``,
``TimeLimit``). A sub-env under a wrapper that changes or transforms actions and has no
``check_action`` is refused at construction (``TypeError``): its actions could only be checked by
stepping it. Observations are batched per key for dict observations (a tuple of arrays each) and as
a tuple otherwise (the text views).

A sub-env that raises while stepping does not lose its siblings' steps: every slot is stepped to
the end, every step that completed is recorded (its observation kept, an ended episode marked
inactive), and then :class:`VectorStepError` is raised carrying each slot's result or error. A
``KeyboardInterrupt`` (from a tool, or Ctrl-C while waiting) propagates as itself after the steps
already running finish and are recorded; no further slot is started, and ``partial_step`` holds the
same per-slot account.
"""

from __future__ import annotations

import concurrent.futures as cf
from typing import Any, Callable, Sequence

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import load_env_creator
from gymnasium.vector.utils import batch_space
from gymnasium.vector.vector_env import AutoresetMode

from agent_gym.env import ToolEnv
from agent_gym.wrappers import action_checker


class VectorStepError(RuntimeError):
    """Raised by :meth:`ToolVectorEnv.step` when a sub-env's step raised; the other slots' steps
    are kept, not thrown away.

    ``results``: ``{slot: (obs, reward, terminated, truncated, info)}`` of every slot that
    stepped (the vector env has recorded them: an episode that ended there is inactive);
    ``errors``: ``{slot: exception}`` of the slots that raised (a ``ToolEnv`` rolled its step
    back, so such a slot is still active and may be stepped again); ``not_stepped``: slots never
    started (after an interrupt). The first error is also the ``__cause__``."""

    def __init__(
        self,
        results: dict[int, tuple[Any, float, bool, bool, dict[str, Any]]],
        errors: dict[int, BaseException],
        not_stepped: list[int],
    ):
        self.results, self.errors, self.not_stepped = results, errors, sorted(not_stepped)
        what = "; ".join(f"sub-env {i}: {type(e).__name__}: {e}" for i, e in sorted(errors.items()))
        super().__init__(
            f"{what or 'interrupted'} (the results of sub-env(s) {sorted(results)} are kept in this error's "
            f".results and recorded by the vector env"
            + (f"; sub-env(s) {self.not_stepped} were not stepped" if self.not_stepped else "")
            + ")"
        )


class ToolVectorEnv(gym.vector.VectorEnv):
    def __init__(
        self,
        env_fns: Sequence[Callable[[], ToolEnv]],
        num_threads: int | None = None,
        autoreset: bool = False,
        info_format: str = "gymnasium",
    ):
        if not env_fns:
            raise ValueError("ToolVectorEnv needs at least one env")
        if info_format not in ("gymnasium", "list"):
            raise ValueError(f"info_format must be 'gymnasium' or 'list', got {info_format!r}")
        self.envs: list[ToolEnv] = [fn() for fn in env_fns]
        self.num_envs = len(self.envs)
        for i, env in enumerate(self.envs):
            try:
                action_checker(env)
            except TypeError as e:
                raise TypeError(f"sub-env {i} cannot be used in a ToolVectorEnv: {e}") from e
        self.autoreset = autoreset
        self.info_format = info_format
        self.metadata = {
            "autoreset_mode": AutoresetMode.NEXT_STEP if autoreset else AutoresetMode.DISABLED,
            "render_modes": ["ansi"],
        }
        first = self.envs[0].unwrapped
        self.single_observation_space = self.envs[0].observation_space
        self.single_action_space = self.envs[0].action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.render_mode = first.render_mode
        n = min(self.num_envs, 16) if num_threads is None else int(num_threads)
        self._pool = cf.ThreadPoolExecutor(n, thread_name_prefix="agent_gym-vec") if n > 0 else None
        self.active = np.zeros(self.num_envs, dtype=bool)
        self._last_obs: list[dict[str, np.ndarray]] = [{"input_ids": np.zeros(0, np.int64)}] * self.num_envs
        self._needs_reset = np.zeros(self.num_envs, dtype=bool)
        self.partial_step: VectorStepError | None = None

    @classmethod
    def from_entry_point(
        cls,
        entry_point: str,
        num_envs: int = 1,
        num_threads: int | None = None,
        autoreset: bool = False,
        info_format: str = "gymnasium",
        **env_kwargs: Any,
    ):
        if not isinstance(num_envs, int) or num_envs <= 0:
            raise ValueError(f"num_envs must be a positive integer, got {num_envs!r}")
        env_kwargs.pop("max_episode_steps", None)
        creator = load_env_creator(entry_point)
        return cls(
            [lambda: creator(**env_kwargs) for _ in range(num_envs)],
            num_threads=num_threads,
            autoreset=autoreset,
            info_format=info_format,
        )

    # -- API -----------------------------------------------------------------------------------

    def reset(self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None):
        seeds = self._seeds(seed)
        per_env = self._per_env_options(options or {})
        obs, infos = [], []
        for i, env in enumerate(self.envs):
            o, info = env.reset(seed=seeds[i], options=per_env[i])
            obs.append(o)
            infos.append(info)
        self._last_obs = obs
        self.active[:] = True
        self._needs_reset[:] = False
        return self._batch_obs(obs), self._infos(infos, range(self.num_envs))

    def step(self, actions: Sequence[Any]):
        if len(actions) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} actions (None for envs to skip), got {len(actions)}")
        idx = [i for i, a in enumerate(actions) if a is not None]
        # Check every action before stepping any sub-env: one bad slot must not step the others
        # and throw their results away.
        for i in idx:
            if not self.active[i]:
                raise RuntimeError(
                    f"sub-env {i} is not active (its episode ended); pass None as its action or reset it."
                )
            try:
                action_checker(self.envs[i])(actions[i])
            except (ValueError, RuntimeError) as e:
                kind = ValueError if isinstance(e, ValueError) else RuntimeError
                raise kind(f"action of sub-env {i}: {e} (no sub-env was stepped)") from e
        if self.autoreset:
            for i in np.flatnonzero(self._needs_reset):
                self._last_obs[i], _ = self.envs[i].reset()
                self.active[i] = True
                self._needs_reset[i] = False
        self.partial_step = None
        results, errors, not_stepped, interrupt = self._step_slots(idx, actions)
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terminated = np.zeros(self.num_envs, dtype=bool)
        truncated = np.zeros(self.num_envs, dtype=bool)
        infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        # Every slot that stepped is recorded, whatever happened to the others: an episode that
        # ended is inactive (and its result is in the return or the error), never lost.
        for i, (o, r, term, trunc, info) in results.items():
            self._last_obs[i] = o
            rewards[i], terminated[i], truncated[i], infos[i] = r, term, trunc, info
            if term or trunc:
                self.active[i] = False
                self._needs_reset[i] = self.autoreset
        if errors or interrupt is not None:
            err = VectorStepError(results, errors, not_stepped)
            self.partial_step = err
            if interrupt is not None:  # KeyboardInterrupt, SystemExit: propagate as they are
                interrupt.add_note(
                    f"ToolVectorEnv.step was interrupted: {err}; the slots that stepped are "
                    "recorded, their results are in the vector env's partial_step"
                )
                raise interrupt
            raise err from next(iter(errors.values()))
        return self._batch_obs(self._last_obs), rewards, terminated, truncated, self._infos(infos, idx)

    def _step_slots(self, idx: list[int], actions: Sequence[Any]):
        """Step every slot in ``idx`` (on the pool when there is more than one). Returns
        ``(results, errors, not_stepped, interrupt)``: the slots' step returns, the exceptions of
        the slots that raised, the slots never stepped, and the first ``BaseException`` that is no
        ``Exception`` (a ``KeyboardInterrupt`` raised by a slot or received while waiting). After
        an interrupt no slot is started; the ones already running are waited for (each is bounded
        by its tools' time limits), so what they did is recorded."""
        results: dict[int, tuple[Any, float, bool, bool, dict[str, Any]]] = {}
        errors: dict[int, BaseException] = {}
        not_stepped: list[int] = []
        interrupt: BaseException | None = None
        if self._pool is not None and len(idx) > 1:
            futures = {i: self._pool.submit(self.envs[i].step, actions[i]) for i in idx}
            try:
                cf.wait(futures.values())
            except BaseException as e:  # noqa: BLE001  (an interrupt in this thread: re-raised by step)
                interrupt = e
                for f in futures.values():
                    f.cancel()  # the ones not started
                cf.wait([f for f in futures.values() if not f.cancelled()])
            for i, f in futures.items():
                if f.cancelled():
                    not_stepped.append(i)
                elif f.exception() is not None:
                    errors[i] = f.exception()
                else:
                    results[i] = f.result()
        else:
            for i in idx:
                if interrupt is not None:
                    not_stepped.append(i)
                    continue
                try:
                    results[i] = self.envs[i].step(actions[i])
                except BaseException as e:  # noqa: BLE001  (re-raised by step)
                    errors[i] = e
                    if not isinstance(e, Exception):
                        interrupt = e
        if interrupt is None:
            interrupt = next((e for e in errors.values() if not isinstance(e, Exception)), None)
        return results, errors, not_stepped, interrupt

    def render(self) -> tuple[Any, ...] | None:
        return tuple(env.render() for env in self.envs)

    def close_extras(self, **kwargs: Any) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        for env in self.envs:
            env.close()

    # -- helpers ---------------------------------------------------------------------------------

    def _seeds(self, seed: int | Sequence[int | None] | None) -> list[int | None]:
        if seed is None:
            return [None] * self.num_envs
        if isinstance(seed, (int, np.integer)):
            return [int(seed) + i for i in range(self.num_envs)]
        seeds = list(seed)
        if len(seeds) != self.num_envs:
            raise ValueError(f"got {len(seeds)} seeds for {self.num_envs} envs")
        return seeds

    def _per_env_options(self, options: dict[str, Any]) -> list[dict[str, Any]]:
        """Each sub-env's reset options: its task (``tasks`` or ``task_indices``, in GRPO groups of
        ``group_size``) and ``scaffold_drop_prob``, passed to every sub-env (agent_gym/scaffold.py)."""
        unknown = set(options) - {"tasks", "task_indices", "group_size", "scaffold_drop_prob"}
        if unknown:
            raise ValueError(
                f"unknown reset option(s) {sorted(unknown)}; valid: 'tasks', 'task_indices', 'group_size', "
                "'scaffold_drop_prob'"
            )
        shared = {"scaffold_drop_prob": options["scaffold_drop_prob"]} if "scaffold_drop_prob" in options else {}
        # called as ToolVectorEnv._task_options so that RemoteVectorEnv (agent_gym/env_client.py), which borrows
        # this method, gets it too
        return [{**o, **shared} for o in ToolVectorEnv._task_options(self, options)]  # type: ignore[arg-type]

    def _task_options(self, options: dict[str, Any]) -> list[dict[str, Any]]:
        if "tasks" in options and "task_indices" in options:
            raise ValueError("pass either 'tasks' or 'task_indices', not both")
        g = int(options.get("group_size", 1))
        if g <= 0 or self.num_envs % g:
            raise ValueError(f"group_size {g} must be positive and divide num_envs={self.num_envs}")
        key = "tasks" if "tasks" in options else "task_indices" if "task_indices" in options else None
        if key is None:
            if g != 1:
                raise ValueError("group_size needs 'tasks' or 'task_indices'")
            return [{} for _ in range(self.num_envs)]
        items = list(options[key])
        if len(items) * g != self.num_envs:
            raise ValueError(f"{len(items)} {key} x group_size {g} != num_envs {self.num_envs}")
        single = "task" if key == "tasks" else "task_index"
        return [{single: items[i // g]} for i in range(self.num_envs)]

    @staticmethod
    def _batch_obs(obs: list[Any]) -> dict[str, tuple[Any, ...]] | tuple[Any, ...]:
        if obs and all(isinstance(o, dict) for o in obs):
            return {k: tuple(o[k] for o in obs) for k in obs[0]}
        return tuple(obs)

    def _infos(self, infos: list[dict[str, Any]], idx: Any) -> dict[str, Any] | list[dict[str, Any]]:
        if self.info_format == "list":
            full = [{} for _ in range(self.num_envs)]
            for i in idx:
                full[i] = infos[i]
            return full
        out: dict[str, Any] = {}
        for i in idx:
            out = self._add_info(out, infos[i], i)
        return out
