"""Cost of RunLogger.log per iteration: fsync on every line (the old behaviour, ``fsync_every_s=0``)
against the batched default (``fsync_every_s=30``), interleaved over rounds.

    python -m benchmarks.perf.logger_cost [--rounds 5] [--lines 50]

Prints the median and range of milliseconds per ``log`` call for each side, their ratio and the
load average; results go to ``benchmarks/results/logger_cost.json``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from agent_gym.provenance import write_raw

ROOT = Path(__file__).resolve().parents[2]

from benchmarks.report import save, spread  # noqa: E402
from trainers.logger import RunLogger  # noqa: E402

METRICS = {f"group/metric_{i}": i * 0.5 for i in range(60)}  # about a real iteration's keys


def per_call_ms(fsync_every_s: float, lines: int) -> float:
    with tempfile.TemporaryDirectory(dir=ROOT / "benchmarks") as d:
        log = RunLogger(d, lines, tensorboard=False, progress_bar=False, fsync_every_s=fsync_every_s)
        t0 = time.perf_counter()
        for it in range(lines):
            log.log(it, METRICS)
        dt = time.perf_counter() - t0
    return 1e3 * dt / lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--lines", type=int, default=50)
    args = ap.parse_args()
    load_before = os.getloadavg()
    sides = {"fsync_each_line": 0.0, "batched_30s": 30.0}
    ms: dict[str, list[float]] = {k: [] for k in sides}
    for _ in range(args.rounds):
        for name, every in sides.items():
            ms[name].append(per_call_ms(every, args.lines))
    out = {
        "rounds": args.rounds,
        "lines": args.lines,
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "ms_per_log": {k: spread(v) for k, v in ms.items()},
    }
    out["ratio_each_over_batched"] = statistics.median(ms["fsync_each_line"]) / statistics.median(ms["batched_30s"])
    for k, v in out["ms_per_log"].items():
        print(f"{k}: {v['median']:.3f} ms per log() [{v['min']:.3f}-{v['max']:.3f}]")
    print(
        f"ratio {out['ratio_each_over_batched']:.1f}x; load average before {load_before[0]:.2f}, "
        f"after {out['load_after'][0]:.2f}"
    )
    write_raw(__file__, out, outputs=[save("logger_cost", out)])


if __name__ == "__main__":
    main()
