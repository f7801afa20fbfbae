"""Search-R1's `/retrieve` wire format, as this package's servers and client speak it.

Request (`POST /retrieve`, JSON): `{"queries": [str, ...], "topk": int, "return_scores": bool}`;
`topk` may be omitted or null, and the server then uses its default.

Answer: `{"result": [per_query, ...]}`, where `per_query` is
`[{"document": doc, "score": float}, ...]` with `return_scores` true, or `[doc, ...]` without.
`doc` is a corpus row; Search-R1's wiki-18 rows are `{"id", "contents"}` with
`contents = '"Title"\\ntext'`. This package's servers also add `title` and `text`; the client reads either.

Both servers (`agent_gym.retrievers.http`, the stdlib one, and `agent_gym.retrievers.server`, on
uvicorn) read a request with `parse_request` (anything but the format above is 400, too many
queries 413) and write the answer with `render_result`; the client (`agent_gym.retrievers.client`)
reads an answer with `parse_result`. `ServerLimits` is what the uvicorn server accepts, flag by flag
of the `serve` command.
"""

from __future__ import annotations

import json
import math
import reprlib
from dataclasses import dataclass
from typing import Any

from agent_gym.datasets.base import normalize_doc

from .base import Passage, RetrieverError

__all__ = [
    "DEFAULT_MAX_QUERIES",
    "BadRequest",
    "ServerLimits",
    "parse_request",
    "parse_result",
    "passage_to_document",
    "render_result",
]

_short = reprlib.Repr()
_short.maxlevel, _short.maxstring, _short.maxother = 3, 120, 120


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
        for name in (
            "max_body_bytes",
            "header_timeout_s",
            "body_timeout_s",
            "keep_alive_s",
            "max_header_bytes",
            "limit_concurrency",
            "backlog",
            "search_threads",
            "max_queries",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"ServerLimits.{name} must be > 0, got {getattr(self, name)!r}")
        if self.drain_bytes < 0:
            raise ValueError(f"ServerLimits.drain_bytes must be >= 0, got {self.drain_bytes!r}")


def parse_request(
    body: bytes, default_topk: int, max_topk: int, max_queries: int = DEFAULT_MAX_QUERIES
) -> tuple[list[str], int, bool]:
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
        raise BadRequest(
            f"{len(queries)} queries in one request, over the server's max_queries={max_queries}; "
            "send them in smaller batches",
            status=413,
        )
    topk = req.get("topk") or default_topk
    if not isinstance(topk, int) or isinstance(topk, bool) or topk < 1:
        raise BadRequest(f"bad request: 'topk' must be a positive integer, got {_short.repr(topk)}; {fmt}")
    if topk > max_topk:
        raise BadRequest(
            f"bad request: 'topk' {_short.repr(topk)} is over the server's max_topk={max_topk}; ask for at "
            f"most {max_topk} passages per query (or start the server with a larger --max-topk)"
        )
    with_scores = req.get("return_scores", False)
    if with_scores is None:
        with_scores = False
    if not isinstance(with_scores, bool):
        raise BadRequest(f"bad request: 'return_scores' must be true or false, got {_short.repr(with_scores)}; {fmt}")
    return queries, topk, with_scores


def render_result(results: list[list[Passage]], with_scores: bool) -> dict[str, Any]:
    """Search results -> the answer's JSON object (module docstring)."""
    if with_scores:
        return {"result": [[{"document": passage_to_document(p), "score": p.score} for p in hits] for hits in results]}
    return {"result": [[passage_to_document(p) for p in hits] for hits in results]}


def parse_result(payload: Any, n: int, source: str) -> list[list[Passage]]:
    """An answer's decoded JSON -> the passages of its ``n`` queries; anything but the wire format
    (module docstring) raises ``RetrieverError`` naming ``source`` (who answered), the query, the rank
    and what was wrong."""
    result = payload.get("result") if isinstance(payload, dict) else payload
    if not isinstance(result, list) or len(result) != n:
        raise RetrieverError(
            f"{source} answered {type(result).__name__} "
            f"of length {len(result) if isinstance(result, list) else '-'}, expected {n} lists"
        )
    out = []
    for q, hits in enumerate(result):
        if not isinstance(hits, list):
            raise RetrieverError(
                f"{source}: the hits of query {q} must be a list, got {type(hits).__name__} {_short.repr(hits)}"
            )
        row = []
        for rank, hit in enumerate(hits):
            where = f"{source}: query {q}, hit {rank}"
            doc = hit.get("document", hit) if isinstance(hit, dict) else None
            if not isinstance(doc, dict):
                raise RetrieverError(
                    f"{where} is malformed: {_short.repr(hit)} (expected a document object "
                    'or {"document": ..., "score": ...})'
                )
            score = hit.get("score") if "document" in hit else None
            if score is not None and not _finite_number(score):
                raise RetrieverError(f"{where} has score {_short.repr(score)}; a score must be a finite number")
            try:
                d = normalize_doc(doc, rank)
            except ValueError as err:
                raise RetrieverError(f"{where}: {err}") from None
            row.append(
                Passage(title=d["title"], text=d["text"], score=float(score) if score is not None else 0.0, id=d["id"])
            )
        out.append(row)
    return out


def _finite_number(x: Any) -> bool:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:  # an int too large for a float
        return False
