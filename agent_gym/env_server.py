"""The env server behind ``python -m agent_gym.serve`` (:mod:`agent_gym.serve`, the command line):
openenv-core's own server (``openenv.core.env_server.create_app``, on uvicorn) around any registered env.

Each WebSocket connection to ``/ws`` gets its own :class:`AgentGymEnvironment` (a fresh
``gym.make(env_id, **env_kwargs)``), at most ``max_concurrent_envs`` at once; a closed or dropped
connection closes its env. openenv-core's stateless ``POST /reset`` builds a throwaway env per request
(reset, answered, closed) and is no use for a multi-turn episode; its ``POST /step`` would step such an
env without a reset, which has no meaning here: it answers **409** with ``{"detail": "...", "code":
"NO_EPISODE"}`` naming the WebSocket session to use instead (:data:`STATELESS_STEP`). The messages are
the wire types of :mod:`agent_gym.env_wire`; :mod:`agent_gym.env_client` holds the clients.

Errors: an action that is not an :class:`~agent_gym.env_wire.AgentGymAction` is openenv-core's
``VALIDATION_ERROR``; one the env refuses (ids outside the vocabulary, a step after the episode ended
or before any reset) is an ``EXECUTION_ERROR`` with the env's message. Either way nothing is stepped
(``ToolEnv.step`` is transactional) and the session goes on. A frame that is no message (a binary
frame, JSON that is not an object: ``[1, 2]``, ``"s"``, ``42``) costs one ``INVALID_JSON`` error reply,
as invalid JSON does, and the session goes on (openenv-core alone would end it: :class:`WebSocketGuard`).
A client's close, or a dropped connection, closes the session's env and logs nothing above debug.

No torch here: the server needs only the env and openenv-core (the ``openenv`` extra), whose package
imports gradio and FastMCP (seconds), so the command line imports this module only after parsing.
"""

from __future__ import annotations

import functools
import gc
import json
import logging
import threading
from typing import Any, Literal

import numpy as np
import starlette.websockets as ws
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from openenv.core.env_server import ConcurrencyConfig, Environment, create_app
from openenv.core.env_server.http_server import HTTPEnvServer
from openenv.core.env_server.types import WSErrorCode, WSErrorResponse

import agent_gym  # noqa: F401  (registers the ids)
from agent_gym.cli_errors import registered_ids_hint
from agent_gym.env_ids import ENV_IDS
from agent_gym.env_wire import AgentGymAction, AgentGymObservation, AgentGymState
from agent_gym.factory import EnvFactory, jsonable
from agent_gym.heap import trim_heap
from agent_gym.tokenizer import tokenizer_fingerprint
from agent_gym.wrappers import TextView

log = logging.getLogger("agent_gym.serve")


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

    def _observation(
        self, reward: float | None, terminated: bool, truncated: bool, info: dict[str, Any]
    ) -> AgentGymObservation:
        ids = self.tool_env._obs()["input_ids"].tolist()
        delta, self._sent = ids[self._sent :], len(ids)
        episode = info.pop("trajectory", None)
        return AgentGymObservation(
            token_ids=delta,
            num_tokens=len(ids),
            text=self.text_view._text({"input_ids": ids}) if self.view == "text" else None,
            reward=reward,
            done=bool(terminated or truncated),
            terminated=bool(terminated),
            truncated=bool(truncated),
            info=jsonable(info),
            episode=episode,
        )

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        task_index: int | None = None,
        task: dict[str, Any] | None = None,
        view: Literal["tokens", "text"] = "tokens",
        **kwargs: Any,
    ) -> AgentGymObservation:
        """``seed``, and ``task_index`` or ``task`` (the env's reset options); ``view`` "text" adds
        TextView's text to every observation of the episode. Anything else is refused by name."""
        if kwargs:
            raise ValueError(
                f"unknown reset argument(s) {sorted(kwargs)}; valid: seed, task_index, task, view, episode_id"
            )
        if view not in ("tokens", "text"):
            raise ValueError(f"view must be 'tokens' or 'text', got {view!r}")
        options = {k: v for k, v in (("task_index", task_index), ("task", task)) if v is not None}
        _, info = self.env.reset(seed=seed, options=options or None)
        self.view, self._sent = view, 0
        return self._observation(None, False, False, info)

    def step(self, action: AgentGymAction, timeout_s: float | None = None, **kwargs: Any) -> AgentGymObservation:
        if action.text is not None:
            _, reward, term, trunc, info = self.text_view.step(action.text)
        else:
            _, reward, term, trunc, info = self.env.step(np.asarray(action.token_ids, dtype=np.int64))
        return self._observation(float(reward), term, trunc, info)

    @property
    def state(self) -> AgentGymState:
        te = self.tool_env
        task = getattr(te, "task", None)
        return AgentGymState(
            env_id=self.env_id,
            task_id=None if task is None else str(task.get("id", te.task_index)),
            task_index=getattr(te, "task_index", None),
            turn=getattr(te, "turn", 0),
            num_tokens=len(te._ids),
            done=bool(te._done),
            step_count=getattr(te, "turn", 0),
        )

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
"""Every this many envs closed, :func:`~agent_gym.heap.trim_heap` (benchmarks/faults/serve_soak.py: the
server's RSS then stays flat).

Each session builds an env (tokenizer, numpy buffers) in a thread of its own (openenv-core gives
every session a one-thread executor) and frees it at the close; glibc keeps the freed pages in its
per-thread arenas, so RSS crept up with the sessions played (+1 MiB per 1,000 after a warm-up of
~15 MiB) although the memory in use stayed flat (``mallinfo2``: no leak). Trimming takes a few
milliseconds in the closing session's thread, off the event loop."""


def settle_heap() -> None:
    """For the server process, once its app is built: collect, then freeze the start-up objects
    (openenv-core, gradio, FastMCP, the env's modules: ~250,000) out of the cyclic GC, and collect
    again so that the GC counts only what came after (``gc.freeze``).

    Without it the GC's full collections, which wait until the objects surviving since the last one
    reach a quarter of the 250,000, came too rarely: the cyclic garbage of closed sessions (and the
    env memory it holds) piled up between them, RSS +0.7 MiB per 1,000 sessions
    (benchmarks/faults/serve_soak.py). With it a full collection scans a few thousand objects (under a
    millisecond, against 140 ms before) and runs as often as the GC's thresholds say."""
    gc.collect()
    gc.freeze()
    gc.collect()


def build_app(
    env_id: str,
    env_kwargs: dict[str, Any] | None = None,
    max_concurrent_envs: int = 64,
    session_timeout_s: float | None = None,
):
    """openenv-core's FastAPI app serving ``env_id``; plus ``GET /agent_gym/sessions`` and
    ``GET /agent_gym/env`` (:func:`describe_env`), ``POST /step`` refused with 409 (:data:`STATELESS_STEP`)
    and ``/ws`` behind :class:`WebSocketGuard` (a malformed frame costs one error reply, a client's
    close is no error).

    One env is built here first, so a bad id or bad kwargs fail at start-up with the env's own error."""
    if env_id not in ENV_IDS:
        raise ValueError(f"unknown env id {env_id!r}; {registered_ids_hint(env_id)}")
    if not isinstance(max_concurrent_envs, int) or max_concurrent_envs < 1:
        raise ValueError(f"max_concurrent_envs must be a positive integer, got {max_concurrent_envs!r}")
    probe = AgentGymEnvironment(env_id, env_kwargs)  # fail now, not in the first session
    try:
        env_info = describe_env(env_id, env_kwargs, probe.tool_env)
    finally:
        probe.close()
    factory = functools.partial(AgentGymEnvironment, env_id, dict(env_kwargs or {}))
    app = create_app(
        factory,
        AgentGymAction,
        AgentGymObservation,
        env_name=env_id,
        concurrency_config=ConcurrencyConfig(
            max_concurrent_envs=max_concurrent_envs, session_timeout=session_timeout_s
        ),
    )
    _refuse_stateless_step(app)
    app.add_middleware(WebSocketGuard)
    env_server = _openenv_server(app)

    @app.get("/agent_gym/sessions")
    def sessions() -> dict[str, Any]:
        """``open_envs``: the envs built and not yet closed (sessions, plus a stateless call's
        throwaway env in flight); ``sessions``: openenv-core's session table (None if not found);
        ``max_concurrent_envs``: the limit, which ``RemoteVectorEnv`` checks its sessions against."""
        return {
            "env_id": env_id,
            "open_envs": AgentGymEnvironment.open_envs(),
            "sessions": None if env_server is None else env_server.active_sessions,
            "max_concurrent_envs": max_concurrent_envs,
        }

    @app.get("/agent_gym/env")
    def env() -> dict[str, Any]:
        """What this server's envs are: a client (``agent_gym.factory.EnvFactory``) checks them against its own."""
        return env_info

    return app


STATELESS_STEP = (
    "POST /step cannot step this env: openenv-core's HTTP /step builds a fresh env for each request "
    "and steps it without a reset, and an agent_gym env has no episode before reset(); "
    "episodes live in WebSocket sessions: connect to /ws (agent_gym.env_client.AgentGymClient or "
    "RemoteToolEnv), send reset, then step"
)
"""The body's ``detail`` of the 409 that ``POST /step`` answers (``code``: ``NO_EPISODE``)."""


def _refuse_stateless_step(app: Any) -> None:
    """Replace openenv-core's ``POST /step`` (a throwaway env per request, stepped without a reset:
    always a 500 here) by a 409 naming the reason and the WebSocket session to use instead."""
    app.router.routes[:] = [
        r for r in app.router.routes if not (isinstance(r, APIRoute) and r.path == "/step" and "POST" in r.methods)
    ]

    example = {"application/json": {"example": {"detail": STATELESS_STEP, "code": "NO_EPISODE"}}}

    @app.post(
        "/step",
        status_code=409,
        response_model=None,
        tags=["Environment Control"],
        summary="Refused: use the WebSocket session",
        description=STATELESS_STEP + ".",
        responses={409: {"description": "always: there is no episode to step", "content": example}},
    )
    async def step():  # (no annotation: FastAPI would resolve a local name for its OpenAPI schema)
        return JSONResponse(status_code=409, content={"detail": STATELESS_STEP, "code": "NO_EPISODE"})


def _openenv_server(app: Any) -> Any:
    """openenv-core's ``HTTPEnvServer`` behind ``app`` (its session table), found through the ``/ws``
    endpoint that holds it (``create_app`` does not return it); None if this openenv-core differs."""
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
        return (
            f"a binary frame ({len(data)} bytes) is not a message; send each message as a JSON object in a text "
            'frame, e.g. {"type": "reset", "data": {}}'
        )
    try:
        value = json.loads(text)  # parsed again by openenv-core: microseconds against an env step
    except RecursionError:
        return (
            'the message is JSON nested too deeply to parse; send a JSON object such as {"type": "reset", "data": {}}'
        )
    except ValueError:
        return None
    if isinstance(value, dict):
        return None
    kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(value), "a number")
    return (
        f"a message must be a JSON object, got {kind}; send e.g. "
        '{"type": "reset", "data": {}} or {"type": "step", "data": {"text": "..."}}'
    )


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
                reply = WSErrorResponse(data={"message": problem, "code": WSErrorCode.INVALID_JSON})
                try:
                    await send({"type": "websocket.send", "text": reply.model_dump_json()})
                except OSError:
                    gone.append(1006)
                    return {"type": "websocket.disconnect", "code": 1006}

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
    try:
        num_tasks: int | None = int(tool_env.num_tasks())
    except NotImplementedError:
        num_tasks = None
    return {
        "env_id": env_id,
        "env_kwargs": jsonable(dict(env_kwargs or {})),
        "vocab_size": int(tool_env.vocab_size),
        "num_tasks": num_tasks,
        "tokenizer": tokenizer_fingerprint(tool_env.tokenizer),
    }


__all__ = [
    "STATELESS_STEP",
    "TRIM_EVERY",
    "AgentGymEnvironment",
    "WebSocketGuard",
    "build_app",
    "describe_env",
    "frame_problem",
    "settle_heap",
    "trim_heap",
]
