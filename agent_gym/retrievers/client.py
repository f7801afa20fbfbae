"""`HTTPRetriever`: the client of a `/retrieve` server (this package's, or Search-R1's own FastAPI
server), speaking the wire format of `agent_gym.retrievers.wire`. It is a `Retriever` (kind "http").

Each attempt has one deadline (`timeout_s`) that covers the DNS lookup, connecting (every resolved
address shares what is left of it), the TLS handshake, sending, the headers and the body, whatever
the server does (no `Content-Length`, `Connection: close`, HTTP/1.0, chunks, one byte at a time): a
watchdog shuts the socket down when it passes. Connection errors, timeouts and 5xx answers are
retried `retries` times with backoff, and then a `RetrieverError` is raised: a `search` call takes at
most `(retries + 1) * timeout_s + backoff_s * (2**retries - 1)` seconds (plus scheduling slack), so a
down, unreachable or slow server never hangs an env. An answer is read up to `max_response_bytes`
(default 64 MiB; a larger `Content-Length` is refused before reading, an endless body once it
passes the cap), and anything but the wire format (a hit that is not an object, a score that is not
a finite number, a null or non-string title/text, JSON nested too deep to decode, bytes that are not
UTF-8 JSON) raises `RetrieverError` naming what was wrong; none of these is retried.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import socket
import threading
import time
import urllib.parse
from typing import Any

from .base import Passage, RetrieverError, check_k
from .wire import parse_result

__all__ = ["DEFAULT_MAX_RESPONSE_BYTES", "HTTPRetriever"]


DEFAULT_MAX_RESPONSE_BYTES = 64 << 20
"""The default cap on one answer's body (``HTTPRetriever(max_response_bytes=...)``)."""
_ERROR_BODY_BYTES = 2000  # what is read of a non-2xx answer's body, for the error message
_CHUNK = 1 << 16


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

    def __init__(
        self,
        url: str,
        timeout_s: float = 10.0,
        retries: int = 2,
        backoff_s: float = 0.2,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ):
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
            f"retrieval server {self.url} failed after {attempts} attempt(s) (timeout {self.timeout_s:g}s each): {last}"
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
                "(retriever_kwargs in the QA envs) if the server is right, or ask for fewer queries or passages"
            )
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
            "right, or ask for fewer queries or passages"
        )

    def _parse(self, payload: Any, n: int) -> list[list[Passage]]:
        """The wire format (:func:`agent_gym.retrievers.wire.parse_result`) -> passages."""
        return parse_result(payload, n, f"retrieval server {self.url}")


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
