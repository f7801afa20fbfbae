"""A whole training iteration, an old commit against a new one: same config, seed and batch, interleaved.

    .venv-vllm/bin/python -m benchmarks.perf.iteration_ab --old c782ba5 \
        --config configs/smollm2_qa_grpo_from_sft.yaml rollout.backend=vllm
    .venv-vllm/bin/python -m benchmarks.perf.iteration_ab --old . --iterations 3 \
        --old-overrides algorithm.dynamic_sampling=false --new-overrides algorithm.dynamic_sampling=true \
        --config configs/smollm2_qa_grpo_from_sft.yaml rollout.backend=vllm   # one commit, two settings

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
the trainer's peak resident memory and its estimate (``memory/peak_rss_gib``, ``memory/estimate_gib``),
and what the batch was (episode length, agent tokens, the sampled reward), so that a reader sees both sides
trained on the same kind of batch; also the whole command's wall time (start-up, engine start,
checkpoint included). ``--old-overrides``/``--new-overrides`` add a side's own settings (both sides
may be one commit: an A/B of a config key); with DAPO's dynamic sampling on either side the groups
that carried a reward spread (GRPO's useful groups: ``dynamic/kept_groups``, or the groups whose
advantages were not all zero, ``tasks_per_iter x (1 - adv/zero_std_group_frac)``) and the seconds
per useful group are reported too. Printed and saved (benchmarks/results/iteration_ab.json and a raw copy under
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

import yaml

from agent_gym.provenance import write_raw
from benchmarks.report import spread, write_json

ROOT = Path(__file__).resolve().parents[2]
TREES = ROOT / ".cache" / "iteration_ab"
RUNS = ROOT / "runs" / "bench_iteration_ab"
PHASES = ("time/iteration_s", "time/generate_s", "time/env_s", "time/forward_backward_s", "time/other_s")
BATCH = ("rollout/length_mean", "rollout/agent_tokens_mean", "rollout/reward_mean", "perf/generated_tokens_per_s")
MEMORY = ("memory/peak_rss_gib", "memory/estimate_gib")
GROUPS = ("adv/zero_std_group_frac", "dynamic/kept_groups", "dynamic/dropped_groups", "dynamic/extra_episodes")


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
        "iterations": [{k: r[k] for k in (*PHASES, *BATCH, *GROUPS, *MEMORY) if k in r} for r in rows],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--old", required=True, help="the old commit (any git revision)")
    p.add_argument("--new", default=".", help="the new commit; '.' (default): this checkout")
    p.add_argument("--config", default="configs/smollm2_qa_grpo_from_sft.yaml", help="relative to each side's tree")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iterations", type=int, default=1)
    p.add_argument("--timeout-s", type=float, default=1800.0, help="the deadline of one run")
    p.add_argument(
        "--tasks-per-iter",
        type=int,
        default=None,
        help="for the useful groups without dynamic sampling (default: the config's)",
    )
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "iteration_ab.json"))
    p.add_argument("--old-overrides", nargs="*", default=[], help="the old side's own overrides, key=value")
    p.add_argument("--new-overrides", nargs="*", default=[], help="the new side's own overrides, key=value")
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
            own = args.old_overrides if side == "old" else args.new_overrides
            got = run_side(tree, RUNS / f"{side}_r{r}", args.config, [*overrides, *own], args.timeout_s)
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

    tasks = args.tasks_per_iter
    if tasks is None:  # the config's own (an override of it wins)
        given = [o.split("=", 1)[1] for o in args.overrides if o.startswith("rollout.tasks_per_iter=")]
        cfg = yaml.safe_load((sides["new"][0] / args.config).read_text())
        tasks = int(given[-1]) if given else (cfg.get("rollout") or {}).get("tasks_per_iter")

    def useful(it: dict) -> float | None:
        """The groups of an iteration that carried a reward spread."""
        if "dynamic/kept_groups" in it:
            return it["dynamic/kept_groups"]
        if "adv/zero_std_group_frac" in it and tasks:
            return tasks * (1.0 - it["adv/zero_std_group_frac"])
        return None

    for side in sides:
        for run in runs[side]:
            groups = [useful(it) for it in run["iterations"]]
            if all(g is not None for g in groups) and sum(groups) > 0:
                run["useful_groups"] = sum(groups)
                run["s_per_useful_group"] = sum(it["time/iteration_s"] for it in run["iterations"]) / sum(groups)
    summary = {
        side: {
            **{k: spread(per_run(side, k)) for k in (*PHASES, *BATCH, *GROUPS, *MEMORY) if per_run(side, k)},
            "wall_s": spread(run["wall_s"] for run in runs[side]),
            **{
                k: spread(run[k] for run in runs[side])
                for k in ("useful_groups", "s_per_useful_group")
                if all(k in run for run in runs[side])
            },
        }
        for side in sides
    }
    ratio = [o / n for o, n in zip(per_run("old", "time/iteration_s"), per_run("new", "time/iteration_s"))]
    result = {
        "old": {"rev": args.old, "commit": sides["old"][1], "overrides": args.old_overrides},
        "new": {"rev": args.new, "commit": sides["new"][1], "overrides": args.new_overrides},
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
        mem = summary[side].get("memory/peak_rss_gib")
        peak = f", trainer's peak {mem['median']:.2f} GiB ({mem['min']:.2f}-{mem['max']:.2f})" if mem else ""
        print(f"{side}: iteration {it['median']:.1f} s ({it['min']:.1f}-{it['max']:.1f}){peak}")
    for side in sides:
        if "s_per_useful_group" in summary[side]:
            u, g = summary[side]["s_per_useful_group"], summary[side]["useful_groups"]
            print(
                f"{side}: {g['median']:.1f} useful groups a run, {u['median']:.1f} s each ({u['min']:.1f}-{u['max']:.1f})"
            )
    rr = result["ratio_old_over_new_iteration"]
    print(f"old / new: {rr['median']:.2f}x ({rr['min']:.2f}-{rr['max']:.2f})")
    write_json(args.out, result)
    write_raw(__file__, result, argv=argv, outputs=[args.out])
    return 0


if __name__ == "__main__":
    sys.exit(main())
