"""The `/retrieve` server under load: the old stdlib server against the uvicorn one.

    python benchmarks/perf/retrieval_server_load.py                   # 3 rounds, 64 clients x 20 requests
    python benchmarks/perf/retrieval_server_load.py --rounds 5 --clients 32 --requests 50 --half-open 50

Loopback only. Each round starts each server as users do (`python -m agent_gym.retrievers.http
serve --server stdlib|uvicorn`, BM25 over the shared HotpotQA corpus, the uvicorn one with
`--workers` forked workers and its default limits), in alternating order (A, B then B, A), and:

1. opens `--half-open` idle connections that each send half a request line and headers and then
   nothing; a keeper thread reopens any that the server closes, so that many stay open for the
   whole round (a slowloris that reconnects);
2. runs `--clients` threads, each making `--requests` calls of `HTTPRetriever.search` (the
   project's client, `retries=0`, `timeout_s=30`) with 4 HotpotQA questions, top 3;
3. meanwhile, every few requests of one client, sends one of the bad bodies below on its own
   connection and records the status, or the exception if no answer came.

A failed request is any `RetrieverError` (a reset, a timeout, a 5xx, a malformed answer). It also
checks that the hits of the first 40 questions are exactly the in-process BM25's, and records the
servers' memory (RSS and PSS of every server process, psutil). Reports per server the median and
range over rounds of failed requests, p50 and p99 latency and throughput, the bad bodies'
answers, and the 1-minute load average around each round. Bounded: every request has a 30 s
deadline and the whole run stops after `--max-seconds` (what is measured by then is reported).
Results go to `benchmarks/results/retrieval_server_load.json` (git-ignored) and are printed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import select
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from agent_gym.provenance import write_raw

ROOT = Path(__file__).resolve().parents[2]

from agent_gym.retrievers import RetrieverError, make_retriever  # noqa: E402
from agent_gym.retrievers.client import HTTPRetriever  # noqa: E402

SHARED = Path(os.environ.get("AGENT_GYM_SHARED_DATA", ROOT.parent / "shared" / "data")) / "hotpotqa"
BAD_BODIES = {
    "not_json": b'{"queries": ["a"',
    "deep_json_100k": b"[" * 100_000,
    "wrong_types": b'{"queries": "who", "topk": "3"}',
    "not_utf8": b'{"queries": ["\xff\xfe"]}',
    "oversized_2MiB": json.dumps({"queries": ["word " * ((2 << 20) // 5)]}).encode(),
}


def start(kind: str, corpus: Path, workers: int, cache: Path) -> tuple[subprocess.Popen, str]:
    cmd = [
        sys.executable,
        "-m",
        "agent_gym.retrievers.http",
        "serve",
        "--server",
        kind,
        "--kind",
        "bm25",
        "--corpus",
        str(corpus),
        "--port",
        "0",
    ]
    if kind == "uvicorn":
        cmd += ["--workers", str(workers)]
    env = {**os.environ, "AGENT_GYM_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    line = proc.stderr.readline().decode()
    m = re.search(r"on (http://127\.0\.0\.1:\d+)/retrieve", line)
    if not m:
        proc.kill()
        raise RuntimeError(f"{kind} server did not start: {line}{proc.communicate(timeout=10)[1].decode()}")
    url = m.group(1)
    probe = HTTPRetriever(url, timeout_s=5, retries=0)
    deadline = time.monotonic() + 120
    while True:
        try:
            probe.search(["x"], 1)
            return proc, url
        except RetrieverError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise
            time.sleep(0.2)


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


class HalfOpen:
    """`n` connections that send half a request and hold it; reopened when the server closes one."""

    HALF = b"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty"

    def __init__(self, port: int, n: int):
        self.port, self.n = port, n
        self.socks: list[socket.socket] = []
        self.reopened = 0
        self.open_failures = 0
        self._stop = threading.Event()
        for _ in range(n):
            self._open()
        self._thread = threading.Thread(target=self._keep, daemon=True)
        self._thread.start()

    def _open(self) -> None:
        try:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            s.sendall(self.HALF)
            self.socks.append(s)
        except OSError:
            self.open_failures += 1

    def _keep(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select(self.socks, [], [], 0.5) if self.socks else ([], [], [])
            for s in ready:  # closed (or answered) by the server: open another
                self.socks.remove(s)
                s.close()
                self.reopened += 1
            while len(self.socks) < self.n and not self._stop.is_set():
                self._open()
            if not self.socks:
                time.sleep(0.5)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for s in self.socks:
            s.close()


def send_bad(port: int, body: bytes) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", "/retrieve", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        return str(resp.status)
    except (OSError, http.client.HTTPException) as err:
        return type(err).__name__
    finally:
        conn.close()


def memory(pid: int) -> dict:
    import psutil

    procs = [psutil.Process(pid), *psutil.Process(pid).children()]
    out = {"processes": len(procs), "rss_mb": 0.0, "pss_mb": 0.0}
    for p in procs:
        info = p.memory_full_info()
        out["rss_mb"] += info.rss / 2**20
        out["pss_mb"] += getattr(info, "pss", info.rss) / 2**20
    return {k: round(v, 1) if isinstance(v, float) else v for k, v in out.items()}


def run_round(kind: str, args, questions: list[str], expected: dict, cache: Path, deadline: float) -> dict:
    proc, url = start(kind, SHARED / "corpus.jsonl", args.workers, cache)
    port = int(url.rsplit(":", 1)[1])
    try:
        client = HTTPRetriever(url, timeout_s=30, retries=0)
        same = [[(p.id, p.score) for p in h] for h in client.search(list(expected), 3)] == list(expected.values())
        half = HalfOpen(port, args.half_open)
        load_before = os.getloadavg()[0]
        lat: list[float] = []
        errors: dict[str, int] = {}
        bad: dict[str, str] = {}
        lock = threading.Lock()
        bad_iter = iter(BAD_BODIES.items())

        def worker(c: int) -> None:
            for r in range(args.requests):
                if time.monotonic() > deadline:
                    return
                if c == 0 and r % 3 == 1:  # a bad body now and then, during the load
                    item = next(bad_iter, None)
                    if item is not None:
                        bad[item[0]] = send_bad(port, item[1])
                i = (c * args.requests + r) * 4
                qs = [questions[(i + j) % len(questions)] for j in range(4)]
                t0 = time.perf_counter()
                try:
                    client.search(qs, 3)
                    with lock:
                        lat.append(time.perf_counter() - t0)
                except RetrieverError as err:
                    name = re.search(r"each\): (HTTP \d+|[\w.]+)", str(err))  # the last attempt's error
                    with lock:
                        key = name.group(1) if name else str(err)[:80]
                        errors[key] = errors.get(key, 0) + 1

        t0 = time.perf_counter()
        threads = [threading.Thread(target=worker, args=(c,)) for c in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        for name, body in bad_iter:  # any not sent yet (a short run): after the load
            bad[name] = send_bad(port, body)
        alive = send_bad(port, json.dumps({"queries": ["Ed Wood"]}).encode())
        mem = memory(proc.pid)
        half.close()
        lat.sort()
        n_failed = sum(errors.values())
        return {
            "server": kind,
            "requests": len(lat) + n_failed,
            "failed": n_failed,
            "errors": errors,
            "p50_s": round(lat[len(lat) // 2], 4) if lat else None,
            "p99_s": round(lat[min(len(lat) - 1, int(0.99 * len(lat)))], 4) if lat else None,
            "mean_s": round(statistics.fmean(lat), 4) if lat else None,
            "max_s": round(lat[-1], 4) if lat else None,
            "req_per_s": round(len(lat) / wall, 1),
            "wall_s": round(wall, 1),
            "bad_bodies": bad,
            "status_after": alive,
            "hits_equal_in_process": same,
            "half_open_reopened": half.reopened,
            "half_open_connect_failures": half.open_failures,
            "memory": mem,
            "load_before": round(load_before, 2),
            "load_after": round(os.getloadavg()[0], 2),
        }
    finally:
        stop(proc)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--requests", type=int, default=20, help="per client")
    ap.add_argument("--half-open", type=int, default=100)
    ap.add_argument("--workers", type=int, default=2, help="uvicorn worker processes")
    ap.add_argument("--max-seconds", type=float, default=900, help="stop starting work after this long")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "retrieval_server_load.json"))
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the servers (finally) when killed
    if not (SHARED / "corpus.jsonl").is_file():
        print(f"skipped: no HotpotQA corpus at {SHARED} (set AGENT_GYM_SHARED_DATA)")
        return 0
    deadline = time.monotonic() + args.max_seconds
    cache = ROOT / ".cache" / "bench_retrieval_server"
    os.environ["AGENT_GYM_CACHE"] = str(cache)
    bm25 = make_retriever("bm25", corpus=str(SHARED / "corpus.jsonl"))  # builds the index the servers load
    rows = [json.loads(line) for line in (SHARED / "dev_sample.jsonl").open()]
    questions = [r["question"] for r in rows]
    expected = {q: [(p.id, p.score) for p in h] for q, h in zip(questions[:40], bm25.search(questions[:40], 3))}
    del bm25
    results: list[dict] = []
    for r in range(args.rounds):
        order = ("stdlib", "uvicorn") if r % 2 == 0 else ("uvicorn", "stdlib")
        for kind in order:
            if time.monotonic() > deadline:
                break
            res = run_round(kind, args, questions, expected, cache, deadline)
            res["round"] = r
            results.append(res)
            print(json.dumps(res), flush=True)
    summary = {}
    for kind in ("stdlib", "uvicorn"):
        rs = [x for x in results if x["server"] == kind]
        if not rs:
            continue

        def med(key: str) -> dict:
            vals = [x[key] for x in rs if x[key] is not None]
            return {"median": statistics.median(vals), "min": min(vals), "max": max(vals)} if vals else {}

        summary[kind] = {
            "rounds": len(rs),
            "requests_per_round": rs[0]["requests"],
            "failed": med("failed"),
            "p50_s": med("p50_s"),
            "p99_s": med("p99_s"),
            "mean_s": med("mean_s"),
            "max_s": med("max_s"),
            "req_per_s": med("req_per_s"),
            "bad_bodies": {k: sorted({x["bad_bodies"].get(k, "-") for x in rs}) for k in BAD_BODIES},
            "hits_equal_in_process": all(x["hits_equal_in_process"] for x in rs),
            "memory": rs[-1]["memory"],
            "load": [min(x["load_before"] for x in rs), max(x["load_after"] for x in rs)],
        }
    out = {"config": vars(args), "cpus": os.cpu_count(), "summary": summary, "rounds": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    write_raw(__file__, out, outputs=[args.out])
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
