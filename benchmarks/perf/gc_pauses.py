"""Garbage-collection pauses in training: ``gc_freeze: true`` (the default) against ``false``.

    python -m benchmarks.perf.gc_pauses [--rounds 3] [--iterations 12]

Each run is ``trainers/train_grpo.py --config configs/factchain_grpo.yaml`` on the tiny model from
scratch (no warm start; evaluation only at the first and last iteration), in its own process,
the two settings interleaved (true, false, true, false, ...). From each run's metrics.jsonl
(iteration 0 excluded: it holds start-up) it sums ``perf/gc_full_s`` / ``perf/gc_s`` and counts
full collections, and takes the median ``time/iteration_s``. Prints median and range per
setting and the load average; writes ``benchmarks/results/gc_pauses.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from agent_gym.provenance import write_raw

ROOT = Path(__file__).resolve().parents[2]

from benchmarks.report import save, spread  # noqa: E402


def run(freeze: bool, iterations: int, tmp: Path) -> dict[str, float]:
    run_dir = tmp / f"run_{freeze}_{len(list(tmp.iterdir()))}"
    cmd = [
        sys.executable,
        str(ROOT / "trainers" / "train_grpo.py"),
        "--config",
        str(ROOT / "configs" / "factchain_grpo.yaml"),
        f"run.run_dir={run_dir}",
        "model.init_from=null",
        f"run.iterations={iterations}",
        "run.max_minutes=null",
        f"eval.every={iterations}",
        "eval.tasks=8",
        "eval.sets={}",
        "run.tensorboard=false",
        "run.progress_bar=false",
        f"run.checkpoint_every={iterations}",
        "model.torch_threads=1",
        f"run.gc_freeze={str(freeze).lower()}",
    ]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"run failed ({out.returncode}): {out.stderr[-3000:]}")
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()][1:]
    return {
        "gc_full_s": sum(r["perf/gc_full_s"] for r in recs),
        "gc_s": sum(r["perf/gc_s"] for r in recs),
        "full_collections": sum(r["perf/gc_full_collections"] for r in recs),
        "collections": sum(r["perf/gc_collections"] for r in recs),
        "iteration_s_median": statistics.median(r["time/iteration_s"] for r in recs),
        "frozen_objects": recs[0]["perf/gc_frozen_objects"],
        "iterations_counted": len(recs),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=12)
    args = ap.parse_args()
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, float]]] = {"freeze": [], "no_freeze": []}
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.rounds):
            for name, freeze in (("freeze", True), ("no_freeze", False)):
                runs[name].append(run(freeze, args.iterations, Path(d)))
                print(f"round {r} {name}: {runs[name][-1]}", flush=True)
    summary = {name: {k: spread(x[k] for x in rs) for k in rs[0]} for name, rs in runs.items()}
    out = {
        "rounds": args.rounds,
        "iterations": args.iterations,
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "runs": runs,
        "summary": summary,
    }
    for name, s in summary.items():
        print(
            f"{name}: full-GC {s['gc_full_s']['median']:.3f} s in {s['full_collections']['median']:.0f} collections "
            f"[{s['gc_full_s']['min']:.3f}-{s['gc_full_s']['max']:.3f}], all GC {s['gc_s']['median']:.3f} s, "
            f"iteration {s['iteration_s_median']['median']:.3f} s, frozen {s['frozen_objects']['median']:.0f}"
        )
    print(f"load average before {load_before[0]:.2f}, after {out['load_after'][0]:.2f}")
    write_raw(__file__, out, outputs=[save("gc_pauses", out)])


if __name__ == "__main__":
    main()
