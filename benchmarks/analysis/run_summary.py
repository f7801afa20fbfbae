"""A training run's curve in windows of iterations, from its own files (metrics.jsonl and the logged
trajectories): the figures docs/results.md cites for a run, kept under results/run_summary/.

    python benchmarks/analysis/run_summary.py runs/smollm2_qa_grpo_scaffold --window 6 --label qa_grpo_scaffold_s0

Per window: the mean of each chosen metric over its iterations, and from the logged trajectories
(``run.log_trajectories`` per iteration) the agent's tokens per turn by position (a scaffolded QA
run: turns 1..k-1 are queries, the last the answer) and the share of turns that hit the turn's
token limit. With dynamic sampling, the share of the sampled groups that had no reward spread
(dropped, over dropped + kept). Also every evaluation record (``eval/*``) and the total wall time.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from agent_gym.provenance import write_raw

METRICS = (
    "rollout/reward_mean",
    "rollout/f1",
    "rollout/em",
    "reward/supporting_hit",
    "adv/zero_std_group_frac",
    "rollout/agent_tokens_mean",
    "overlong/penalized_frac",
    "dynamic/dropped_groups",
    "dynamic/extra_episodes",
    "value/explained_var",
    "time/iteration_s",
)
"""Metrics averaged per window; one a run does not log (a critic's without PPO) is None there."""


def summarize_run(run_dir: Path, window: int, turn_limit: int | None) -> dict:
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    if not recs:
        raise SystemExit(f"error: {run_dir}/metrics.jsonl holds no records")
    if turn_limit is None:
        cfg = run_dir / "config.yaml"
        import yaml

        turn_limit = (
            int(((yaml.safe_load(cfg.read_text()) or {}).get("rollout") or {}).get("max_turn_tokens", 0)) or None
        )
    windows = []
    for start in range(0, len(recs), window):
        part = recs[start : start + window]
        its = [r["iteration"] for r in part]
        row = {"iterations": [its[0], its[-1]]}
        for k in METRICS:
            vals = [r[k] for r in part if k in r]
            row[k] = statistics.mean(vals) if vals else None
        by_turn: dict[int, list[int]] = {}
        at_limit = turns = 0
        for it in its:
            path = run_dir / "trajectories" / f"iter_{it:05d}.jsonl"
            if not path.is_file():
                continue
            for line in path.read_text().splitlines():
                t = json.loads(line)
                for i, (s, e) in enumerate(t["step_spans"]):
                    by_turn.setdefault(i + 1, []).append(e - s)
                    turns += 1
                    at_limit += turn_limit is not None and e - s >= turn_limit
        dropped = sum(r.get("dynamic/dropped_groups", 0) for r in part)
        kept = sum(r.get("dynamic/kept_groups", 0) for r in part)
        row["no_spread_group_share"] = dropped / (dropped + kept) if dropped + kept else None
        row["logged_trajectories"] = sum(len(v) for k, v in by_turn.items() if k == 1)
        row["agent_tokens_by_turn"] = {str(k): statistics.mean(v) for k, v in sorted(by_turn.items())}
        row["turns_at_token_limit"] = at_limit / turns if turns else None
        windows.append(row)
    evals = [
        {"iteration": r["iteration"], **{k: v for k, v in r.items() if k.startswith("eval/")}}
        for r in recs
        if any(k.startswith("eval/") for k in r)
    ]
    return {
        "run_dir": str(run_dir),
        "iterations": len(recs),
        "turn_limit": turn_limit,
        "window": window,
        "windows": windows,
        "evals": evals,
        "wall_min": sum(r.get("time/iteration_s", 0.0) for r in recs) / 60,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--window", type=int, default=6, help="iterations per window")
    ap.add_argument(
        "--turn-limit", type=int, default=None, help="the turn's token limit (default: the run's max_turn_tokens)"
    )
    ap.add_argument("--label", default=None, help="the raw file's label (default: the commit)")
    args = ap.parse_args(argv)
    out = summarize_run(args.run_dir, args.window, args.turn_limit)
    for w in out["windows"]:
        a, b = w["iterations"]
        f = {k.split("/")[-1]: round(v, 3) for k, v in w.items() if k in METRICS and v is not None}
        turns = {k: round(v, 1) for k, v in w["agent_tokens_by_turn"].items()}
        share = w["no_spread_group_share"]
        spread = "" if share is None else f"; groups without spread {share:.2f}"
        print(
            f"iterations {a}-{b}: {f}; agent tokens by turn {turns}; at the limit {w['turns_at_token_limit']}{spread}"
        )
    for e in out["evals"]:
        print(
            f"eval at {e['iteration']}: "
            + ", ".join(f"{k}={v:.3f}" for k, v in e.items() if k in ("eval/f1", "eval/em", "eval/reward_mean"))
        )
    print(f"{out['iterations']} iterations, {out['wall_min']:.1f} minutes")
    write_raw(__file__, out, label=args.label, argv=argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
