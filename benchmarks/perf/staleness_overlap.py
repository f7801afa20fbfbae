"""Overlapping rollout with training (``rollout.max_staleness: 1``) against the plain loop (0), on
this machine.

    python -m benchmarks.perf.staleness_overlap [--rounds 3] [--iterations 10] [--threads 1]

Each run is ``trainers/train_grpo.py --config configs/factchain_grpo.yaml`` on the tiny model from
scratch (evaluation only at the first and last iteration, which wait for the rollout in flight),
in its own process, the two settings interleaved (0, 1, 0, 1, ...). From each run's metrics.jsonl
(iteration 0 excluded: it holds start-up, and with staleness 1 its rollout is the only one not
overlapped) it takes the median ``time/iteration_s``, the summed ``time/rollout_wait_s`` (how long
the learner waited for a rollout: with 0 the whole rollout, with 1 what the update did not hide)
and the run's wall time. Prints median and range per setting and the load average; writes
``benchmarks/results/staleness_overlap.json``.

What to expect: the overlap hides the shorter of rollout and update behind the longer only when
they do not compete for the same processor. Here both run on the same 2 CPU cores (the rollout in
a background thread with its own copy of the weights), so the gain is bounded by the idle core
time; on separate rollout and training devices (a vLLM engine or Ray workers on their own GPUs)
the iteration time becomes the longer of the two instead of their sum.
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


def run(staleness: int, iterations: int, threads: int, tmp: Path) -> dict[str, float]:
    run_dir = tmp / f"run_{staleness}_{len(list(tmp.iterdir()))}"
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
        f"model.torch_threads={threads}",
        f"rollout.max_staleness={staleness}",
    ]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"run failed ({out.returncode}): {out.stderr[-3000:]}")
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    body = recs[1:]
    return {
        "iteration_s_median": statistics.median(r["time/iteration_s"] for r in body),
        "rollout_wait_s": sum(r["time/rollout_wait_s"] for r in body),
        "generate_s": sum(r["time/generate_s"] for r in body),
        "forward_backward_s": sum(r["time/forward_backward_s"] for r in body),
        "wall_min": recs[-1]["time/elapsed_min"],
        "staleness_max": max(r["rollout/staleness_max"] for r in recs),
        "success_last": recs[-1].get("eval/success_rate", float("nan")),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of each run")
    args = ap.parse_args()
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, float]]] = {"staleness_0": [], "staleness_1": []}
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.rounds):
            for s in (0, 1):
                runs[f"staleness_{s}"].append(run(s, args.iterations, args.threads, Path(d)))
                print(f"round {r} staleness {s}: {runs[f'staleness_{s}'][-1]}", flush=True)
    summary = {name: {k: spread(x[k] for x in rs) for k in rs[0]} for name, rs in runs.items()}
    ratio = spread(
        b["iteration_s_median"] / a["iteration_s_median"] for a, b in zip(runs["staleness_0"], runs["staleness_1"])
    )
    out = {
        "rounds": args.rounds,
        "iterations": args.iterations,
        "threads": args.threads,
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "runs": runs,
        "summary": summary,
        "iteration_time_ratio_1_over_0": ratio,
    }
    print(
        json.dumps(
            {
                "summary": summary,
                "iteration_time_ratio_1_over_0": ratio,
                "load_before": load_before,
                "load_after": out["load_after"],
            },
            indent=1,
        )
    )
    write_raw(__file__, out, outputs=[save("staleness_overlap", out)])


if __name__ == "__main__":
    main()
