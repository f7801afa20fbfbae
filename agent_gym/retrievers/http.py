"""A retrieval server and client speaking Search-R1's `/retrieve` wire format.

Request (`POST /retrieve`, JSON): `{"queries": [str, ...], "topk": int, "return_scores": bool}`;
`topk` may be omitted or null, and the server then uses its default.

Answer: `{"result": [per_query, ...]}`, where `per_query` is
`[{"document": doc, "score": float}, ...]` with `return_scores` true, or `[doc, ...]` without.
`doc` is a corpus row; Search-R1's wiki-18 rows are `{"id", "contents"}` with
`contents = '"Title"\\ntext'`. This server also adds `title` and `text`; the client reads either.

Two servers around any `Retriever`, with `GET /health` -> `{"status": "ok"}` too, run by

    python -m agent_gym.retrievers.http serve --kind bm25 --corpus corpus.jsonl --port 8000 [--workers 2]

The default is FastAPI on uvicorn (`agent_gym.retrievers.server`, extra `serve`): header and body
deadlines, size limits, bounded concurrency and forked workers sharing one index. `--server
stdlib` (and `RetrievalServer`, an in-thread server for tests) is `http.server.ThreadingHTTPServer`
with none of those limits (its listen backlog is 5: under load it resets connections,
docs/results.md). Both parse bodies with `parse_request`: anything but the wire format is 400.

The client, `HTTPRetriever`, is a `Retriever`. Each attempt has one deadline (`timeout_s`) that
covers the DNS lookup, connecting (every resolved address shares what is left of it), the TLS
handshake, sending, the headers and the body, whatever the server does (no `Content-Length`,
`Connection: close`, HTTP/1.0, chunks, one byte at a time): a watchdog shuts the socket down when
it passes. Connection errors, timeouts and 5xx answers are retried `retries` times with backoff,
and then a `RetrieverError` is raised: a `search` call takes at most
`(retries + 1) * timeout_s + backoff_s * (2**retries - 1)` seconds (plus scheduling slack), so a
down, unreachable or slow server never hangs an env. An answer is read up to `max_response_bytes`
(default 64 MiB; a larger `Content-Length` is refused before reading, an endless body once it
passes the cap), and anything but the wire format above (a hit that is not an object, a score that
is not a finite number, a null or non-string title/text, JSON nested too deep to decode, bytes
that are not UTF-8 JSON) raises `RetrieverError` naming what was wrong; none of these is retried.
It works against Search-R1's own FastAPI server as well.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import math
import reprlib
import socket
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from agent_gym.cli_errors import ArgumentParser, command, prog_name
from agent_gym.datasets.base import normalize_doc

from .base import Passage, Retriever, RetrieverError, check_k

__all__ = ["BadRequest", "HTTPRetriever", "RetrievalServer", "ServerLimits", "parse_request", "passage_to_document",
           "render_result"]


def passage_to_document(p: Passage) -> dict[str, Any]:
    return {"id": p.id, "contents": p.contents, "title": p.title, "text": p.text}


DEFAULT_MAX_QUERIES = 4096
"""The most queries one request may carry (a larger batch is answered 413)."""


class BadRequest(ValueError):
    """A request body the server refuses: ``status`` is 400 (not the wire format) or 413 (too many
    queries); the message says what was wrong and what the wire format is."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ServerLimits:
    """What the uvicorn server accepts (`agent_gym.retrievers.server`, whose docstring explains each
    limit). Every field is a flag of the `serve` command."""

    max_body_bytes: int = 1 << 20
    drain_bytes: int = 16 << 20
    header_timeout_s: float = 10.0
    body_timeout_s: float = 10.0
    keep_alive_s: float = 5.0
    max_header_bytes: int = 16 << 10
    limit_concurrency: int = 1024
    backlog: int = 2048
    search_threads: int = 2
    max_queries: int = DEFAULT_MAX_QUERIES

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "header_timeout_s", "body_timeout_s", "keep_alive_s", "max_header_bytes",
                     "limit_concurrency", "backlog", "search_threads", "max_queries"):
            if not getattr(self, name) > 0:
                raise ValueError(f"ServerLimits.{name} must be > 0, got {getattr(self, name)!r}")
        if self.drain_bytes < 0:
            raise ValueError(f"ServerLimits.drain_bytes must be >= 0, got {self.drain_bytes!r}")


def parse_request(body: bytes, default_topk: int, max_topk: int,
                  max_queries: int = DEFAULT_MAX_QUERIES) -> tuple[list[str], int, bool]:
    """A ``/retrieve`` body -> ``(queries, topk, return_scores)``, or ``BadRequest`` naming what
    was wrong. Shared by both servers. JSON nested too deep for the decoder (``RecursionError``),
    bytes that are not UTF-8 and integers too long to convert are 400s like any other bad JSON.
    ``topk`` omitted, null or 0 means ``default_topk``; one larger than ``max_topk`` is a 400 naming
    the limit, rather than clipped (a client asking for 10**9 passages would get 100 and no word of it)."""
    fmt = 'expected {"queries": [str, ...], "topk": int (optional), "return_scores": bool (optional)}'
    try:
        req = json.loads(body or b"null")
    except RecursionError:
        raise BadRequest(f"bad request: JSON nested too deep to decode; {fmt}") from None
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError, an integer too long
        raise BadRequest(f"bad request: body is not JSON ({err}); {fmt}") from None
    if not isinstance(req, dict):
        raise BadRequest(f"bad request: body must be a JSON object, got {type(req).__name__}; {fmt}")
    queries = req.get("queries")
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise BadRequest(f"bad request: 'queries' must be a list of strings; {fmt}")
    if len(queries) > max_queries:
        raise BadRequest(f"{len(queries)} queries in one request, over the server's max_queries={max_queries}; "
                         "send them in smaller batches", status=413)
    topk = req.get("topk") or default_topk
    if not isinstance(topk, int) or isinstance(topk, bool) or topk < 1:
        raise BadRequest(f"bad request: 'topk' must be a positive integer, got {_short.repr(topk)}; {fmt}")
    if topk > max_topk:
        raise BadRequest(f"bad request: 'topk' {_short.repr(topk)} is over the server's max_topk={max_topk}; ask for at "
                         f"most {max_topk} passages per query (or start the server with a larger --max-topk)")
    with_scores = req.get("return_scores", False)
    if with_scores is None:
        with_scores = False
    if not isinstance(with_scores, bool):
        raise BadRequest(f"bad request: 'return_scores' must be true or false, got {_short.repr(with_scores)}; {fmt}")
    return queries, topk, with_scores


def render_result(results: list[list[Passage]], with_scores: bool) -> dict[str, Any]:
    """Search results -> the answer's JSON object (module docstring)."""
    if with_scores:
        return {"result": [[{"document": passage_to_document(p), "score": p.score} for p in hits]
                           for hits in results]}
    return {"result": [[passage_to_document(p) for p in hits] for hits in results]}


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        if self.server.verbose:
            super().log_message(format, *args)

    def _send(self, status: int, payload: Any) -> None:
        body = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        if self.path.rstrip("/") == "/health":
            self._send(200, {"status": "ok"})
        else:
            self._send(404, {"error": f"no route {self.path}"})

    def do_POST(self) -> None:  # noqa: N802
        if self.path.rstrip("/") != "/retrieve":
            self._send(404, {"error": f"no route {self.path}; use POST /retrieve"})
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
            queries, topk, with_scores = parse_request(
                self.rfile.read(length), self.server.default_topk, self.server.max_topk)
        except BadRequest as err:
            self._send(err.status, {"error": str(err)})
            return
        except ValueError as err:  # a Content-Length that is not a number
            self._send(400, {"error": f"bad request: {err}"})
            return
        try:
            results = self.server.retriever.search(queries, topk)
        except Exception as err:  # noqa: BLE001  (report any retriever failure to the client)
            self._send(500, {"error": f"{type(err).__name__}: {err}"})
            return
        self._send(200, render_result(results, with_scores))



class _Server(ThreadingHTTPServer):
    daemon_threads = True
    retriever: Retriever
    default_topk: int
    max_topk: int
    verbose: bool


class RetrievalServer:
    """Serve `retriever` on `host:port` (port 0 picks a free one) from a background thread."""

    def __init__(
        self,
        retriever: Retriever,
        host: str = "127.0.0.1",
        port: int = 0,
        default_topk: int = 3,
        max_topk: int = 100,
        verbose: bool = False,
    ):
        self._httpd = _Server((host, port), _Handler)
        self._httpd.retriever = retriever
        self._httpd.default_topk = default_topk
        self._httpd.max_topk = max_topk
        self._httpd.verbose = verbose
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> RetrievalServer:
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="retrieval-server", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._httpd.serve_forever()

    def close(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(timeout=5)
        self._httpd.server_close()

    def __enter__(self) -> RetrievalServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()


DEFAULT_MAX_RESPONSE_BYTES = 64 << 20
"""The default cap on one answer's body (``HTTPRetriever(max_response_bytes=...)``)."""
_ERROR_BODY_BYTES = 2000  # what is read of a non-2xx answer's body, for the error message
_CHUNK = 1 << 16
_short = reprlib.Repr()
_short.maxlevel, _short.maxstring, _short.maxother = 3, 120, 120


class _HTTPStatusError(Exception):
    def __init__(self, status: int, detail: str):
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail


class HTTPRetriever:
    """Client for a `/retrieve` server. Worst-case time per `search` call is bounded by
    `(retries + 1) * timeout_s` plus the backoff sleeps (`backoff_s * (2**retries - 1)`): each
    attempt's one deadline covers the DNS lookup, connecting to every resolved address in turn,
    the headers and the body, however slowly a server sends them.

    It speaks HTTP directly (`http.client`), so proxy environment variables are not used and
    redirects are not followed. An answer body is read up to ``max_response_bytes`` (default
    ``DEFAULT_MAX_RESPONSE_BYTES``, 64 MiB: about 48,000 wiki-18 passages with scores, at 1.4 KB
    each on the shared sample); a longer one raises
    ``RetrieverError`` without being read further, so a server that streams without end cannot
    grow the client's memory past the cap."""

    def __init__(self, url: str, timeout_s: float = 10.0, retries: int = 2, backoff_s: float = 0.2,
                 max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES):
        url = url.rstrip("/")
        self.url = url if url.endswith("/retrieve") else url + "/retrieve"
        if timeout_s <= 0 or retries < 0:
            raise ValueError("timeout_s must be > 0 and retries >= 0")
        if not isinstance(max_response_bytes, int) or isinstance(max_response_bytes, bool) or max_response_bytes <= 0:
            raise ValueError(f"max_response_bytes must be a positive integer, got {max_response_bytes!r}")
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_response_bytes = max_response_bytes

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        check_k(k)
        if not queries:
            return []
        body = json.dumps({"queries": list(queries), "topk": k, "return_scores": True}).encode("utf-8")
        last: str = ""
        attempts = self.retries + 1
        for attempt in range(attempts):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                payload = self._post(body)
            except _HTTPStatusError as err:
                last = f"HTTP {err.status}: {err.detail}"
                if err.status < 500:
                    raise RetrieverError(f"retrieval server {self.url} rejected the request: {last}") from None
                continue
            except (OSError, http.client.HTTPException) as err:  # TimeoutError is an OSError
                last = f"{type(err).__name__}: {err}"
                continue
            return self._parse(payload, len(queries))
        raise RetrieverError(
            f"retrieval server {self.url} failed after {attempts} attempt(s) "
            f"(timeout {self.timeout_s:g}s each): {last}"
        )

    def _post(self, body: bytes) -> Any:
        """POST ``body`` and return the decoded JSON answer, all within ``timeout_s``.

        The deadline covers DNS, connect, send, headers and body: the lookup and each connect
        attempt get only the time left (:func:`_connect`), and then a watchdog timer shuts the
        socket down when it passes, which ends a blocked handshake, send or ``recv`` at once. (A
        socket timeout alone bounds each ``recv``, so a server sending one byte per second would
        never trip it.) The watchdog holds its own duplicate of the connected socket: ``http.client``
        drops the connection's socket when an answer has no ``Content-Length`` (``getresponse``
        hands it to the response and closes the connection object), and TLS wrapping detaches the
        original socket object; a duplicate descriptor still shuts the same socket down.
        Raises ``TimeoutError`` past the deadline, ``_HTTPStatusError`` for a non-2xx status,
        ``RetrieverError`` for an answer over ``max_response_bytes`` or not JSON.
        """
        u = urllib.parse.urlsplit(self.url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise RetrieverError(f"retrieval server URL {self.url!r} is not http(s)://host[:port]/...")
        deadline = time.monotonic() + self.timeout_s
        cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
        conn = cls(u.hostname, u.port, timeout=self.timeout_s)
        expired = threading.Event()
        lock = threading.Lock()
        watched: list[socket.socket] = []  # duplicates of the sockets opened, for the watchdog

        def create(address: tuple[str, int], timeout: Any = None, source_address: Any = None) -> socket.socket:
            sock = _connect(address, deadline, self.timeout_s)
            with lock:
                if expired.is_set():
                    sock.close()
                    raise TimeoutError(f"could not connect within {self.timeout_s:g}s")
                watched.append(sock.dup())
            return sock

        def expire() -> None:
            with lock:
                expired.set()
                for sock in watched:
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

        # http.client opens its socket through this per-connection hook (socket.create_connection by
        # default: an unbounded DNS lookup, then `timeout` per resolved address). Ours spends only
        # what is left of the deadline; everything after it is under the watchdog.
        conn._create_connection = create  # type: ignore[attr-defined]
        timer = threading.Timer(max(deadline - time.monotonic(), 0.0), expire)
        timer.daemon = True
        timer.start()
        resp = None
        try:
            conn.connect()
            if expired.is_set():
                raise TimeoutError(f"could not connect within {self.timeout_s:g}s")
            path = (u.path or "/") + (f"?{u.query}" if u.query else "")
            conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            ok = 200 <= resp.status < 300
            data = self._read_body(resp, self.max_response_bytes if ok else _ERROR_BODY_BYTES, ok)
            if expired.is_set():  # the watchdog's shutdown reads as the end of the body
                raise TimeoutError(f"no complete answer within {self.timeout_s:g}s")
        except (OSError, http.client.HTTPException) as err:
            if expired.is_set() and not isinstance(err, TimeoutError):  # keep a timeout's own message (DNS, connect)
                raise TimeoutError(f"no complete answer within {self.timeout_s:g}s") from None
            raise
        finally:
            timer.cancel()
            if resp is not None:
                resp.close()
            conn.close()
            with lock:
                for sock in watched:
                    sock.close()
        if not ok:
            raise _HTTPStatusError(resp.status, data.decode("utf-8", "replace"))
        try:
            return json.loads(data)
        except RecursionError:
            raise RetrieverError(f"retrieval server {self.url} sent JSON nested too deep to decode") from None
        except ValueError as err:  # JSONDecodeError, bytes that are not UTF-8, an integer too long
            raise RetrieverError(f"retrieval server {self.url} sent invalid JSON: {err}") from None

    def _read_body(self, resp: http.client.HTTPResponse, cap: int, strict: bool) -> bytes:
        """At most ``cap`` bytes of ``resp``'s body. ``strict``: a body longer than ``cap`` (by its
        ``Content-Length``, before reading, or once more than ``cap`` bytes arrived) raises
        ``RetrieverError``; else the first ``cap`` bytes are returned (an error answer's detail)."""
        if strict and resp.length is not None and resp.length > cap:
            raise RetrieverError(
                f"retrieval server {self.url} announced a {resp.length:,}-byte answer (Content-Length), over "
                f"max_response_bytes={cap:,}; raise HTTPRetriever(max_response_bytes=...) "
                "(retriever_kwargs in the QA envs) if the server is right, or ask for fewer queries or passages")
        chunks: list[bytes] = []
        total = 0
        while total <= cap:
            chunk = resp.read(min(_CHUNK, cap + 1 - total))
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            total += len(chunk)
        if not strict:
            return b"".join(chunks)[:cap]
        raise RetrieverError(
            f"retrieval server {self.url} sent more than max_response_bytes={cap:,} bytes; reading stopped there. "
            "Raise HTTPRetriever(max_response_bytes=...) (retriever_kwargs in the QA envs) if the server is "
            "right, or ask for fewer queries or passages")

    def _parse(self, payload: Any, n: int) -> list[list[Passage]]:
        """The wire format (module docstring) -> passages; anything else raises ``RetrieverError``
        naming the query, the rank and what was wrong."""
        result = payload.get("result") if isinstance(payload, dict) else payload
        if not isinstance(result, list) or len(result) != n:
            raise RetrieverError(
                f"retrieval server {self.url} answered {type(result).__name__} "
                f"of length {len(result) if isinstance(result, list) else '-'}, expected {n} lists"
            )
        out = []
        for q, hits in enumerate(result):
            if not isinstance(hits, list):
                raise RetrieverError(f"retrieval server {self.url}: the hits of query {q} must be a list, "
                                     f"got {type(hits).__name__} {_short.repr(hits)}")
            row = []
            for rank, hit in enumerate(hits):
                where = f"retrieval server {self.url}: query {q}, hit {rank}"
                doc = hit.get("document", hit) if isinstance(hit, dict) else None
                if not isinstance(doc, dict):
                    raise RetrieverError(f"{where} is malformed: {_short.repr(hit)} (expected a document object "
                                         "or {\"document\": ..., \"score\": ...})")
                score = hit.get("score") if "document" in hit else None
                if score is not None and not _finite_number(score):
                    raise RetrieverError(f"{where} has score {_short.repr(score)}; a score must be a finite number")
                try:
                    d = normalize_doc(doc, rank)
                except ValueError as err:
                    raise RetrieverError(f"{where}: {err}") from None
                row.append(Passage(title=d["title"], text=d["text"],
                                   score=float(score) if score is not None else 0.0, id=d["id"]))
            out.append(row)
        return out


def _finite_number(x: Any) -> bool:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:  # an int too large for a float
        return False


def _resolve(host: str, port: int, timeout: float) -> list[tuple[Any, ...]]:
    """``socket.getaddrinfo`` for a TCP connection, given at most ``timeout`` seconds. A name lookup
    runs on a daemon thread, because ``getaddrinfo`` cannot be interrupted (the resolver's own
    timeouts end that thread later); a numeric address needs no lookup and is resolved inline."""
    try:
        ipaddress.ip_address(host.strip("[]"))
        return socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
    except ValueError:
        pass
    box: dict[str, Any] = {}

    def lookup() -> None:
        try:
            box["out"] = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
        except BaseException as e:  # handed to the caller
            box["exc"] = e

    th = threading.Thread(target=lookup, name="agent_gym-http-dns", daemon=True)
    th.start()
    th.join(max(timeout, 0.0))
    if th.is_alive():
        raise TimeoutError(f"DNS lookup of {host!r} did not finish in time")
    if "exc" in box:
        raise box["exc"]
    return box["out"]


def _connect(address: tuple[str, int], deadline: float, timeout_s: float) -> socket.socket:
    """A TCP socket connected to ``address`` before ``deadline`` (``time.monotonic()``): the DNS
    lookup and every resolved address share the time left, where ``socket.create_connection`` gives
    each address the whole timeout. Raises ``TimeoutError`` at the deadline, else the last error."""
    host, port = address
    infos = _resolve(host, port, deadline - time.monotonic())
    last: OSError | None = None
    for family, kind, proto, _, sockaddr in infos:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(left)
            sock.connect(sockaddr)
            return sock
        except OSError as err:
            sock.close()
            last = err
    if time.monotonic() >= deadline:
        raise TimeoutError(f"could not connect to {host}:{port} within {timeout_s:g}s")
    raise last if last is not None else OSError(f"getaddrinfo returned no address for {host!r}")


@command  # without argv (the command line): one line and exit 2 on a bad input (agent_gym/cli_errors.py)
def main(argv: list[str] | None = None) -> int:
    from agent_gym.retrievers import make_retriever

    parser = ArgumentParser(prog=prog_name("python -m agent_gym.retrievers.http", argv,
                                           module="agent_gym.retrievers.http"))
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="serve a retriever over POST /retrieve")
    s.add_argument("--kind", default="bm25", help="retriever kind (bm25, pyserini, dense)")
    s.add_argument("--corpus", help="corpus JSONL ({id,title,text} or {id,contents})")
    s.add_argument("--index", help="pyserini: an index directory")
    s.add_argument("--prebuilt", help="pyserini: a prebuilt index name (downloads; needs internet)")
    s.add_argument("--model", help="dense: model directory or hub id")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--topk", type=int, default=3, help="default topk when a request omits it")
    s.add_argument("--max-topk", type=int, default=100, help="a request asking for more passages per query gets 400")
    s.add_argument("--verbose", action="store_true", help="log every request")
    s.add_argument("--server", choices=("uvicorn", "stdlib"), default="uvicorn",
                   help="uvicorn (default; FastAPI on uvicorn with the limits below, extra `serve`) or stdlib "
                        "(the old ThreadingHTTPServer: no limits, kept for comparison and for environments without "
                        "uvicorn)")
    s.add_argument("--workers", type=int, default=1, help="uvicorn: worker processes forked after the index is built")
    lim = ServerLimits()
    for name, typ, what in [
        ("max_body_bytes", int, "a larger request body gets 413"),
        ("drain_bytes", int, "a refused body up to this size is read and dropped before the 413, not reset"),
        ("header_timeout_s", float, "a request's headers must arrive within this long"),
        ("body_timeout_s", float, "a request's body must arrive within this long of its headers (else 408)"),
        ("keep_alive_s", float, "an idle keep-alive connection is closed after this long"),
        ("max_header_bytes", int, "longer request headers get 400"),
        ("limit_concurrency", int, "connections plus requests per worker before 503"),
        ("backlog", int, "the listen backlog"),
        ("search_threads", int, "searches at once per worker"),
        ("max_queries", int, "more queries in one request get 413"),
    ]:
        s.add_argument("--" + name.replace("_", "-"), type=typ, default=getattr(lim, name),
                       help=f"uvicorn: {what} (default %(default)s)")
    args = parser.parse_args(argv)
    if args.corpus and not Path(args.corpus).expanduser().is_file():
        s.error(f"--corpus {args.corpus}: no such file; pass a corpus JSONL file ({{id, title, text}} or {{id, contents}} "
                "rows)")

    kwargs = {k: getattr(args, k) for k in ("corpus", "index", "prebuilt", "model") if getattr(args, k)}
    if args.server == "uvicorn":
        try:
            from .server import serve
        except ImportError as err:
            parser.error(f"--server uvicorn needs fastapi and uvicorn ({err}): pip install -e '.[serve]', "
                         "or pass --server stdlib")
        limits = ServerLimits(**{f: getattr(args, f) for f in ServerLimits.__dataclass_fields__})
        retriever = make_retriever(args.kind, **kwargs)
        try:
            serve(retriever, host=args.host, port=args.port, workers=args.workers, default_topk=args.topk,
                  max_topk=args.max_topk, limits=limits, verbose=args.verbose, announce=args.kind)
        except KeyboardInterrupt:
            pass
        return 0
    retriever = make_retriever(args.kind, **kwargs)
    server = RetrievalServer(retriever, host=args.host, port=args.port, default_topk=args.topk,
                             max_topk=args.max_topk, verbose=args.verbose)
    print(f"serving {args.kind} on {server.url}/retrieve", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
