"""The `/retrieve` server on FastAPI and uvicorn (Search-R1's own stack), hardened for load.

Same wire format (`agent_gym.retrievers.wire`) and routes as the stdlib server in
`agent_gym.retrievers.http` (`agent_gym.retrievers.client.HTTPRetriever` is the client of both):
`POST /retrieve`, `GET /health`. Started by the command of `agent_gym.retrievers.http`, which uses
this server unless `--server stdlib` is given:

    python -m agent_gym.retrievers.http serve --kind bm25 --corpus corpus.jsonl --port 8000 --workers 2

Limits (`ServerLimits`, each a CLI flag):

- **Header deadline** (`header_timeout_s`, 10 s): a connection must deliver a request's complete
  headers within this long of connecting (or of its previous answer); else it is closed. uvicorn
  0.54 has no such timer (its `timeout_keep_alive` is armed only after an answer, and is
  cancelled by the first byte of the next request), so a connection that sends half a request
  line would be held for ever: `_DeadlineH11Protocol` adds it.
- **Body deadline and size** (`body_timeout_s`, 10 s; `max_body_bytes`, 1 MiB): `BodyLimits`, an
  ASGI middleware, reads the whole body before the route runs. A `Content-Length` or a chunked
  body over the limit is answered 413; a body not complete by the deadline, 408. A refused body
  of up to `drain_bytes` is read and dropped first, so that the client, still sending, gets the
  answer rather than a reset (a socket closed with unread input sends RST).
- **Header size**: uvicorn's `h11_max_incomplete_event_size` (16 KiB): longer headers get 400.
- **Concurrency**: `limit_concurrency` per worker (connections plus tasks; past it uvicorn
  answers 503, which `HTTPRetriever` retries), the listen `backlog`, and `search_threads`
  searches at once per worker (the others wait in the event loop, holding no thread).
- **Bodies**: every body that is not the wire format gets 400 naming what was wrong (bad JSON,
  wrong types, JSON nested too deep to decode); more than `max_queries` queries, 413.

**Workers.** With `workers > 1` the parent process builds the retriever once, opens the listening
socket, freezes the garbage collector's view of the loaded objects (`gc.freeze`) and forks the
workers, which all accept on that socket. The index's arrays (bm25s: numpy arrays that are only
read) and the corpus stay shared copy-on-write; the pages of Python objects a worker touches get
copied (reference counts). The parent restarts a worker that dies, and stops them all on SIGINT
or SIGTERM. POSIX only (fork).
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import json
import os
import signal
import socket
import sys
import time
import traceback
from typing import Any

import anyio
import h11
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from uvicorn.protocols.http.h11_impl import H11Protocol

from .base import Retriever
from .wire import BadRequest, ServerLimits, parse_request, render_result

__all__ = ["BodyLimits", "ServerLimits", "build_app", "serve"]


async def _send_json(send: Any, status: int, payload: Any) -> None:
    body = json.dumps(payload).encode("utf-8")
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodyLimits:
    """ASGI middleware: read an HTTP request's whole body within ``body_timeout_s`` and at most
    ``max_body_bytes`` of it, then run ``app`` with that body replayed. Too long: 413; too slow:
    408; both close the connection. A too-long body of up to ``drain_bytes`` (by ``Content-Length``
    or as it arrives) is read and dropped, within the same deadline, before the 413 is sent."""

    def __init__(self, app: Any, max_body_bytes: int, body_timeout_s: float, drain_bytes: int = 0):
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.drain_bytes = drain_bytes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:  # h11 refuses these before us; kept for other servers
                    await _send_json(send, 400, {"error": f"bad Content-Length {value!r}"})
                    return
        too_big = (
            f"request body over the server's max_body_bytes={self.max_body_bytes:,}; send fewer queries per request"
        )
        if declared is not None and declared > self.max_body_bytes and declared > self.drain_bytes:
            await _send_json(send, 413, {"error": too_big})
            return
        deadline = time.monotonic() + self.body_timeout_s
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            try:
                with anyio.fail_after(max(deadline - time.monotonic(), 0.0)):
                    message = await receive()
            except TimeoutError:
                await _send_json(send, 408, {"error": f"request body not received within {self.body_timeout_s:g}s"})
                return
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size <= self.max_body_bytes:
                chunks.append(chunk)
            elif size > self.drain_bytes:
                break
            more = message.get("more_body", False)
        if size > self.max_body_bytes:
            await _send_json(send, 413, {"error": too_big})
            return
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: wait for the disconnect, as a server would

        await self.app(scope, replay, send)


def build_app(
    retriever: Retriever, default_topk: int = 3, max_topk: int = 100, limits: ServerLimits = ServerLimits()
) -> Any:
    """The ASGI app: FastAPI routes for `/retrieve` and `/health` inside `BodyLimits`."""
    app = FastAPI(title="agent_gym retrieval server", docs_url=None, redoc_url=None, openapi_url=None)
    limiter: list[anyio.CapacityLimiter] = []  # made lazily: it belongs to the worker's event loop

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/retrieve")
    async def retrieve(request: Request) -> JSONResponse:
        try:
            queries, topk, with_scores = parse_request(await request.body(), default_topk, max_topk, limits.max_queries)
        except BadRequest as err:
            return JSONResponse({"error": str(err)}, status_code=err.status)
        if not limiter:
            limiter.append(anyio.CapacityLimiter(limits.search_threads))
        try:
            results = await anyio.to_thread.run_sync(retriever.search, queries, topk, limiter=limiter[0])
        except Exception as err:  # noqa: BLE001  (report any retriever failure to the client)
            return JSONResponse({"error": f"{type(err).__name__}: {err}"}, status_code=500)
        return JSONResponse(render_result(results, with_scores))

    return BodyLimits(app, limits.max_body_bytes, limits.body_timeout_s, limits.drain_bytes)


class _DeadlineH11Protocol(H11Protocol):
    """uvicorn's h11 protocol plus a header deadline: a connection that has not delivered a
    request's complete headers within ``header_timeout_s`` of connecting, or of its previous
    answer, is closed. (h11 stays in state IDLE until the headers are complete.)"""

    header_timeout_s = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_deadline()
        super().connection_lost(exc)

    def _arm_header_deadline(self) -> None:
        self._cancel_header_deadline()
        if not self.transport.is_closing():
            self._header_deadline = self.loop.call_later(self.header_timeout_s, self._header_deadline_passed)

    def _cancel_header_deadline(self) -> None:
        handle = getattr(self, "_header_deadline", None)
        if handle is not None:
            handle.cancel()
            self._header_deadline = None

    def _header_deadline_passed(self) -> None:
        self._header_deadline = None
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self.transport.close()


def _protocol_class(limits: ServerLimits) -> type[H11Protocol]:
    return type("DeadlineH11Protocol", (_DeadlineH11Protocol,), {"header_timeout_s": limits.header_timeout_s})


def _config(app: Any, limits: ServerLimits, verbose: bool) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        http=_protocol_class(limits),
        ws="none",
        lifespan="off",
        interface="asgi3",
        timeout_keep_alive=limits.keep_alive_s,
        h11_max_incomplete_event_size=limits.max_header_bytes,
        limit_concurrency=limits.limit_concurrency,
        backlog=limits.backlog,
        access_log=verbose,
        log_level="info" if verbose else "warning",
    )


def _listen(host: str, port: int, backlog: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    sock.set_inheritable(True)
    return sock


def _run_worker(app: Any, sock: socket.socket, limits: ServerLimits, verbose: bool) -> None:
    uvicorn.Server(_config(app, limits, verbose)).run(sockets=[sock])


def _die_with_parent() -> None:
    """Linux: SIGTERM this process when its parent dies (even by SIGKILL), so no worker outlives
    the server; elsewhere nothing."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def serve(
    retriever: Retriever,
    host: str = "127.0.0.1",
    port: int = 8000,
    workers: int = 1,
    default_topk: int = 3,
    max_topk: int = 100,
    limits: ServerLimits = ServerLimits(),
    verbose: bool = False,
    announce: str = "",
) -> None:
    """Serve ``retriever`` until SIGINT or SIGTERM; ``workers`` processes fork from this one after
    the retriever is built (module docstring). Port 0 picks a free port; the line
    ``serving {announce} on http://HOST:PORT/retrieve`` goes to stderr once it listens."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    app = build_app(retriever, default_topk=default_topk, max_topk=max_topk, limits=limits)
    sock = _listen(host, port, limits.backlog)
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    print(
        f"serving {announce or 'a retriever'} on http://{shown}:{bound}/retrieve ({workers} worker(s))",
        file=sys.stderr,
        flush=True,
    )
    if workers == 1:
        try:
            _run_worker(app, sock, limits, verbose)
        finally:
            sock.close()
        return
    gc.collect()
    gc.freeze()  # the loaded index and corpus: no collector writes to their pages in the workers
    stopping = False
    children: set[int] = set()

    def fork_worker() -> None:
        pid = os.fork()
        if pid == 0:  # the worker: uvicorn installs its own SIGINT/SIGTERM handlers
            _die_with_parent()
            code = 0
            try:
                _run_worker(app, sock, limits, verbose)
            except BaseException:  # noqa: BLE001  (a worker must never return into the parent's code)
                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        children.add(pid)

    def stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True
        for pid in list(children):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for _ in range(workers):
            fork_worker()
        while children:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                break
            except InterruptedError:
                continue
            children.discard(pid)
            if not stopping:
                print(
                    f"retrieval server: worker {pid} exited ({status:#x}); starting another",
                    file=sys.stderr,
                    flush=True,
                )
                time.sleep(0.5)  # a worker that dies at start must not make this a busy loop
                fork_worker()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        sock.close()
