"""Is the OpenEnv server's memory bounded over many sessions? (measured before the fix: RSS rose 241 -> 264 MiB
over 800 sessions, slowing but not flat.)

    python benchmarks/faults/serve_soak.py                                   # 5,000 sessions, RSS every 100
    python benchmarks/faults/serve_soak.py --sessions 2000 --concurrency 8   # 8 sessions open at a time
    python benchmarks/faults/serve_soak.py --ref HEAD                        # the server of a commit (before a change)

Starts ``python -m agent_gym.serve`` (a real server process on 127.0.0.1, started and stopped by
``agent_gym.serve_process`` as the server's tests start theirs; with ``--ref``, the ``agent_gym``
and ``envs`` of that commit serve: its ``tree`` argument) and plays ``--sessions`` sessions, one after another or
``--concurrency`` at a time, each: connect to ``/ws``, reset, one step (a wrong answer, which ends
the FactChain episode), close. Every ``--every`` sessions it reads the server's RSS and thread count
from ``/proc/PID/status`` and ``GET /agent_gym/sessions`` (the envs not yet closed and, on a server
that reports it, openenv-core's session table). Reports the curve, start and end RSS (the end once
the last session's env is closed), the growth over the last half of the sessions and a line fit
there (the figures that say whether it levels off), sessions per second, the load average, and how
many tracebacks / ERROR lines the server logged (a normal close logs none). Linux only (``/proc``).

What it found (docs/integrations.md, "OpenEnv"): no leak (the heap in use stayed flat), but the
server's ~250,000 start-up objects made the GC's full collections rare, so closed sessions' cyclic
garbage piled up between them, and glibc kept freed pages in the arenas of the per-session threads;
``agent_gym.env_server.settle_heap`` and ``trim_heap`` fix both.

tests/integrations/test_serve_abuse.py runs it (by path) with 50 sessions.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from agent_gym.provenance import git_tree, write_raw
from agent_gym.serve_process import ENV_ID, free_port, session_table, start_server, stop_server

ROOT = Path(__file__).resolve().parents[2]


def proc_status(pid: int) -> dict[str, int]:
    """The server's resident memory (KiB, ``VmRSS``), its peak (``VmHWM``) and thread count."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "Threads"):
            out[key] = int(value.split()[0])
    return out


def one_session(ws_url: str, seed: int, timeout_s: float) -> None:
    """connect, reset, one step, close; raises if a reply is not the expected observation."""
    from websockets.sync.client import connect

    with connect(ws_url, open_timeout=timeout_s, close_timeout=timeout_s) as ws:
        ws.send(json.dumps({"type": "reset", "data": {"seed": seed}}))
        reply = json.loads(ws.recv(timeout=timeout_s))
        if reply.get("type") != "observation":
            raise RuntimeError(f"session {seed}: reset answered {reply}")
        ws.send(json.dumps({"type": "step", "data": {"text": "<answer>not the answer</answer>"}}))
        reply = json.loads(ws.recv(timeout=timeout_s))
        if reply.get("type") != "observation":
            raise RuntimeError(f"session {seed}: step answered {reply}")


def soak(url: str, pid: int, sessions: int, every: int, concurrency: int = 1, timeout_s: float = 60.0) -> dict:
    """Play ``sessions`` sessions against the server at ``url`` (process ``pid``), ``concurrency``
    at a time (in batches); sample every ``every`` sessions (and before the first). Returns the
    curve and the summary figures."""
    from concurrent.futures import ThreadPoolExecutor

    ws_url = url.replace("http", "ws", 1) + "/ws"
    pool = ThreadPoolExecutor(concurrency) if concurrency > 1 else None

    def sample(done: int, t0: float) -> dict:
        st, table = proc_status(pid), session_table(url)
        return {
            "sessions": done,
            "elapsed_s": round(time.monotonic() - t0, 2),
            "rss_mib": round(st["VmRSS"] / 1024, 1),
            "threads": st["Threads"],
            "open_envs": table["open_envs"],
            "session_table": table.get("sessions"),
        }

    t0 = time.monotonic()
    curve = [sample(0, t0)]
    done = 0
    try:
        while done < sessions:
            batch = range(done, min(done + concurrency, sessions))
            if pool is None:
                one_session(ws_url, done, timeout_s)
            else:
                list(pool.map(lambda i: one_session(ws_url, i, timeout_s), batch))
            before, done = done, batch.stop
            if done // every > before // every or done == sessions:
                curve.append(sample(done, t0))
    finally:
        if pool is not None:
            pool.shutdown()
    wall = time.monotonic() - t0
    # The last sample can be taken before the server has closed the last session's env (it closes
    # it just after the close frame): wait for the table to empty, then sample once more.
    end = time.monotonic() + timeout_s
    while session_table(url)["open_envs"] and time.monotonic() < end:
        time.sleep(0.05)
    settled = sample(sessions, t0)
    half = min(curve, key=lambda p: abs(p["sessions"] - sessions / 2))
    last = [p for p in curve if p["sessions"] >= half["sessions"]]
    slope = (
        statistics.linear_regression([p["sessions"] for p in last], [p["rss_mib"] for p in last]).slope
        if len(last) >= 2
        else None
    )
    return {
        "sessions": sessions,
        "every": every,
        "concurrency": concurrency,
        "curve": curve,
        "settled": settled,
        "start_rss_mib": curve[0]["rss_mib"],
        "end_rss_mib": settled["rss_mib"],
        "peak_rss_mib": round(proc_status(pid)["VmHWM"] / 1024, 1),
        "half_rss_mib": half["rss_mib"],
        "half_at_sessions": half["sessions"],
        "growth_last_half_mib": round(settled["rss_mib"] - half["rss_mib"], 1),
        "growth_first_half_mib": round(half["rss_mib"] - curve[0]["rss_mib"], 1),
        "max_rss_first_half_mib": max(p["rss_mib"] for p in curve if p["sessions"] <= half["sessions"]),
        "max_rss_last_half_mib": max(p["rss_mib"] for p in last),
        "slope_last_half_mib_per_1000": None if slope is None else round(1000 * slope, 2),
        "sessions_per_s": round(sessions / wall, 2),
        "wall_s": round(wall, 1),
    }


def checkout(ref: str, into: Path) -> Path:
    """The tree of ``ref`` (agent_gym, envs) under ``into``."""
    return git_tree(ref, into, ["agent_gym", "envs"])


def log_figures(text: str) -> dict:
    lines = text.splitlines()
    return {
        "log_bytes": len(text.encode()),
        "tracebacks": sum("Traceback (most recent call last)" in ln for ln in lines),
        "error_lines": sum(ln.startswith("ERROR") for ln in lines),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=5000)
    ap.add_argument("--every", type=int, default=100, help="sample the RSS every this many sessions")
    ap.add_argument("--concurrency", type=int, default=1, help="sessions open at once (played in batches)")
    ap.add_argument("--env-kwargs", default='{"max_turns": 4}', help="JSON env kwargs for the server")
    ap.add_argument(
        "--ref",
        default=None,
        help="serve the agent_gym and envs of this commit instead of this tree "
        "(e.g. HEAD, for the figures before a change)",
    )
    ap.add_argument("--label", default=None)
    args = ap.parse_args(argv)
    if args.sessions < 2 or args.every < 1 or args.concurrency < 1:
        raise SystemExit("error: --sessions must be at least 2, --every and --concurrency at least 1")
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "server.log"
        tree = checkout(args.ref, Path(tmp) / "tree") if args.ref else ROOT
        port = free_port()
        proc = start_server(port, json.loads(args.env_kwargs), log, tree=tree)
        try:
            res = soak(f"http://127.0.0.1:{port}", proc.pid, args.sessions, args.every, args.concurrency)
        finally:
            stop_server(proc)
        res.update(log_figures(log.read_text(errors="replace")))
    res.update(
        ref=args.ref,
        env_id=ENV_ID,
        env_kwargs=json.loads(args.env_kwargs),
        load_average_before=list(load_before),
        load_average_after=list(os.getloadavg()),
        cpu_count=os.cpu_count(),
    )
    for p in res["curve"]:
        print(
            f"{p['sessions']:>6} sessions  {p['elapsed_s']:>7.1f} s  RSS {p['rss_mib']:>6.1f} MiB  "
            f"threads {p['threads']:>3}  open envs {p['open_envs']}  session table {p['session_table']}"
        )
    print(
        f"RSS {res['start_rss_mib']} -> {res['end_rss_mib']} MiB over {res['sessions']} sessions "
        f"(peak {res['peak_rss_mib']}); first half {res['growth_first_half_mib']:+.1f} MiB, last half "
        f"{res['growth_last_half_mib']:+.1f} MiB (fit: {res['slope_last_half_mib_per_1000']} MiB per 1,000 "
        f"sessions; max {res['max_rss_first_half_mib']} then {res['max_rss_last_half_mib']} MiB); "
        f"{res['sessions_per_s']} sessions/s; server log: {res['tracebacks']} tracebacks, {res['error_lines']} "
        f"ERROR lines, {res['log_bytes']} bytes; load average {load_before[0]:.2f} -> "
        f"{res['load_average_after'][0]:.2f} on {os.cpu_count()} CPUs"
    )
    write_raw(__file__, res, label=args.label, argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
