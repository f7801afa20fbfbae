"""The CPU learning runs: SFT warm start, then PPO and GRPO over several seeds, and the
action-mask ablation. Prints a table, writes ``benchmarks/results/learning_runs.json`` and a
figure with every eval-success curve (``benchmarks/results/learning_curves.png``).

    python benchmarks/experiments/learning_runs.py [--seeds 0 1 2] [--algos ppo grpo] [--ablation] [--parallel 2]

Each seed gets its own SFT warm start (``configs/factchain_sft.yaml`` with that seed) and its
own RL run (``configs/factchain_{algo}.yaml`` with that seed, ``max_minutes`` from the config).
``heldout`` and ``freshKB`` are the last greedy success on 64 questions of the same KB outside the
training pool and on a KB never trained on (``sftKB``: the warm start's own fresh-KB success).
``min->80%`` is the RL minutes until the greedy eval first reaches 0.8; ``+sft`` adds the SFT
warm start's training minutes, so it is the time from the random model.
The ablation repeats GRPO seed 0 with ``use_action_mask=false`` (env tokens under the loss).
Runs go to ``runs/learning/``; two run side by side by default (one per core, one torch thread
each), so the 15-minute budget of a run is wall time on a shared 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from agent_gym.provenance import write_raw

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable


def sh(cmd: list[str], log: Path) -> int:
    with open(log, "w") as f:
        return subprocess.run(
            cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(REPO)}
        ).returncode


def sft(seed: int, root: Path) -> Path:
    out = root / f"sft_seed{seed}"
    if not (out / "model" / "config.json").exists():
        rc = sh(
            [PY, "trainers/train_sft.py", "--config", "configs/factchain_sft.yaml", f"run_dir={out}", f"seed={seed}"],
            root / f"sft_seed{seed}.log",
        )
        if rc:
            raise SystemExit(f"SFT seed {seed} failed; see {root}/sft_seed{seed}.log")
    return out / "model"


def rl(algo: str, seed: int, root: Path, model: Path, extra: list[str], name: str) -> dict:
    run_dir = root / name
    script = "trainers/train_ppo.py" if algo == "ppo" else "trainers/train_grpo.py"
    t0 = time.time()
    rc = sh(
        [
            PY,
            script,
            "--config",
            f"configs/factchain_{algo}.yaml",
            f"run.run_dir={run_dir}",
            f"run.seed={seed}",
            f"model.init_from={model}",
            "run.progress_bar=false",
            "model.torch_threads=1",
            "run.overwrite=true",
            *extra,
        ],
        root / f"{name}.log",
    )
    recs, evals = read_evals(run_dir) if rc == 0 else ([], [])
    return summarize_run(run_dir, name, algo, seed, model, rc, (time.time() - t0) / 60, len(recs), evals)


def read_evals(run_dir: Path) -> tuple[list[dict], list[tuple]]:
    """The run's metrics records and its (iteration, minutes, eval success, held-out success,
    fresh-KB success) points (None where the run has no such eval set)."""
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return recs, [
        (
            r["iteration"],
            r["time/elapsed_min"],
            r["eval/success_rate"],
            r.get("eval/heldout/success_rate"),
            r.get("eval/fresh_kb/success_rate"),
        )
        for r in recs
        if "eval/success_rate" in r
    ]


def summarize_run(
    run_dir: Path, name: str, algo: str, seed: int, model: Path, rc: int, wall_min: float, iterations: int, evals: list
) -> dict:
    """``start_success`` is the greedy eval at iteration 0 (after the first, warmup-scaled update)
    on the RL eval tasks; ``sft_success`` is the SFT run's own eval (held-out split)."""
    sft_final = json.loads((model.parent / "final.json").read_text())
    reach = next((m for _, m, s, *_ in evals if s >= 0.8), None)
    sft_min = sft_final["time/elapsed_min"]
    return {
        "name": name,
        "algo": algo,
        "seed": seed,
        "rc": rc,
        "wall_min": wall_min,
        "sft_success": sft_final["eval/success_rate"],
        "sft_minutes": sft_min,
        "sft_fresh_kb_success": sft_final.get("eval/fresh_kb/success_rate"),
        "final_heldout_success": evals[-1][3] if evals else None,
        "final_fresh_kb_success": evals[-1][4] if evals else None,
        "total_minutes_to_80": None if reach is None else sft_min + reach,
        "start_success": evals[0][2] if evals else None,
        "final_success": evals[-1][2] if evals else None,
        "best_success": max((e[2] for e in evals), default=None),
        "minutes_to_80": reach,
        "iterations": iterations,
        "evals": evals,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--algos", nargs="+", default=["ppo", "grpo"])
    ap.add_argument("--ablation", action="store_true")
    ap.add_argument("--ablation-minutes", type=float, default=8.0, help="the ablation is compared at equal minutes")
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--root", default="runs/learning")
    ap.add_argument("--out", default="benchmarks/results/learning_runs.json")
    ap.add_argument("--summarize-only", action="store_true", help="re-read finished runs under --root")
    args = ap.parse_args()
    root = REPO / args.root
    if args.summarize_only:
        results = []
        for run_dir in sorted(
            p for p in root.iterdir() if (p / "metrics.jsonl").exists() and not p.name.startswith("sft")
        ):
            recs, evals = read_evals(run_dir)
            seed = int(run_dir.name.split("seed")[1].split("_")[0])
            results.append(
                summarize_run(
                    run_dir,
                    run_dir.name,
                    run_dir.name.split("_")[0],
                    seed,
                    root / f"sft_seed{seed}" / "model",
                    0,
                    recs[-1]["time/elapsed_min"] if recs else 0,
                    len(recs),
                    evals,
                )
            )
        report(results, Path(args.out))
        return
    root.mkdir(parents=True, exist_ok=True)
    models = {s: sft(s, root) for s in args.seeds}
    jobs = [(a, s, [], f"{a}_seed{s}") for a in args.algos for s in args.seeds]
    if args.ablation:  # first, so that the shorter run shares the cores with a full one, as every run does
        jobs.insert(
            0,
            (
                "grpo",
                args.seeds[0],
                ["algorithm.use_action_mask=false", f"run.max_minutes={args.ablation_minutes}"],
                f"grpo_seed{args.seeds[0]}_no_action_mask",
            ),
        )
    with ThreadPoolExecutor(args.parallel) as pool:
        results = list(pool.map(lambda j: rl(j[0], j[1], root, models[j[1]], j[2], j[3]), jobs))
    report(results, Path(args.out))


def report(results: list[dict], out: Path) -> None:
    print(
        f"{'run':30s} {'sft':>6s} {'start':>6s} {'final':>6s} {'best':>6s} {'min->80%':>9s} {'+sft':>6s} "
        f"{'iters':>6s} {'minutes':>7s} {'heldout':>7s} {'freshKB':>7s} {'sftKB':>6s}"
    )
    for r in results:
        m80 = f"{r['minutes_to_80']:.1f}" if r["minutes_to_80"] is not None else "-"
        t80 = f"{r['total_minutes_to_80']:.1f}" if r.get("total_minutes_to_80") is not None else "-"
        print(
            f"{r['name']:30s} {r['sft_success']:6.3f} {r['start_success'] or 0:6.3f} {r['final_success'] or 0:6.3f} "
            f"{r['best_success'] or 0:6.3f} {m80:>9s} {t80:>6s} {r['iterations']:6d} {r['wall_min']:7.1f} "
            f"{_f(r.get('final_heldout_success')):>7s} {_f(r.get('final_fresh_kb_success')):>7s} "
            f"{_f(r.get('sft_fresh_kb_success')):>6s}"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    plot(results, out.with_name("learning_curves.png"))
    write_raw(__file__, results, outputs=[out, out.with_name("learning_curves.png")])


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in results:
        if r["evals"]:
            _, mins, succ, *_ = zip(*r["evals"])
            ax.plot(mins, succ, marker="o", ms=2, label=r["name"])
    ax.axhline(0.8, color="gray", ls="--", lw=0.8)
    ax.set_xlabel("minutes of RL")
    ax.set_ylabel("eval success (greedy, the run's eval tasks)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
