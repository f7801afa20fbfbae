"""The server and clients behind ``python -m agent_gym.serve`` (openenv-core's; import them from
:mod:`agent_gym.serve`, whose module docstring is the reference: wire types, errors, the HTTP and
WebSocket rules).

Kept apart from :mod:`agent_gym.serve` so that the command line parses its arguments (``--help``, a
bad flag) before this module's imports: openenv-core's package imports gradio and FastMCP, seconds
of start-up that a ``--help`` does not need.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
from typing import Any, Literal, Optional

import numpy as np
from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from openenv.core.env_server import Action, Environment, Observation, State, create_app

from agent_gym.cli_errors import registered_ids_hint
from agent_gym.episode import Episode
from agent_gym.factory import jsonable as _jsonable  # (tests import the old name)

log = logging.getLogger("agent_gym.serve")

# -- wire types ------------------------------------------------------------------------------------


class AgentGymAction(Action):
    """One assistant turn: exactly one of ``token_ids`` or ``text``."""

    token_ids: Optional[list[int]] = Field(
        default=None, description="the ids of one assistant turn, stop token included (appended verbatim)")
    text: Optional[str] = Field(
        default=None, description="the reply text; encoded as one turn and closed with the end-of-turn token (TextView)")

    @model_validator(mode="after")
    def _one_kind(self) -> "AgentGymAction":
        if (self.token_ids is None) == (self.text is None):
            # Not a ValueError: openenv-core 0.3.0 sends pydantic's ``errors()`` as JSON, and a
            # ValueError there (in ``ctx``) cannot be serialized, so the server would drop the session.
            raise PydanticCustomError(
                "action_kind", "an action has exactly one of 'token_ids' (a list of int ids) or 'text' (a string); "
                "got {got}", {"got": "both" if self.token_ids is not None else "neither"})
        return self


class AgentGymObservation(Observation):
    """What the env returns after a reset or a step (see the module docstring for ``token_ids``)."""

    token_ids: list[int] = Field(description="ids appended since the session's previous observation "
                                             "(after a reset: the whole prompt)")
    num_tokens: int = Field(description="length of the whole context (the full input_ids)")
    text: Optional[str] = Field(default=None, description="the whole context decoded (view='text' sessions only)")
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = Field(default_factory=dict, description="the env's info, JSON-safe, without 'trajectory'")
    episode: Optional[Episode] = Field(default=None, description="the finished episode, on its last step only")


class AgentGymState(State):
    env_id: str
    task_id: Optional[str] = None
    task_index: Optional[int] = None
    turn: int = 0
    num_tokens: int = 0
    done: bool = True


# -- the server side -------------------------------------------------------------------------------


class AgentGymEnvironment(Environment[AgentGymAction, AgentGymObservation, AgentGymState]):
    """One session's env: ``gym.make(env_id, **env_kwargs)`` behind openenv-core's ``Environment``.

    ``open_envs()`` counts the instances not yet closed; openenv-core closes a session's env when the
    session ends, so it is the number of live sessions (plus any throwaway env of a stateless HTTP
    call in flight). ``GET /agent_gym/sessions`` reports it.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True  # each session has its own gym env; nothing mutable is shared

    _open = 0
    _closed_total = 0
    _open_lock = threading.Lock()

    def __init__(self, env_id: str, env_kwargs: dict[str, Any] | None = None):
        super().__init__()
        import agent_gym  # noqa: F401  (registers the ids)
        from agent_gym.factory import EnvFactory
        from agent_gym.wrappers import TextView

        self.env_id = env_id
        self.env = EnvFactory(env_id, env_kwargs).make()
        self.text_view = TextView(self.env)
        self.tool_env = self.text_view.tool_env
        self.view: str = "tokens"
        self._sent = 0  # ids of the context already sent to the client
        self._info: dict[str, Any] = {}
        self._closed = False
        with AgentGymEnvironment._open_lock:
            AgentGymEnvironment._open += 1

    @classmethod
    def open_envs(cls) -> int:
        return cls._open

    def _observation(self, reward: float | None, terminated: bool, truncated: bool,
                     info: dict[str, Any]) -> AgentGymObservation:
        ids = self.tool_env._obs()["input_ids"].tolist()
        delta, self._sent = ids[self._sent:], len(ids)
        episode = info.pop("trajectory", None)
        return AgentGymObservation(
            token_ids=delta, num_tokens=len(ids),
            text=self.text_view._text({"input_ids": ids}) if self.view == "text" else None,
            reward=reward, done=bool(terminated or truncated), terminated=bool(terminated), truncated=bool(truncated),
            info=_jsonable(info), episode=episode)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, task_index: Optional[int] = None,
              task: Optional[dict[str, Any]] = None, view: Literal["tokens", "text"] = "tokens",
              **kwargs: Any) -> AgentGymObservation:
        """``seed``, and ``task_index`` or ``task`` (the env's reset options); ``view`` "text" adds
        TextView's text to every observation of the episode. Anything else is refused by name."""
        if kwargs:
            raise ValueError(f"unknown reset argument(s) {sorted(kwargs)}; valid: seed, task_index, task, view, episode_id")
        if view not in ("tokens", "text"):
            raise ValueError(f"view must be 'tokens' or 'text', got {view!r}")
        options = {k: v for k, v in (("task_index", task_index), ("task", task)) if v is not None}
        _, info = self.env.reset(seed=seed, options=options or None)
        self.view, self._sent = view, 0
        return self._observation(None, False, False, info)

    def step(self, action: AgentGymAction, timeout_s: Optional[float] = None, **kwargs: Any) -> AgentGymObservation:
        if action.text is not None:
            _, reward, term, trunc, info = self.text_view.step(action.text)
        else:
            _, reward, term, trunc, info = self.env.step(np.asarray(action.token_ids, dtype=np.int64))
        return self._observation(float(reward), term, trunc, info)

    @property
    def state(self) -> AgentGymState:
        te = self.tool_env
        task = getattr(te, "task", None)
        return AgentGymState(env_id=self.env_id, task_id=None if task is None else str(task.get("id", te.task_index)),
                             task_index=getattr(te, "task_index", None), turn=getattr(te, "turn", 0),
                             num_tokens=len(te._ids), done=bool(te._done), step_count=getattr(te, "turn", 0))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.env.close()
        with AgentGymEnvironment._open_lock:
            AgentGymEnvironment._open -= 1
            AgentGymEnvironment._closed_total += 1
            trim = AgentGymEnvironment._closed_total % TRIM_EVERY == 0
        if trim:
            trim_heap()


TRIM_EVERY = 64
"""Every this many envs closed, :func:`trim_heap` (benchmarks/serve_soak.py: the server's RSS then stays flat)."""


@functools.lru_cache(maxsize=1)
def _malloc_trim() -> Any:
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to trim
        return None


def trim_heap() -> bool:
    """Give the C heap's free pages back to the OS (glibc's ``malloc_trim(0)``; False elsewhere).

    Each session builds an env (tokenizer, numpy buffers) in a thread of its own (openenv-core
    gives every session a one-thread executor) and frees it at the close; glibc keeps the freed
    pages in its per-thread arenas, so RSS crept up with the sessions played (+1 MiB per 1,000 after
    a warm-up of ~15 MiB) although the memory in use stayed flat (``mallinfo2``: no leak).
    Trimming every :data:`TRIM_EVERY` closes takes a few milliseconds in the closing session's
    thread, off the event loop."""
    fn = _malloc_trim()
    if fn is None:
        return False
    fn(0)
    return True


def settle_heap() -> None:
    """For the server process, once its app is built: collect, then freeze the start-up objects
    (openenv-core, gradio, FastMCP, the env's modules: ~250,000) out of the cyclic GC, and collect
    again so that the GC counts only what came after (``gc.freeze``).

    Without it the GC's full collections, which wait until the objects surviving since the last one
    reach a quarter of the 250,000, came too rarely: the cyclic garbage of closed sessions (and the
    env memory it holds) piled up between them, RSS +0.7 MiB per 1,000 sessions
    (benchmarks/serve_soak.py). With it a full collection scans a few thousand objects (under a
    millisecond, against 140 ms before) and runs as often as the GC's thresholds say."""
    import gc

    gc.collect()
    gc.freeze()
    gc.collect()


def build_app(env_id: str, env_kwargs: dict[str, Any] | None = None, max_concurrent_envs: int = 64,
              session_timeout_s: float | None = None):
    """openenv-core's FastAPI app serving ``env_id``; plus ``GET /agent_gym/sessions`` and
    ``GET /agent_gym/env`` (:func:`describe_env`), ``POST /step`` refused with 409 (:data:`STATELESS_STEP`)
    and ``/ws`` behind :class:`WebSocketGuard` (a malformed frame costs one error reply, a client's
    close is no error).

    One env is built here first, so a bad id or bad kwargs fail at start-up with the env's own error."""
    import agent_gym

    if env_id not in agent_gym.ENV_IDS:
        raise ValueError(f"unknown env id {env_id!r}; {registered_ids_hint(env_id)}")
    if not isinstance(max_concurrent_envs, int) or max_concurrent_envs < 1:
        raise ValueError(f"max_concurrent_envs must be a positive integer, got {max_concurrent_envs!r}")
    probe = AgentGymEnvironment(env_id, env_kwargs)  # fail now, not in the first session
    try:
        env_info = describe_env(env_id, env_kwargs, probe.tool_env)
    finally:
        probe.close()
    from openenv.core.env_server import ConcurrencyConfig

    factory = functools.partial(AgentGymEnvironment, env_id, dict(env_kwargs or {}))
    app = create_app(factory, AgentGymAction, AgentGymObservation, env_name=env_id,
                     concurrency_config=ConcurrencyConfig(max_concurrent_envs=max_concurrent_envs,
                                                          session_timeout=session_timeout_s))
    _refuse_stateless_step(app)
    app.add_middleware(WebSocketGuard)
    env_server = _openenv_server(app)

    @app.get("/agent_gym/sessions")
    def sessions() -> dict[str, Any]:
        """``open_envs``: the envs built and not yet closed (sessions, plus a stateless call's
        throwaway env in flight); ``sessions``: openenv-core's session table (None if not found)."""
        return {"env_id": env_id, "open_envs": AgentGymEnvironment.open_envs(),
                "sessions": None if env_server is None else env_server.active_sessions,
                "max_concurrent_envs": max_concurrent_envs}

    @app.get("/agent_gym/env")
    def env() -> dict[str, Any]:
        """What this server's envs are: a client (``agent_gym.factory.EnvFactory``) checks them against its own."""
        return env_info

    return app


STATELESS_STEP = ("POST /step cannot step this env: openenv-core's HTTP /step builds a fresh env for each request "
                  "and steps it without a reset, and an agent_gym env has no episode before reset(); "
                  "episodes live in WebSocket sessions: connect to /ws (agent_gym.serve.AgentGymClient or "
                  "RemoteToolEnv), send reset, then step")
"""The body's ``detail`` of the 409 that ``POST /step`` answers (``code``: ``NO_EPISODE``)."""


def _refuse_stateless_step(app: Any) -> None:
    """Replace openenv-core's ``POST /step`` (a throwaway env per request, stepped without a reset:
    always a 500 here) by a 409 naming the reason and the WebSocket session to use instead."""
    from fastapi.responses import JSONResponse
    from fastapi.routing import APIRoute

    app.router.routes[:] = [r for r in app.router.routes
                            if not (isinstance(r, APIRoute) and r.path == "/step" and "POST" in r.methods)]

    example = {"application/json": {"example": {"detail": STATELESS_STEP, "code": "NO_EPISODE"}}}

    @app.post("/step", status_code=409, response_model=None, tags=["Environment Control"],
              summary="Refused: use the WebSocket session",
              description=STATELESS_STEP + ".",
              responses={409: {"description": "always: there is no episode to step", "content": example}})
    async def step():  # (no annotation: FastAPI would resolve a local name for its OpenAPI schema)
        return JSONResponse(status_code=409, content={"detail": STATELESS_STEP, "code": "NO_EPISODE"})


def _openenv_server(app: Any) -> Any:
    """openenv-core's ``HTTPEnvServer`` behind ``app`` (its session table), found through the ``/ws``
    endpoint that holds it (``create_app`` does not return it); None if this openenv-core differs."""
    from openenv.core.env_server.http_server import HTTPEnvServer

    for route in app.router.routes:
        if getattr(route, "path", None) == "/ws":
            for cell in getattr(route.endpoint, "__closure__", None) or ():
                try:
                    value = cell.cell_contents
                except ValueError:  # an empty cell
                    continue
                if isinstance(value, HTTPEnvServer):
                    return value
    return None


def frame_problem(message: dict[str, Any]) -> str | None:
    """Why a received WebSocket frame (the ASGI ``websocket.receive`` message) is not a message
    openenv-core can take, or None. A text frame that is not valid JSON is left to openenv-core (its
    own ``INVALID_JSON`` reply); a binary frame, JSON that is not an object (``[1, 2]``, ``"s"``,
    ``42``, ``null``) or JSON nested too deeply for Python's parser is refused here, where
    openenv-core would end the session."""
    text = message.get("text")
    if text is None:
        data = message.get("bytes") or b""
        return (f"a binary frame ({len(data)} bytes) is not a message; send each message as a JSON object in a text "
                'frame, e.g. {"type": "reset", "data": {}}')
    try:
        value = json.loads(text)  # parsed again by openenv-core: microseconds against an env step
    except RecursionError:
        return ("the message is JSON nested too deeply to parse; send a JSON object such as "
                '{"type": "reset", "data": {}}')
    except ValueError:
        return None
    if isinstance(value, dict):
        return None
    kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(value), "a number")
    return (f"a message must be a JSON object, got {kind}; send e.g. "
            '{"type": "reset", "data": {}} or {"type": "step", "data": {"text": "..."}}')


class WebSocketGuard:
    """ASGI middleware around openenv-core's WebSocket endpoints (openenv-core 0.3.0):

    - on ``/ws`` (``path``), a frame openenv-core cannot take (:func:`frame_problem`) is answered
      here with one ``INVALID_JSON`` error and never reaches it (openenv-core would answer
      ``SESSION_ERROR`` and close the connection, losing the session); the next frame is read as usual;
    - on every socket (``/ws``, and openenv-core's JSON-RPC ``/mcp``), a client that closes (or
      drops) is no error. openenv-core then closes a connection already closed, which Starlette
      raises and uvicorn logged as ``Exception in ASGI application`` with a traceback for every
      session (and a client gone while its reply was being sent made openenv-core try to send an
      error about it, raising again). That close is skipped, and a disconnect raised after the
      client left is one debug line; the session's env is closed either way.
    """

    def __init__(self, app: Any, path: str = "/ws"):
        self.app, self.path = app, path

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        check_frames = scope.get("path") == self.path  # openenv-core's /mcp socket speaks JSON-RPC: closes only
        gone: list[Any] = []  # the client's disconnect (code), once it is known

        async def guarded_send(message: dict[str, Any]) -> None:
            if gone and message["type"] == "websocket.close":
                return  # the client closed first: nothing left to close
            try:
                await send(message)
            except OSError:  # uvicorn's ClientDisconnected: the client left mid-send
                gone.append(1006)
                raise

        async def guarded_receive() -> dict[str, Any]:
            while True:
                message = await receive()
                if message["type"] == "websocket.disconnect":
                    gone.append(message.get("code", 1000))
                    return message
                problem = frame_problem(message) if check_frames and message["type"] == "websocket.receive" else None
                if problem is None:
                    return message
                from openenv.core.env_server.types import WSErrorCode, WSErrorResponse

                reply = WSErrorResponse(data={"message": problem, "code": WSErrorCode.INVALID_JSON})
                try:
                    await send({"type": "websocket.send", "text": reply.model_dump_json()})
                except OSError:
                    gone.append(1006)
                    return {"type": "websocket.disconnect", "code": 1006}

        import starlette.websockets as ws

        # What a send raises once the client is gone: uvicorn's ClientDisconnected (an OSError), which
        # Starlette turns into WebSocketDisconnect, and WebSocketDisconnected (a RuntimeError) for a
        # send after that (openenv-core's error reply about the failed send).
        disconnected = (ws.WebSocketDisconnect, OSError, getattr(ws, "WebSocketDisconnected", ws.WebSocketDisconnect))
        try:
            await self.app(scope, guarded_receive, guarded_send)
        except disconnected as e:
            if not gone:
                raise
            log.debug("session on %s ended by the client (code %s): %s", scope.get("path"), gone[0], type(e).__name__)
        else:
            if gone:
                log.debug("session on %s ended by the client (code %s)", scope.get("path"), gone[0])


def describe_env(env_id: str, env_kwargs: dict[str, Any] | None, tool_env: Any) -> dict[str, Any]:
    """``GET /agent_gym/env``: the id, the kwargs the server builds its envs with (JSON-safe), the
    env's vocabulary size, task count (None when it has no fixed set) and tokenizer fingerprint."""
    from agent_gym.factory import tokenizer_fingerprint

    try:
        num_tasks: int | None = int(tool_env.num_tasks())
    except NotImplementedError:
        num_tasks = None
    return {"env_id": env_id, "env_kwargs": _jsonable(dict(env_kwargs or {})), "vocab_size": int(tool_env.vocab_size),
            "num_tasks": num_tasks, "tokenizer": tokenizer_fingerprint(tool_env.tokenizer)}


# -- the client side -------------------------------------------------------------------------------


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
        from websockets.exceptions import ConnectionClosed

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
        import asyncio

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
        import asyncio

        async def gather():
            return await asyncio.gather(*coros, return_exceptions=return_exceptions)

        return asyncio.run_coroutine_threadsafe(gather(), self._loop).result()

    def _obs(self) -> dict[str, tuple[np.ndarray, ...]]:
        return {"input_ids": tuple(np.asarray(ids, dtype=np.int64) for ids in self._ids)}

    def num_tasks(self) -> int:
        """The served env's task count (``GET /agent_gym/env``); ``NotImplementedError`` if it has no fixed set."""
        import json
        import urllib.request

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
        from agent_gym.vector import ToolVectorEnv

        # ToolVectorEnv's own option rules (they read only num_envs), so both vector envs agree.
        seeds = ToolVectorEnv._seeds(self, seed)  # type: ignore[arg-type]
        per_env = ToolVectorEnv._per_env_options(self, options or {})  # type: ignore[arg-type]
        results = self._run(*(c.reset(**({"seed": seeds[i]} if seeds[i] is not None else {}), **per_env[i])
                              for i, c in enumerate(self.clients)))
        infos = [self._take(i, r.observation, reset=True) for i, r in enumerate(results)]
        self.active[:] = True
        return self._obs(), infos

    def step(self, actions: Any):
        from agent_gym.vector import VectorStepError

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


