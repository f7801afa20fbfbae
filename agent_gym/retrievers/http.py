"""Serving a retriever over Search-R1's `/retrieve` wire format (`agent_gym.retrievers.wire`): the
command line and the stdlib server.

    python -m agent_gym.retrievers.http serve --kind bm25 --corpus corpus.jsonl --port 8000 [--workers 2]

(also `agent-gym-retrieval-server serve ...`). Both servers answer `POST /retrieve` and `GET /health`
-> `{"status": "ok"}`. The default is FastAPI on uvicorn (`agent_gym.retrievers.server`, extra
`serve`): header and body deadlines, size limits, bounded concurrency and forked workers sharing one
index. `--server stdlib` (and `RetrievalServer`, an in-thread server for tests) is
`http.server.ThreadingHTTPServer` with none of those limits (its listen backlog is 5: under load it
resets connections, docs/results.md). Both parse bodies with `wire.parse_request`: anything but the
wire format is 400. The client is `agent_gym.retrievers.client.HTTPRetriever`.
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from agent_gym.cli_errors import ArgumentParser, command, prog_name

from . import make_retriever
from .base import Retriever
from .wire import BadRequest, ServerLimits, parse_request, render_result

__all__ = ["RetrievalServer", "main"]


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
                self.rfile.read(length), self.server.default_topk, self.server.max_topk
            )
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


@command  # without argv (the command line): one line and exit 2 on a bad input (agent_gym/cli_errors.py)
def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(
        prog=prog_name("python -m agent_gym.retrievers.http", argv, module="agent_gym.retrievers.http")
    )
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
    s.add_argument(
        "--server",
        choices=("uvicorn", "stdlib"),
        default="uvicorn",
        help="uvicorn (default; FastAPI on uvicorn with the limits below, extra `serve`) or stdlib "
        "(the old ThreadingHTTPServer: no limits, kept for comparison and for environments without "
        "uvicorn)",
    )
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
        s.add_argument(
            "--" + name.replace("_", "-"),
            type=typ,
            default=getattr(lim, name),
            help=f"uvicorn: {what} (default %(default)s)",
        )
    args = parser.parse_args(argv)
    if args.corpus and not Path(args.corpus).expanduser().is_file():
        s.error(
            f"--corpus {args.corpus}: no such file; pass a corpus JSONL file ({{id, title, text}} or {{id, contents}} "
            "rows)"
        )

    kwargs = {k: getattr(args, k) for k in ("corpus", "index", "prebuilt", "model") if getattr(args, k)}
    if args.server == "uvicorn":
        try:
            from .server import serve  # optional: fastapi and uvicorn (extra serve)
        except ImportError as err:
            parser.error(
                f"--server uvicorn needs fastapi and uvicorn ({err}): pip install -e '.[serve]', "
                "or pass --server stdlib"
            )
        limits = ServerLimits(**{f: getattr(args, f) for f in ServerLimits.__dataclass_fields__})
        retriever = make_retriever(args.kind, **kwargs)
        try:
            serve(
                retriever,
                host=args.host,
                port=args.port,
                workers=args.workers,
                default_topk=args.topk,
                max_topk=args.max_topk,
                limits=limits,
                verbose=args.verbose,
                announce=args.kind,
            )
        except KeyboardInterrupt:
            pass
        return 0
    retriever = make_retriever(args.kind, **kwargs)
    server = RetrievalServer(
        retriever, host=args.host, port=args.port, default_topk=args.topk, max_topk=args.max_topk, verbose=args.verbose
    )
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
