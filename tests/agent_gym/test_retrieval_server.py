"""The `/retrieve` server on uvicorn (`agent_gym.retrievers.server`), as a real process on loopback.

One server process for the module (`python -m agent_gym.retrievers.http serve`, 2 forked workers,
2 s header and body deadlines, a 256 KiB body limit), started as users start it. Checked: the
unchanged client gets the same hits as in-process BM25; every bad body is answered 400 or 413,
never a reset (the parsing ones against the old stdlib server too, which dropped the connection on
deep JSON); a half-sent request neither blocks others nor is held past the deadlines; the server
survives JSON nested 100,000 deep; a killed worker is replaced. Timings: benchmarks/perf/retrieval_server_load.py.
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent_gym.retrievers import make_retriever
from agent_gym.retrievers.client import HTTPRetriever
from agent_gym.retrievers.http import RetrievalServer

if not all(importlib.util.find_spec(m) for m in ("bm25s", "Stemmer", "fastapi", "uvicorn", "psutil")):
    pytest.skip(
        "needs bm25s, PyStemmer, psutil and the serve extra: pip install -e '.[serve,dev]'", allow_module_level=True
    )

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests" / "fixtures" / "qa" / "corpus.jsonl"
MAX_BODY = 256 << 10
QUERIES = [
    "who directed The Glass Orchard film",
    "lighthouse on the harbour wall",
    "painter of seascapes",
    "slate quarries valley",
    "bicycle maker",
    "no such words zzzz",
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """(url, pid) of a 2-worker uvicorn server on 127.0.0.1, port picked by the server."""
    env = {**os.environ, "AGENT_GYM_CACHE": str(tmp_path_factory.mktemp("cache")), "PYTHONPATH": str(REPO)}
    cmd = [
        sys.executable,
        "-m",
        "agent_gym.retrievers.http",
        "serve",
        "--kind",
        "bm25",
        "--corpus",
        str(CORPUS),
        "--port",
        "0",
        "--workers",
        "2",
        "--header-timeout-s",
        "2",
        "--body-timeout-s",
        "2",
        "--max-body-bytes",
        str(MAX_BODY),
        "--drain-bytes",
        str(4 * MAX_BODY),
        "--max-queries",
        "100",
    ]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        line = proc.stderr.readline().decode()  # the server's first line; it blocks until then
        m = re.search(r"on (http://127\.0\.0\.1:\d+)/retrieve", line)
        if not m:
            proc.kill()
            raise AssertionError(f"server did not start: {line}{proc.communicate(timeout=10)[1].decode()}")
        url = m.group(1)
        client = HTTPRetriever(url, timeout_s=2, retries=0)
        deadline = time.monotonic() + 60
        while True:  # the socket listens before the workers run: wait for an answer
            try:
                client.search(["x"], 1)
                break
            except Exception:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield url, proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", _port(url), timeout=10)
    try:
        conn.request("POST", "/retrieve", body=body, headers=headers or {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def _hits(results):
    return [[(p.id, p.title, p.text, p.score) for p in hits] for hits in results]


@pytest.mark.timeout(60)
def test_client_gets_the_in_process_hits(server):
    url, _ = server
    local = make_retriever("bm25", corpus=str(CORPUS), cache=False)
    client = HTTPRetriever(url, timeout_s=5, retries=0)
    for k in (1, 3, 10):
        for _ in range(3):  # new connections: both workers answer some of these
            assert _hits(client.search(QUERIES, k)) == _hits(local.search(QUERIES, k))
    assert any(_hits(local.search(QUERIES, 3)))  # the check compares real hits, not only empty lists


BAD_BODIES = {  # the wire-format checks shared by both servers (agent_gym.retrievers.wire.parse_request)
    "not json": (b"{", 400, "not JSON"),
    "empty": (b"", 400, "JSON object"),
    "deep json": (b"[" * 100_000, 400, "nested too deep"),
    "deep object": (b'{"a":' * 50_000, 400, "nested too deep"),
    "not utf-8": (b'{"queries": ["\xff\xfe"]}', 400, "not JSON"),
    "list body": (b'["a"]', 400, "JSON object"),
    "queries not a list": (b'{"queries": "a"}', 400, "'queries'"),
    "query not a string": (b'{"queries": ["a", 3]}', 400, "'queries'"),
    "topk float": (b'{"queries": ["a"], "topk": 2.5}', 400, "'topk'"),
    "topk negative": (b'{"queries": ["a"], "topk": -1}', 400, "'topk'"),
    "topk bool": (b'{"queries": ["a"], "topk": true}', 400, "'topk'"),
    "topk huge int": (b'{"queries": ["a"], "topk": ' + b"9" * 5000 + b"}", 400, "not JSON"),
    "topk over max_topk": (b'{"queries": ["a"], "topk": 1000000000}', 400, "over the server's max_topk=100"),
    "return_scores string": (b'{"queries": ["a"], "return_scores": "yes"}', 400, "'return_scores'"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("which", ["uvicorn", "stdlib"])
def test_bad_bodies_get_400_not_a_reset(server, which):
    """Before the fix the deep-JSON bodies raised RecursionError in the stdlib handler and the
    connection dropped with no answer; `return_scores: "yes"` was taken as true."""
    if which == "uvicorn":
        url = server[0]
        _check(url)
        return
    bm25 = make_retriever("bm25", corpus=str(CORPUS), cache=False)
    with RetrievalServer(bm25) as stdlib:
        _check(stdlib.url)


def _check(url: str) -> None:
    for name, (body, status, words) in BAD_BODIES.items():
        got, answer = _post(url, body)
        assert (got, words in answer.get("error", "")) == (status, True), (name, got, answer)
    assert _post(url, json.dumps({"queries": ["painter of seascapes"], "topk": 1}).encode())[0] == 200


@pytest.mark.timeout(60)
def test_oversized_bodies_get_413(server):
    url, _ = server
    port = _port(url)
    # Over the body limit by Content-Length, within what the server drains: a 413, not a reset.
    status, answer = _post(url, json.dumps({"queries": ["a" * (2 * MAX_BODY)]}).encode())
    assert status == 413 and "max_body_bytes" in answer["error"]
    # The same body chunked (no Content-Length): counted as it arrives.
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    chunks = iter([b'{"queries": ["', b"a" * MAX_BODY, b"a" * MAX_BODY, b'"]}'])
    conn.request("POST", "/retrieve", body=chunks, encode_chunked=True, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 413 and "max_body_bytes" in json.loads(resp.read())["error"]
    conn.close()
    # A Content-Length far past the drain limit: answered at once, before any body is sent.
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 413 ")
    # Too many queries in one request.
    status, answer = _post(url, json.dumps({"queries": ["a"] * 101}).encode())
    assert status == 413 and "max_queries=100" in answer["error"]
    assert _post(url, json.dumps({"queries": ["a"] * 100}).encode())[0] == 200


def _recv_all(s: socket.socket) -> bytes:
    out = b""
    while chunk := s.recv(4096):
        out += chunk
    return out


@pytest.mark.timeout(60)
def test_half_sent_requests_neither_block_others_nor_stay(server):
    url, _ = server
    port = _port(url)
    held = []
    for _ in range(8):  # half the headers, and full headers with half the body
        a = socket.create_connection(("127.0.0.1", port), timeout=15)
        a.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: appl")
        b = socket.create_connection(("127.0.0.1", port), timeout=15)
        b.sendall(b'POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"queries": [')
        held += [a, b]
    silent = socket.create_connection(("127.0.0.1", port), timeout=15)  # connects and sends nothing
    held.append(silent)
    try:
        client = HTTPRetriever(url, timeout_s=5, retries=0)
        for _ in range(4):
            assert client.search(["painter of seascapes"], 1)[0][0].title == "Odile Brask"
        # The server closes each one at its deadline (2 s here; the socket timeout is 15 s):
        # half headers and silence with no answer, the half body with 408.
        for i, s in enumerate(held):
            data = _recv_all(s)
            if i % 2 == 1 and s is not silent:
                assert data.startswith(b"HTTP/1.1 408 "), data
            else:
                assert data == b"", data
    finally:
        for s in held:
            s.close()


@pytest.mark.timeout(60)
def test_a_killed_worker_is_replaced(server):
    import psutil

    url, pid = server
    workers = psutil.Process(pid).children()
    assert len(workers) == 2
    os.kill(workers[0].pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while True:
        now = {p.pid for p in psutil.Process(pid).children()}
        if len(now) == 2 and workers[0].pid not in now:
            break
        assert time.monotonic() < deadline, f"workers now {now}, killed {workers[0].pid}"
        time.sleep(0.1)
    client = HTTPRetriever(url, timeout_s=5, retries=0)
    for _ in range(4):
        assert client.search(["bicycle maker"], 1)[0][0].title == "Vance Motor Works"
