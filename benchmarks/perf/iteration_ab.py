"""A whole training iteration, an old commit against a new one: same config, seed and batch, interleaved.

    .venv-vllm/bin/python -m benchmarks.perf.iteration_ab --old c782ba5 \
        --config configs/smollm2_qa_grpo_from_sft.yaml rollout.backend=vllm

Each side is a commit checked out in its own git worktree (under .cache/iteration_ab/, made once;
``--new .`` is this checkout, the default). Each round runs ``trainers/train_grpo.py`` of the old
side, then of the new side (old, new, old, new, ...; ``--rounds``, at least 3), each with that
side's own copy of ``--config`` and the overrides given, ``run.iterations`` (default 1) and a small
evaluation (``eval.tasks=1``: the trainer evaluates after the first iteration whatever ``eval.every``
says, and this is about the training iteration). Every run starts in this checkout (so the config's
relative paths, the data and the warm start, are the same files) with ``PYTHONPATH`` set to its
side's tree, and writes under runs/bench_iteration_ab/. From each run's metrics.jsonl: the
iteration's seconds (``time/iteration_s``) and its phases as that commit logs them
(``time/generate_s``, ``time/env_s``, ``time/forward_backward_s``: scoring, advantages and update),
and what the batch was (episode length, agent tokens, the sampled reward), so that a reader sees both sides
trained on the same kind of batch; also the whole command's wall time (start-up, engine start,
checkpoint included). Printed and saved (benchmarks/results/iteration_ab.json and a raw copy under
results/): per side the median and range, the per-round ratio old / new, and the load average before
each run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from agent_gym.provenance import write_raw
from benchmarks.report import spread, write_json

ROOT = Path(__file__).resolve().parents[2]
TREES = ROOT / ".cache" / "iteration_ab"
RUNS = ROOT / "runs" / "bench_iteration_ab"
PHASES = ("time/iteration_s", "time/generate_s", "time/env_s", "time/forward_backward_s", "time/other_s")
BATCH = ("rollout/length_mean", "rollout/agent_tokens_mean", "rollout/reward_mean", "perf/generated_tokens_per_s")


def checkout(rev: str) -> tuple[Path, str]:
    """The tree of ``rev`` (``.``: this checkout) and its commit."""
    if rev == ".":
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        return ROOT, sha.stdout.strip()
    sha = subprocess.run(["git", "rev-parse", rev], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    tree = TREES / sha[:12]
    if not (tree / "trainers").is_dir():
        subprocess.run(["git", "worktree", "add", "-f", str(tree), sha, "--detach"], cwd=ROOT, check=True, timeout=120)
    return tree, sha


def run_side(tree: Path, run_dir: Path, config: str, overrides: list[str], timeout_s: float) -> dict:
    if run_dir.exists():
        shutil.rmtree(run_dir)
    cmd = [
        sys.executable,
        str(tree / "trainers" / "train_grpo.py"),
        "--config",
        str(tree / config),
        *overrides,
        f"run.run_dir={run_dir}",
    ]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {
        "wall_s": wall,
        "load_avg_1m": load,
        "iterations": [{k: r[k] for k in (*PHASES, *BATCH) if k in r} for r in rows],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--old", required=True, help="the old commit (any git revision)")
    p.add_argument("--new", default=".", help="the new commit; '.' (default): this checkout")
    p.add_argument("--config", default="configs/smollm2_qa_grpo_from_sft.yaml", help="relative to each side's tree")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iterations", type=int, default=1)
    p.add_argument("--timeout-s", type=float, default=1800.0, help="the deadline of one run")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "iteration_ab.json"))
    p.add_argument("overrides", nargs="*", help="config overrides for both sides, key=value")
    args = p.parse_args(argv)
    if args.rounds < 3:
        p.error("--rounds must be at least 3 (interleaved rounds; the median and range of each side)")

    sides = {"old": checkout(args.old), "new": checkout(args.new)}
    overrides = [
        *args.overrides,
        f"run.iterations={args.iterations}",
        "eval.tasks=1",
        "run.tensorboard=false",
        "run.progress_bar=false",
    ]
    runs: dict[str, list[dict]] = {s: [] for s in sides}
    for r in range(args.rounds):
        for side, (tree, sha) in sides.items():
            got = run_side(tree, RUNS / f"{side}_r{r}", args.config, overrides, args.timeout_s)
            runs[side].append(got)
            it = [x["time/iteration_s"] for x in got["iterations"]]
            print(
                f"round {r} {side} ({sha[:8]}): iteration {', '.join(f'{x:.1f}' for x in it)} s, "
                f"command {got['wall_s']:.0f} s, load {got['load_avg_1m']:.2f}",
                flush=True,
            )

    def per_run(side: str, key: str) -> list[float]:
        """A run's mean of ``key`` over its iterations."""
        vals = [[x[key] for x in run["iterations"] if key in x] for run in runs[side]]
        return [sum(v) / len(v) for v in vals if v]

    summary = {
        side: {
            **{k: spread(per_run(side, k)) for k in (*PHASES, *BATCH) if per_run(side, k)},
            "wall_s": spread(run["wall_s"] for run in runs[side]),
        }
        for side in sides
    }
    ratio = [o / n for o, n in zip(per_run("old", "time/iteration_s"), per_run("new", "time/iteration_s"))]
    result = {
        "old": {"rev": args.old, "commit": sides["old"][1]},
        "new": {"rev": args.new, "commit": sides["new"][1]},
        "config": args.config,
        "overrides": overrides,
        "rounds": args.rounds,
        "summary": summary,
        "ratio_old_over_new_iteration": spread(ratio),
        "ratio_per_round": ratio,
        "load_avg_1m": {s: [run["load_avg_1m"] for run in runs[s]] for s in sides},
        "runs": runs,
    }
    for side in sides:
        it = summary[side]["time/iteration_s"]
        print(f"{side}: iteration {it['median']:.1f} s ({it['min']:.1f}-{it['max']:.1f})")
    rr = result["ratio_old_over_new_iteration"]
    print(f"old / new: {rr['median']:.2f}x ({rr['min']:.2f}-{rr['max']:.2f})")
    write_json(args.out, result)
    write_raw(__file__, result, argv=argv, outputs=[args.out])
    return 0


if __name__ == "__main__":
    sys.exit(main())
