"""The clients of the env server (``python -m agent_gym.serve``, :mod:`agent_gym.env_server`).

- :class:`AgentGymClient`: openenv-core's WebSocket client for this server (async; ``.sync()`` for a
  blocking one), speaking the wire types of :mod:`agent_gym.env_wire`;
- :class:`RemoteToolEnv`: one session called like the in-process env (blocking);
- :class:`RemoteVectorEnv`: ``n`` sessions behind :class:`agent_gym.vector.ToolVectorEnv`'s interface,
  what ``EnvFactory(server=URL).make_vector`` returns.

They raise :class:`AgentGymServerError` for a message the server refused (the session goes on),
:class:`EnvServerGoneError` (a ``ConnectionError``) when the connection is gone (the server stopped,
crashed or restarted: the session and its episode are lost; connect again and reset), and
:class:`EnvServerFullError` (a ``ConnectionError`` too) when the server has no room for the sessions
asked for: it allows ``--max-concurrent-envs`` at once (``GET /agent_gym/sessions``), which
``RemoteVectorEnv`` checks before it opens its ``n`` sessions. Both errors are the project's
:class:`~agent_gym.cli_errors.UserError`: a command prints them as one line (exit status 2).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import numpy as np
from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from websockets.exceptions import ConnectionClosed

from agent_gym.cli_errors import UserError
from agent_gym.env_wire import AgentGymAction, AgentGymObservation, AgentGymState
from agent_gym.vector import ToolVectorEnv, VectorStepError

SESSIONS_HINT = "a trainer opens rollout.tasks_per_iter * rollout.group_size of them"
"""What needs the sessions, in the messages of :class:`EnvServerFullError`: the trainer's batch."""


class AgentGymServerError(RuntimeError):
    """The server refused a message (``code``: openenv-core's ``WSErrorCode``); the session goes on."""

    def __init__(self, message: str, code: str, data: dict[str, Any]):
        super().__init__(f"{message} (code: {code})")
        self.code, self.data = code, data


class EnvServerGoneError(UserError, ConnectionError):
    """The connection to the env server is gone (it stopped, crashed or restarted): the sessions
    and the episodes in them are lost. ``url``: the server's ``http://host:port``; ``reason``: what
    the connection said (``ConnectionClosedError: no close frame received or sent``)."""

    def __init__(self, message: str, url: str, reason: str = ""):
        super().__init__(message)
        self.url, self.reason = url, reason


class EnvServerFullError(UserError, ConnectionError):
    """The env server has no room for the sessions asked for: it allows ``limit`` at once
    (``python -m agent_gym.serve --max-concurrent-envs``), ``open`` were open, ``needed`` asked for
    (None where one session was refused)."""

    def __init__(self, message: str, url: str, limit: int | None, open: int | None, needed: int | None = None):
        super().__init__(message)
        self.url, self.limit, self.open, self.needed = url, limit, open, needed


class _NoRetry(Exception):
    """Wraps an error that a reconnect must not retry (``args[0]``, raised in its place)."""


def _http_url(ws_url: str) -> str:
    """``ws://host:port/ws`` as ``http://host:port``."""
    base = ws_url[: -len("/ws")] if ws_url.endswith("/ws") else ws_url
    return "http" + base[len("ws") :] if base.startswith("ws") else base


def _full_message(url: str, limit: Any, open_now: Any, refused: int | None = None, needed: int | None = None) -> str:
    """A refused session's message (``refused`` of ``needed`` when a vector env's were refused)."""
    what = "a session" if refused is None else f"{refused} of the {needed} sessions this run opened"
    return (
        f"env server {url} refused {what}: it is at its limit of {limit} sessions ({open_now} open). Restart it "
        f"with a larger --max-concurrent-envs, or need fewer sessions: {SESSIONS_HINT} (another client may "
        "have opened sessions since this one looked)"
    )


async def _last_reply(ws: Any) -> dict[str, Any] | None:
    """The error the server sent before closing the connection ``ws`` (it answers CAPACITY_REACHED
    and closes), if one is waiting there unread; None otherwise. A closed connection still hands
    out the messages it had received."""
    if ws is None:
        return None
    try:
        raw = await asyncio.wait_for(ws.recv(), timeout=0.5)
        reply = json.loads(raw)
    except Exception:  # nothing was waiting (ConnectionClosed, a timeout) or it is no JSON
        return None
    if isinstance(reply, dict) and reply.get("type") == "error" and isinstance(reply.get("data"), dict):
        return reply["data"]
    return None


async def _close_quietly(ws: Any) -> None:
    """Close ``ws`` if it is not closed yet (1 s at most); errors ignored: it is being dropped."""
    if ws is None:
        return
    try:
        await asyncio.wait_for(ws.close(), timeout=1.0)
    except Exception:
        pass


class AgentGymClient(EnvClient[AgentGymAction, AgentGymObservation, AgentGymState]):
    """openenv-core's WebSocket client for this server (async; ``.sync()`` for a blocking one).

        async with AgentGymClient(base_url="http://127.0.0.1:8000") as c:
            r = await c.reset(seed=0)
            r = await c.step(AgentGymAction(text="<answer>Paris</answer>"))

    ``step`` also takes a list of ids or a string. Errors: :class:`AgentGymServerError` for a refused
    message, :class:`EnvServerGoneError` (a ``ConnectionError``) when the connection is gone (server
    stopped or restarted; the next call opens a new session), :class:`EnvServerFullError` when the
    server refused the session for capacity (it answers ``CAPACITY_REACHED`` and closes the connection).
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
            {**payload.get("observation", {}), "reward": payload.get("reward"), "done": payload.get("done", False)}
        )
        return StepResult(observation=obs, reward=payload.get("reward"), done=bool(payload.get("done", False)))

    def _parse_state(self, payload: dict[str, Any]) -> AgentGymState:
        return AgentGymState.model_validate(payload)

    async def _send_and_receive(self, message: dict[str, Any]) -> dict[str, Any]:
        try:
            await self._send(message)
            response = await self._receive()
        except (ConnectionClosed, OSError) as e:
            ws, self._ws = self._ws, None
            refusal = await _last_reply(ws)  # a server at capacity answers CAPACITY_REACHED, then closes
            await _close_quietly(ws)  # after a timeout the server may still hold the session: let it go
            if refusal is not None and refusal.get("code") == "CAPACITY_REACHED":
                raise self._full(refusal) from e
            reason = (
                f"no reply within message_timeout_s={self._message_timeout} s"
                if isinstance(e, TimeoutError)
                else f"{type(e).__name__}: {e}"
            )
            raise EnvServerGoneError(
                f"the connection to the agent_gym server at {self._ws_url} is gone ({reason}); "
                "its session and episode are lost (the server stopped or restarted). Connect again and reset.",
                _http_url(self._ws_url),
                reason,
            ) from e
        if response.get("type") == "error":
            data = response.get("data", {})
            if data.get("code") == "CAPACITY_REACHED":  # and the server closes the connection
                ws, self._ws = self._ws, None
                await _close_quietly(ws)
                raise self._full(data)
            msg = data.get("message", "unknown error")
            if data.get("errors"):
                msg += ": " + "; ".join(
                    (f"{'.'.join(map(str, e['loc']))}: " if e.get("loc") else "") + str(e.get("msg"))
                    for e in data["errors"]
                )
            raise AgentGymServerError(msg, str(data.get("code", "UNKNOWN")), data)
        return response

    def _full(self, data: dict[str, Any]) -> EnvServerFullError:
        url = _http_url(self._ws_url)
        limit, active = data.get("max_sessions"), data.get("active_sessions")
        return EnvServerFullError(_full_message(url, limit, active), url, limit, active)


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
            raise RuntimeError(
                f"the rebuilt context has {len(self._ids)} ids, the server says {obs.num_tokens}: "
                "an observation was lost; reset to resynchronize"
            )
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

    def __enter__(self) -> RemoteToolEnv:
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
    :class:`agent_gym.vector.VectorStepError` is raised with every slot's result or error.

    Before it opens its sessions it reads ``GET /agent_gym/sessions`` and refuses, with
    :class:`EnvServerFullError` naming the numbers, ``num_envs`` sessions the server has no room for
    (its ``--max-concurrent-envs`` less the sessions open); a session refused for capacity anyway
    (another client came first) raises it too, on the reset.

    A server that is gone (stopped, SIGKILLed, restarted: every session lost) raises
    :class:`EnvServerGoneError` naming its URL, at once with ``reconnect_s=0`` (the default). With
    ``reconnect_s > 0`` the call instead waits up to that long (retrying with backoff: 0.25 s,
    doubling to 4 s) for a server at the same URL that serves the same envs (``GET /agent_gym/env``)
    and has room, opens ``num_envs`` new sessions there and replays each episode in flight: the
    reset it had (seed, task) and the actions stepped so far, whose observations must rebuild the
    same context token for token (else :class:`EnvServerGoneError` says the restarted server's env
    differs). Then the call goes on, so the caller gets the results the first server would have
    given (``reconnects`` counts the reconnections). A server that does not come back in time
    raises :class:`EnvServerGoneError`."""

    info_format = "list"
    autoreset = False
    MAX_RECONNECTS_PER_CALL = 3
    """A call that loses the server more often than this raises instead of trying again."""

    def __init__(self, base_url: str, num_envs: int, message_timeout_s: float = 120.0, reconnect_s: float = 0.0):
        if not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs must be a positive integer, got {num_envs!r}")
        if isinstance(reconnect_s, bool) or not isinstance(reconnect_s, (int, float)) or reconnect_s < 0:
            raise ValueError(f"reconnect_s must be a number of seconds >= 0 (0: no reconnect), got {reconnect_s!r}")
        self.num_envs = num_envs
        self.base_url = base_url.rstrip("/")
        self.message_timeout_s = message_timeout_s
        self.reconnect_s = float(reconnect_s)
        self.reconnects = 0
        """How many times this vector env reconnected to a restarted server (``reconnect_s``)."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="agent_gym-remote-vec", daemon=True)
        self._thread.start()
        self.clients: list[AgentGymClient] = []
        self._ids: list[list[int]] = [[] for _ in range(num_envs)]
        self._history: list[tuple[dict[str, Any], list[Any]] | None] = [None] * num_envs
        """Each slot's episode: its reset arguments and the actions stepped since (what a reconnect replays)."""
        self.active = np.zeros(num_envs, dtype=bool)
        try:
            self._env_info = self._get("/agent_gym/env") if self.reconnect_s > 0 else None
            self._check_room()
            self.clients = self._connect()
        except BaseException:
            self.close()
            raise

    # -- the server ----------------------------------------------------------------------------

    def _get(self, path: str, timeout_s: float = 30.0) -> dict[str, Any]:
        """``GET base_url + path`` as JSON; :class:`EnvServerGoneError` when nothing answers there."""
        try:
            with urllib.request.urlopen(self.base_url + path, timeout=min(self.message_timeout_s, timeout_s)) as r:
                return json.load(r)
        except urllib.error.HTTPError:
            raise
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = f"{type(getattr(e, 'reason', e)).__name__}: {getattr(e, 'reason', e)}"
            raise EnvServerGoneError(
                f"env server {self.base_url} does not answer (GET {path}: {reason}); start it (python -m "
                "agent_gym.serve ENV_ID --host HOST --port PORT) or fix the URL",
                self.base_url,
                reason,
            ) from e

    def _check_room(self) -> None:
        """Refuse (:class:`EnvServerFullError`) ``num_envs`` sessions the server has no room for. A
        server without the numbers (another build) is not checked: its refusals still name the cause."""
        try:
            table = self._get("/agent_gym/sessions")
        except urllib.error.HTTPError:
            return
        limit = table.get("max_concurrent_envs")
        open_now = table.get("sessions") if isinstance(table.get("sessions"), int) else table.get("open_envs")
        if not isinstance(limit, int) or not isinstance(open_now, int) or open_now + self.num_envs <= limit:
            return
        room = limit - open_now
        fewer = (
            f"so make that at most {room}" if room > 0 else "and there is no room left until the other sessions close"
        )
        raise EnvServerFullError(
            f"env server {self.base_url} cannot open the {self.num_envs} sessions this run needs (one per env): it "
            f"allows {limit} at once (python -m agent_gym.serve --max-concurrent-envs {limit}) and {open_now} are "
            f"open. Restart it with --max-concurrent-envs {open_now + self.num_envs} or more, or need fewer "
            f"sessions: {SESSIONS_HINT}, {fewer}",
            self.base_url,
            limit,
            open_now,
            self.num_envs,
        )

    def _connect(self) -> list[AgentGymClient]:
        """``num_envs`` connected clients (sessions); none left open if one fails."""
        clients = [
            AgentGymClient(base_url=self.base_url, message_timeout_s=self.message_timeout_s)
            for _ in range(self.num_envs)
        ]
        try:
            self._run(*(c.connect() for c in clients))
        except BaseException:
            self._run(*(c.close() for c in clients), return_exceptions=True)
            raise
        return clients

    def _run(self, *coros: Any, return_exceptions: bool = False) -> list[Any]:
        async def gather():
            return await asyncio.gather(*coros, return_exceptions=return_exceptions)

        return asyncio.run_coroutine_threadsafe(gather(), self._loop).result()

    def _gone(self, e: BaseException, waited: float | None = None) -> EnvServerGoneError:
        reason = getattr(e, "reason", "") or f"{type(e).__name__}: {e}"
        late = "" if waited is None else f" and did not come back within reconnect_s={waited} s"
        return EnvServerGoneError(
            f"env server {self.base_url} is gone ({reason}){late}: its sessions and the episodes in them are lost. "
            "Restart it (python -m agent_gym.serve with the same env, env kwargs and port) and start those "
            "episodes again",
            self.base_url,
            reason,
        )

    def _raise_refusals(self, errors: dict[int, BaseException]) -> None:
        """Raise :class:`EnvServerFullError` if the server refused some slots' sessions for capacity."""
        full = [e for e in errors.values() if isinstance(e, EnvServerFullError)]
        if full:
            raise EnvServerFullError(
                _full_message(self.base_url, full[0].limit, full[0].open, len(full), self.num_envs),
                self.base_url,
                full[0].limit,
                full[0].open,
                self.num_envs,
            ) from full[0]

    def _lost(self, errors: dict[int, BaseException], attempts: int) -> bool:
        """Whether the server is gone for some slot of ``errors``: then reconnect (True: call again)
        or raise :class:`EnvServerGoneError`. False: no slot lost its connection."""
        gone = next((e for e in errors.values() if isinstance(e, ConnectionError)), None)
        if gone is None:
            return False
        if self.reconnect_s <= 0 or attempts >= self.MAX_RECONNECTS_PER_CALL:
            raise self._gone(gone) from gone
        self._reconnect(gone)
        return True

    def _reconnect(self, cause: BaseException) -> None:
        """Wait up to ``reconnect_s`` for the server (the same envs, room for ``num_envs``), open new
        sessions there and replay the episodes in flight (:meth:`_replay`); tries again, with
        backoff, while the server does not answer or is lost again."""
        self._run(*(c.close() for c in self.clients), return_exceptions=True)
        end = time.monotonic() + self.reconnect_s
        delay = 0.25
        while True:
            try:
                info = self._get("/agent_gym/env", timeout_s=max(end - time.monotonic(), 1.0))
                if info != self._env_info:
                    before = self._env_info or {}
                    raise _NoRetry(
                        EnvServerGoneError(
                            f"env server {self.base_url} came back serving other envs ({info.get('env_id')!r}, env kwargs "
                            f"{info.get('env_kwargs')}; before: {before.get('env_id')!r}, {before.get('env_kwargs')}): "
                            "the episodes in flight cannot go on there. Restart it with this run's env and env kwargs",
                            self.base_url,
                        )
                    )
                self._check_room()
                self.clients = self._connect()
                self._replay()
                break
            except _NoRetry as e:
                raise e.args[0] from cause
            except EnvServerFullError:
                raise
            except (ConnectionError, OSError) as e:  # not up yet (or not accepting), or lost again
                err: BaseException = e
                if self.clients:
                    self._run(*(c.close() for c in self.clients), return_exceptions=True)
            now = time.monotonic()
            if now >= end:
                raise self._gone(cause, waited=self.reconnect_s) from err
            time.sleep(min(delay, end - now))
            delay = min(2 * delay, 4.0)
        self.reconnects += 1

    def _replay(self) -> None:
        """Each active slot's episode on its new session: the same reset, the same actions; the
        rebuilt context must be the one the lost session had."""
        slots = [i for i in range(self.num_envs) if self.active[i] and self._history[i] is not None]

        async def replay(i: int) -> list[int]:
            kwargs, actions = self._history[i]  # type: ignore[misc]
            r = await self.clients[i].reset(**kwargs)
            ids = list(r.observation.token_ids)
            for a in actions:
                r = await self.clients[i].step(a)
                ids += list(r.observation.token_ids)
            return ids

        rebuilt = self._run(*(replay(i) for i in slots), return_exceptions=True)
        lost = next((r for r in rebuilt if isinstance(r, ConnectionError)), None)
        if lost is not None:  # gone again: the reconnect tries again
            raise lost
        for i, ids in zip(slots, rebuilt):
            if isinstance(ids, BaseException):  # the new server refused a replayed reset or action
                raise _NoRetry(
                    EnvServerGoneError(
                        f"env server {self.base_url} came back, but replaying slot {i}'s episode there failed "
                        f"({type(ids).__name__}: {ids}): its env is not the one that was lost; start those episodes "
                        "again",
                        self.base_url,
                    )
                )
            if ids != self._ids[i]:
                raise _NoRetry(
                    EnvServerGoneError(
                        f"env server {self.base_url} came back, but replaying slot {i}'s episode there (the same reset "
                        f"and {len(self._history[i][1])} actions) rebuilt another context ({len(ids)} ids, not "  # type: ignore[index]
                        f"{len(self._ids[i])}): its env is not the one that was lost (other env kwargs, or an env that "
                        "is not reproducible from its seed); start those episodes again",
                        self.base_url,
                    )
                )

    # -- the vector env ------------------------------------------------------------------------

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
            raise RuntimeError(
                f"slot {i}: the rebuilt context has {len(self._ids[i])} ids, the server says "
                f"{obs.num_tokens}; reset to resynchronize"
            )
        info = dict(obs.info)
        if obs.episode is not None:
            info["trajectory"] = obs.episode
        return info

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None):
        # ToolVectorEnv's own option rules (they read only num_envs), so both vector envs agree.
        seeds = ToolVectorEnv._seeds(self, seed)  # type: ignore[arg-type]
        per_env = ToolVectorEnv._per_env_options(self, options or {})  # type: ignore[arg-type]
        kwargs = [{**({"seed": seeds[i]} if seeds[i] is not None else {}), **per_env[i]} for i in range(self.num_envs)]
        self.active[:] = False
        self._history = [None] * self.num_envs
        attempts = 0
        while True:
            results = self._run(*(c.reset(**kwargs[i]) for i, c in enumerate(self.clients)), return_exceptions=True)
            errors = {i: r for i, r in enumerate(results) if isinstance(r, BaseException)}
            if not errors:
                break
            self._raise_refusals(errors)
            if not self._lost(errors, attempts):
                raise next(iter(errors.values()))
            attempts += 1
        infos = [self._take(i, r.observation, reset=True) for i, r in enumerate(results)]
        self._history = [(kwargs[i], []) for i in range(self.num_envs)]
        self.active[:] = True
        return self._obs(), infos

    def step(self, actions: Any):
        if len(actions) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} actions (None for envs to skip), got {len(actions)}")
        idx = [i for i, a in enumerate(actions) if a is not None]
        for i in idx:
            if not self.active[i]:
                raise RuntimeError(
                    f"sub-env {i} is not active (its episode ended); pass None as its action or reset it."
                )
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terminated = np.zeros(self.num_envs, dtype=bool)
        truncated = np.zeros(self.num_envs, dtype=bool)
        infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        results: dict[int, Any] = {}
        pending, attempts = idx, 0
        while True:
            outs = self._run(*(self.clients[i].step(actions[i]) for i in pending), return_exceptions=True)
            errors: dict[int, BaseException] = {}
            for i, out in zip(pending, outs):
                if isinstance(out, BaseException):
                    errors[i] = out
                    continue
                o = out.observation
                infos[i] = self._take(i, o, reset=False)
                if self._history[i] is not None:
                    a = actions[i]
                    self._history[i][1].append(a if isinstance(a, (str, dict)) else np.array(a, copy=True))  # type: ignore[index]
                rewards[i], terminated[i], truncated[i] = float(out.reward), o.terminated, o.truncated
                self.active[i] = not o.done
                results[i] = (
                    {"input_ids": np.asarray(self._ids[i], dtype=np.int64)},
                    rewards[i],
                    o.terminated,
                    o.truncated,
                    infos[i],
                )
            if not errors:
                break
            self._raise_refusals(errors)
            if not self._lost(errors, attempts):  # the server refused some slots' actions: they are as they were
                raise VectorStepError(results, errors, []) from next(iter(errors.values()))
            pending, attempts = sorted(errors), attempts + 1
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

    def __enter__(self) -> RemoteVectorEnv:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = [
    "AgentGymClient",
    "AgentGymServerError",
    "EnvServerFullError",
    "EnvServerGoneError",
    "RemoteToolEnv",
    "RemoteVectorEnv",
]
