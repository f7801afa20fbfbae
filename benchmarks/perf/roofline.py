"""This machine's roofline for the trainer: matmul throughput at SmolLM2-135M's own shapes and
memory bandwidth, on 1 and 2 threads.

    python -m benchmarks.perf.roofline [--rounds 3] [--threads 1 2] [--tokens 2048] [--mem-mb 256]

Kernels (SmolLM2-135M: hidden 576, 9 query heads and 3 key/value heads of 64, MLP 1536,
vocabulary 49,152; ``--tokens`` rows, as in one micro-batch of the QA runs):

- ``q_o``: [T, 576] x [576, 576] (the query and output projections)
- ``k_v``: [T, 576] x [576, 192] (the key and value projections)
- ``gate_up``: [T, 576] x [576, 1536]; ``down``: [T, 1536] x [1536, 576] (the MLP)
- ``head``: [T/4, 576] x [576, 49152] (the vocabulary head; a quarter of the rows keeps the output
  at 100 MB)

each in float32 and in bfloat16 (plain ``torch.matmul`` on bf16 tensors: what a bf16 model's
linear layers run, outside autocast's oneDNN paths), as GFLOP/s (2·m·k·n per product); and memory
bandwidth as GB/s: ``copy`` (``dst.copy_(src)`` over ``--mem-mb`` MB: bytes read + written) and
``read`` (``src.sum()``: bytes read).

Each thread count runs in a fresh process (OpenMP reads its settings when torch loads), the
counts interleaved over ``--rounds`` (1, 2, 1, 2, ...). A process warms each kernel up, then times
it for about ``--seconds`` and reports the median of its repeats; the figure per (kernel, threads)
is the median over rounds, with the range. Prints a table, the 2-thread/1-thread ratio, and the
load average before and after; the raw output goes to ``results/roofline/`` (agent_gym/provenance.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from agent_gym.provenance import write_raw

HIDDEN, KV, MLP, VOCAB = 576, 192, 1536, 49152

WORKER = r"""
import json, statistics, sys, time
import torch
threads, tokens, mem_mb, seconds = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
torch.set_num_threads(threads)
torch.manual_seed(0)
H, KV, MLP, V = %d, %d, %d, %d
shapes = {"q_o": (tokens, H, H), "k_v": (tokens, H, KV), "gate_up": (tokens, H, MLP),
          "down": (tokens, MLP, H), "head": (max(tokens // 4, 1), H, V)}

def timed(fn, min_repeats=3):
    fn(); fn()  # warm-up: allocator, oneDNN primitive caches
    times, start = [], time.perf_counter()
    while len(times) < min_repeats or time.perf_counter() - start < seconds:
        t0 = time.perf_counter(); fn(); times.append(time.perf_counter() - t0)
    return statistics.median(times)

out = {"threads": torch.get_num_threads(), "matmul_gflops": {}, "bandwidth_gbs": {}}
for dtype in (torch.float32, torch.bfloat16):
    for name, (m, k, n) in shapes.items():
        a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
        c = torch.empty(m, n, dtype=dtype)
        s = timed(lambda: torch.matmul(a, b, out=c))
        out["matmul_gflops"][f"{name}/{str(dtype).split('.')[-1]}"] = 2 * m * k * n / s / 1e9
n = mem_mb * 2**20 // 4
src, dst = torch.rand(n), torch.empty(n)
out["bandwidth_gbs"]["copy"] = 2 * n * 4 / timed(lambda: dst.copy_(src)) / 1e9
out["bandwidth_gbs"]["read"] = n * 4 / timed(lambda: src.sum()) / 1e9
print(json.dumps(out))
""" % (HIDDEN, KV, MLP, VOCAB)


def run_one(threads: int, args: argparse.Namespace) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    proc = subprocess.run(
        [sys.executable, "-c", WORKER, str(threads), str(args.tokens), str(args.mem_mb), str(args.seconds)],
        capture_output=True,
        text=True,
        env=env,
        timeout=args.timeout,
    )
    if proc.returncode != 0:
        raise SystemExit(f"error: the {threads}-thread worker failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--tokens", type=int, default=2048, help="rows of each product (one micro-batch's tokens)")
    ap.add_argument("--mem-mb", type=int, default=256, help="size of the bandwidth buffers")
    ap.add_argument("--seconds", type=float, default=1.0, help="time per kernel per process, after warm-up")
    ap.add_argument("--timeout", type=float, default=600.0, help="deadline of one worker process, seconds")
    ap.add_argument("--label", default=None)
    args = ap.parse_args(argv)
    if args.rounds < 1 or not args.threads or min(args.threads) < 1:
        ap.error("--rounds and every --threads must be at least 1")

    load_before = os.getloadavg()
    runs: dict[int, list[dict]] = {t: [] for t in args.threads}
    for r in range(args.rounds):
        for t in args.threads:
            runs[t].append(run_one(t, args))
            print(f"round {r + 1}/{args.rounds}, {t} thread(s): done", file=sys.stderr, flush=True)
    load_after = os.getloadavg()

    table: dict[str, dict[str, dict[str, float]]] = {}
    for t, rs in runs.items():
        for group in ("matmul_gflops", "bandwidth_gbs"):
            for kernel in rs[0][group]:
                vals = [x[group][kernel] for x in rs]
                table.setdefault(f"{group}:{kernel}", {})[str(t)] = {
                    "median": statistics.median(vals),
                    "min": min(vals),
                    "max": max(vals),
                }

    print(
        f"load average before {load_before}, after {load_after}; {args.rounds} interleaved rounds; "
        f"{args.tokens} rows per product"
    )
    head = "".join(f"{str(t) + ' thr (range)':>26}" for t in args.threads)
    ratio = len(args.threads) > 1
    print(f"{'kernel':30}{head}" + (f"{'ratio':>8}" if ratio else ""))
    for key, per in table.items():
        unit = "GFLOP/s" if key.startswith("matmul") else "GB/s"
        cells = "".join(
            f"{per[str(t)]['median']:>9.1f} ({per[str(t)]['min']:.1f}-{per[str(t)]['max']:.1f})".rjust(26)
            for t in args.threads
        )
        extra = f"{per[str(args.threads[-1])]['median'] / per[str(args.threads[0])]['median']:>8.2f}" if ratio else ""
        print(f"{key.split(':', 1)[1] + ' ' + unit:30}{cells}{extra}")

    result = {
        "conditions": {
            "rounds": args.rounds,
            "threads": args.threads,
            "tokens": args.tokens,
            "mem_mb": args.mem_mb,
            "seconds": args.seconds,
            "load_before": load_before,
            "load_after": load_after,
        },
        "table": table,
        "runs": {str(t): rs for t, rs in runs.items()},
    }
    write_raw(__file__, result, label=args.label, argv=argv)
    return result


if __name__ == "__main__":
    main()
