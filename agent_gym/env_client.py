"""The clients of the env server (``python -m agent_gym.serve``, :mod:`agent_gym.env_server`).

- :class:`AgentGymClient`: openenv-core's WebSocket client for this server (async; ``.sync()`` for a
  blocking one), speaking the wire types of :mod:`agent_gym.env_wire`;
- :class:`RemoteToolEnv`: one session called like the in-process env (blocking);
- :class:`RemoteVectorEnv`: ``n`` sessions behind :class:`agent_gym.vector.ToolVectorEnv`'s interface,
  what ``EnvFactory(server=URL).make_vector`` returns.

They raise :class:`AgentGymServerError` for a message the server refused (the session goes on), and
:class:`ConnectionError` when the connection is gone (a server restart: the session and its episode
are lost; connect again and reset).
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.request
from typing import Any

import numpy as np
from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from websockets.exceptions import ConnectionClosed

from agent_gym.env_wire import AgentGymAction, AgentGymObservation, AgentGymState
from agent_gym.vector import ToolVectorEnv, VectorStepError


class AgentGymServerError(RuntimeError):
    """The server refused a message (``code``: openenv-core's ``WSErrorCode``); the session goes on."""

    def __init__(self, message: str, code: str, data: dict[str, Any]):
        super().__init__(f"{message} (code: {code})")
        self.code, self.data = code, data


class AgentGymClient(EnvClient[AgentGymAction, AgentGymObservation, AgentGymState]):
    """openenv-core's WebSocket client for this server (async; ``.sync()`` for a blocking one).

        async with AgentGymClient(base_url="http://127.0.0.1:8000") as c:
            r = await c.reset(seed=0)
            r = await c.step(AgentGymAction(text="<answer>Paris</answer>"))

    ``step`` also takes a list of ids or a string. Errors: :class:`AgentGymServerError` for a refused
    message, :class:`ConnectionError` when the connection is gone (server stopped or restarted).
    """

    def _step_payload(self, action: Any) -> dict[str, Any]:
        if isinstance(action, str):
            action = AgentGymAction(text=action)
        elif not isinstance(action, (AgentGymAction, dict)):
            action = AgentGymAction(token_ids=np.asarray(action).tolist())
        if isinstance(action, dict):  # sent as is: the server validates it
            return action
        return action.model_dump(exclude_none=True, exclude={"metadata"})

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[AgentGymObservation]:
        obs = AgentGymObservation.model_validate(
            {**payload.get("observation", {}), "reward": payload.get("reward"), "done": payload.get("done", False)})
        return StepResult(observation=obs, reward=payload.get("reward"), done=bool(payload.get("done", False)))

    def _parse_state(self, payload: dict[str, Any]) -> AgentGymState:
        return AgentGymState.model_validate(payload)

    async def _send_and_receive(self, message: dict[str, Any]) -> dict[str, Any]:
        try:
            await self._send(message)
            response = await self._receive()
        except (ConnectionClosed, OSError) as e:
            self._ws = None
            raise ConnectionError(
                f"the connection to the agent_gym server at {self._ws_url} is gone ({type(e).__name__}: {e}); "
                "its session and episode are lost (the server stopped or restarted). Connect again and reset.") from e
        if response.get("type") == "error":
            data = response.get("data", {})
            msg = data.get("message", "unknown error")
            if data.get("errors"):
                msg += ": " + "; ".join(
                    (f"{'.'.join(map(str, e['loc']))}: " if e.get("loc") else "") + str(e.get("msg")) for e in data["errors"])
            raise AgentGymServerError(msg, str(data.get("code", "UNKNOWN")), data)
        return response


class RemoteToolEnv:
    """A served env called like the in-process one (blocking): ``reset`` gives ``(obs, info)``,
    ``step`` gives ``(obs, reward, terminated, truncated, info)``, ``obs = {"input_ids": int64 array}``
    (the full context, rebuilt from the deltas), and ``info["trajectory"]`` the ``Episode`` at the end.
    ``step`` takes ids (token-in/token-out) or a string (TextView's rules). ``text=True`` resets with
    ``view="text"``: the observation is then TextView's string instead of the ids dict."""

    def __init__(self, base_url: str, text: bool = False, message_timeout_s: float = 60.0):
        self.client = AgentGymClient(base_url=base_url, message_timeout_s=message_timeout_s).sync()
        self.client.connect()
        self.text = text
        self._ids: list[int] = []

    def _unpack(self, obs: AgentGymObservation, reset: bool) -> tuple[Any, dict[str, Any]]:
        self._ids = list(obs.token_ids) if reset else self._ids + list(obs.token_ids)
        if len(self._ids) != obs.num_tokens:
            raise RuntimeError(f"the rebuilt context has {len(self._ids)} ids, the server says {obs.num_tokens}: "
                               "an observation was lost; reset to resynchronize")
        info = dict(obs.info)
        if obs.episode is not None:
            info["trajectory"] = obs.episode
        out = obs.text if self.text else {"input_ids": np.asarray(self._ids, dtype=np.int64)}
        return out, info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        kw: dict[str, Any] = {k: v for k, v in (options or {}).items()}
        if seed is not None:
            kw["seed"] = seed
        if self.text:
            kw["view"] = "text"
        r = self.client.reset(**kw)
        return self._unpack(r.observation, reset=True)

    def step(self, action: Any):
        r = self.client.step(action)
        obs, info = self._unpack(r.observation, reset=False)
        return obs, r.reward, r.observation.terminated, r.observation.truncated, info

    def state(self) -> AgentGymState:
        return self.client.state()

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> "RemoteToolEnv":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class RemoteVectorEnv:
    """``n`` sessions on one server behind :class:`agent_gym.vector.ToolVectorEnv`'s interface, as the
    project's rollout loop (``trainers.rollout.collect``) uses it: ``reset(seed=[...], options=...)``
    with the same per-env options (``task_indices``/``tasks``, ``group_size``), ``step(actions)`` with
    ``None`` for a finished slot, no autoreset, infos as one dict per slot (``info_format="list"``),
    ``obs["input_ids"]`` a tuple of int64 arrays. The active slots step concurrently (openenv-core's
    async client, one connection each, on one background event loop). A slot the server refuses
    leaves it as it was (the env's step is transactional); the slots that stepped are recorded, then
    :class:`agent_gym.vector.VectorStepError` is raised with every slot's result or error."""

    info_format = "list"
    autoreset = False

    def __init__(self, base_url: str, num_envs: int, message_timeout_s: float = 120.0):
        if not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs must be a positive integer, got {num_envs!r}")
        self.num_envs = num_envs
        self.base_url = base_url.rstrip("/")
        self.message_timeout_s = message_timeout_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="agent_gym-remote-vec", daemon=True)
        self._thread.start()
        self.clients = [AgentGymClient(base_url=base_url, message_timeout_s=message_timeout_s) for _ in range(num_envs)]
        self._ids: list[list[int]] = [[] for _ in range(num_envs)]
        self.active = np.zeros(num_envs, dtype=bool)
        try:
            self._run(*(c.connect() for c in self.clients))
        except BaseException:
            self.close()
            raise

    def _run(self, *coros: Any, return_exceptions: bool = False) -> list[Any]:
        async def gather():
            return await asyncio.gather(*coros, return_exceptions=return_exceptions)

        return asyncio.run_coroutine_threadsafe(gather(), self._loop).result()

    def _obs(self) -> dict[str, tuple[np.ndarray, ...]]:
        return {"input_ids": tuple(np.asarray(ids, dtype=np.int64) for ids in self._ids)}

    def num_tasks(self) -> int:
        """The served env's task count (``GET /agent_gym/env``); ``NotImplementedError`` if it has no fixed set."""
        with urllib.request.urlopen(self.base_url + "/agent_gym/env", timeout=min(self.message_timeout_s, 30.0)) as r:
            n = json.load(r).get("num_tasks")
        if n is None:
            raise NotImplementedError(f"the env served at {self.base_url} has no fixed task set")
        return int(n)

    def _take(self, i: int, obs: AgentGymObservation, reset: bool) -> dict[str, Any]:
        self._ids[i] = list(obs.token_ids) if reset else self._ids[i] + list(obs.token_ids)
        if len(self._ids[i]) != obs.num_tokens:
            raise RuntimeError(f"slot {i}: the rebuilt context has {len(self._ids[i])} ids, the server says "
                               f"{obs.num_tokens}; reset to resynchronize")
        info = dict(obs.info)
        if obs.episode is not None:
            info["trajectory"] = obs.episode
        return info

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None):
        # ToolVectorEnv's own option rules (they read only num_envs), so both vector envs agree.
        seeds = ToolVectorEnv._seeds(self, seed)  # type: ignore[arg-type]
        per_env = ToolVectorEnv._per_env_options(self, options or {})  # type: ignore[arg-type]
        results = self._run(*(c.reset(**({"seed": seeds[i]} if seeds[i] is not None else {}), **per_env[i])
                              for i, c in enumerate(self.clients)))
        infos = [self._take(i, r.observation, reset=True) for i, r in enumerate(results)]
        self.active[:] = True
        return self._obs(), infos

    def step(self, actions: Any):
        if len(actions) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} actions (None for envs to skip), got {len(actions)}")
        idx = [i for i, a in enumerate(actions) if a is not None]
        for i in idx:
            if not self.active[i]:
                raise RuntimeError(f"sub-env {i} is not active (its episode ended); pass None as its action or reset it.")
        outs = self._run(*(self.clients[i].step(actions[i]) for i in idx), return_exceptions=True)
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terminated = np.zeros(self.num_envs, dtype=bool)
        truncated = np.zeros(self.num_envs, dtype=bool)
        infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        results: dict[int, Any] = {}
        errors: dict[int, BaseException] = {}
        for i, out in zip(idx, outs):
            if isinstance(out, BaseException):
                errors[i] = out
                continue
            o = out.observation
            infos[i] = self._take(i, o, reset=False)
            rewards[i], terminated[i], truncated[i] = float(out.reward), o.terminated, o.truncated
            self.active[i] = not o.done
            results[i] = ({"input_ids": np.asarray(self._ids[i], dtype=np.int64)}, rewards[i], o.terminated,
                          o.truncated, infos[i])
        if errors:
            raise VectorStepError(results, errors, []) from next(iter(errors.values()))
        return self._obs(), rewards, terminated, truncated, infos

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._run(*(c.close() for c in self.clients), return_exceptions=True)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()

    def __enter__(self) -> "RemoteVectorEnv":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = ["AgentGymClient", "AgentGymServerError", "RemoteToolEnv", "RemoteVectorEnv"]
