"""How long `HTTPRetriever.search` takes against servers that misbehave, and how much memory an
endless answer costs it.

    python -m benchmarks.faults.http_faults                 # 3 rounds
    python -m benchmarks.faults.http_faults --rounds 5 --timeout 1.0 --retries 1

Each case is a real loopback server (tests/agent_gym/fault_server.py) that reads the request and
then answers badly, without end:

- `drip_close`: HTTP/1.1, `Connection: close`, no Content-Length, one body byte every 0.2 s;
- `drip_http10`: HTTP/1.0, no Content-Length, one body byte every 0.2 s;
- `drip_chunked`: chunked, one 1-byte chunk every 0.2 s;
- `drip_length`: a Content-Length of 1,000,000, one body byte every 0.2 s;
- `drip_headers`: the status line and headers one byte every 0.2 s;
- `flood_close`: no Content-Length, 64 KiB blocks as fast as the client reads (timing and the
  client's tracemalloc peak, with `max_response_bytes` = 1 MiB).

Every drip case must end with `RetrieverError` within the documented bound
`(retries + 1) * timeout_s + backoff_s * (2**retries - 1)` (plus scheduling slack); the flood
case must end at the cap, with a peak far below the stream. The cases run interleaved
(A, B, C, ... A, B, C, ...) over `--rounds` rounds; each reports the median and range of the
seconds per `search` call, and the 1-minute load average before and after. Results go to
`benchmarks/results/http_faults.json` (git-ignored) and are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
import tracemalloc
from pathlib import Path

from agent_gym.provenance import write_raw

ROOT = Path(__file__).resolve().parents[2]

from agent_gym.retrievers import RetrieverError  # noqa: E402
from agent_gym.retrievers.client import HTTPRetriever  # noqa: E402
from tests.agent_gym.fault_server import FaultServer, drip, flood  # noqa: E402

JSON = b"Content-Type: application/json\r\n"
HEADS = {
    "drip_close": b"HTTP/1.1 200 OK\r\n" + JSON + b"Connection: close\r\n\r\n",
    "drip_http10": b"HTTP/1.0 200 OK\r\n" + JSON + b"\r\n",
    "drip_length": b"HTTP/1.1 200 OK\r\n" + JSON + b"Content-Length: 1000000\r\n\r\n",
}
CAP = 1 << 20


def _chunks(conn, stop):
    conn.sendall(b"HTTP/1.1 200 OK\r\n" + JSON + b"Transfer-Encoding: chunked\r\n\r\n")
    while not stop.wait(0.2):
        conn.sendall(b"1\r\n \r\n")


def _slow_headers(conn, stop):
    for b in HEADS["drip_close"]:
        if stop.wait(0.2):
            return
        conn.sendall(bytes([b]))


SERVERS = {
    "drip_close": lambda: drip(HEADS["drip_close"]),
    "drip_http10": lambda: drip(HEADS["drip_http10"]),
    "drip_chunked": lambda: _chunks,
    "drip_length": lambda: drip(HEADS["drip_length"]),
    "drip_headers": lambda: _slow_headers,
    "flood_close": lambda: flood(HEADS["drip_close"]),
}


def one_call(url: str, args: argparse.Namespace, measure_memory: bool) -> tuple[float, str, int | None]:
    client = HTTPRetriever(
        url, timeout_s=args.timeout, retries=args.retries, backoff_s=args.backoff, max_response_bytes=CAP
    )
    if measure_memory:
        tracemalloc.start()
    t0 = time.monotonic()
    try:
        client.search(["q"], 1)
        outcome = "returned"
    except RetrieverError as err:
        outcome = "RetrieverError: " + str(err).split(": ", 1)[-1][:90]
    except BaseException as err:  # noqa: BLE001  (anything else is a finding to report)
        outcome = f"{type(err).__name__}: {err}"[:120]
    elapsed = time.monotonic() - t0
    peak = None
    if measure_memory:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return elapsed, outcome, peak


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=1.0)
    ap.add_argument("--retries", type=int, default=1)
    ap.add_argument("--backoff", type=float, default=0.05)
    args = ap.parse_args(argv)
    bound = (args.retries + 1) * args.timeout + args.backoff * (2**args.retries - 1)
    servers = {name: FaultServer(make()) for name, make in SERVERS.items()}
    load_before = os.getloadavg()[0]
    times: dict[str, list[float]] = {n: [] for n in servers}
    outcomes: dict[str, set[str]] = {n: set() for n in servers}
    peaks: list[int] = []
    try:
        for _ in range(args.rounds):
            for name, server in servers.items():
                t, outcome, peak = one_call(server.url, args, measure_memory=name.startswith("flood"))
                times[name].append(t)
                outcomes[name].add(outcome)
                if peak is not None:
                    peaks.append(peak)
    finally:
        for server in servers.values():
            server.close()
    load_after = os.getloadavg()[0]
    rows = {}
    print(
        f"timeout_s={args.timeout:g} retries={args.retries} backoff_s={args.backoff:g}: "
        f"documented bound {bound:.2f} s per call; max_response_bytes={CAP:,}"
    )
    print(f"{'case':<14} {'median s':>9} {'min s':>7} {'max s':>7}  outcome")
    for name in servers:
        ts = times[name]
        rows[name] = {
            "seconds": ts,
            "median_s": statistics.median(ts),
            "min_s": min(ts),
            "max_s": max(ts),
            "outcomes": sorted(outcomes[name]),
        }
        print(
            f"{name:<14} {statistics.median(ts):9.3f} {min(ts):7.3f} {max(ts):7.3f}  {' | '.join(sorted(outcomes[name]))}"
        )
    print(
        f"flood_close tracemalloc peak: median {statistics.median(peaks) / 2**20:.2f} MiB "
        f"(range {min(peaks) / 2**20:.2f}-{max(peaks) / 2**20:.2f}), cap {CAP / 2**20:.0f} MiB"
    )
    print(f"load average (1 min): {load_before:.2f} before, {load_after:.2f} after; {os.cpu_count()} CPUs")
    out = {
        "bound_s": bound,
        "timeout_s": args.timeout,
        "retries": args.retries,
        "backoff_s": args.backoff,
        "rounds": args.rounds,
        "cases": rows,
        "flood_peak_bytes": peaks,
        "max_response_bytes": CAP,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    res = ROOT / "benchmarks" / "results"
    res.mkdir(exist_ok=True)
    (res / "http_faults.json").write_text(json.dumps(out, indent=1))
    write_raw(__file__, out, argv=argv, outputs=[res / "http_faults.json"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
