"""Value-guided decoding vs its controls on a PPO checkpoint: greedy, one sample per turn,
best-of-K by the critic (value-guided) and a random one of the same K samples (random-of-k).

    python benchmarks/experiments/value_guided.py --checkpoint runs/factchain_ppo [--eval-set heldout] \\
        [--tasks 64] [--k 4] [--seeds 0 1 2] [--out benchmarks/results/value_guided.json]

Every mode runs on the same questions (the run's ``eval_sets[--eval-set]``: for the FactChain
demo, ``heldout`` = 64 questions of the training KB outside the 64-question RL pool), at the
run's temperature. The sampling modes run once per seed; with the same seed, value-guided and
random-of-k draw the same K candidates at the first turn (later turns differ once the kept
actions differ). Prints a table and writes the figures, the checkpoint's provenance (iteration,
RL minutes, its own logged greedy evals) and the machine's load average to ``--out``.

A diagnostic of the critic itself: on the ``sample`` episodes (the policy's own, unselected), the
AUC of the critic's value at the last token of each turn's action against the episode's success
and against that turn's process reward (FactChain's ``hop``: the right lookup). 0.5 is a critic
that cannot rank the candidates it is asked to choose between.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from agent_gym.provenance import write_raw

REPO = Path(__file__).resolve().parents[2]

import numpy as np  # noqa: E402


def provenance(ckpt: Path, iteration: int) -> dict:
    """The run's logged metrics at the checkpoint's iteration (greedy evals, RL minutes)."""
    run_dir = ckpt.parent.parent
    out: dict = {"run_dir": str(run_dir), "iteration": iteration}
    path = run_dir / "metrics.jsonl"
    if path.is_file():
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        row = next((r for r in rows if r.get("iteration") == iteration), {})
        keep = (
            "time/elapsed_min",
            "eval/success_rate",
            "eval/heldout/success_rate",
            "eval/fresh_kb/success_rate",
            "rollout/success_rate",
        )
        out.update({k: row[k] for k in keep if k in row})
        out["iterations_logged"] = len(rows)
    return out


def auc(scores: list[float], labels: list[bool]) -> float | None:
    """P(score of a positive > score of a negative), ties counted half (Mann-Whitney); None
    without both classes."""
    pos = [x for x, y in zip(scores, labels) if y]
    neg = [x for x, y in zip(scores, labels) if not y]
    if not pos or not neg:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return float(wins / (len(pos) * len(neg)))


def critic_ranking(critic, episodes, pad_id: int) -> dict:
    """Does the critic rank the policy's own samples? The critic's value at the last token of each
    turn's action (what value-guided decoding compares), against the episode's success and against
    that turn's process reward (FactChain's ``hop``: the right lookup), as AUCs by turn."""
    import torch

    from trainers.rollout import pad_rows

    ids = pad_rows([e.token_ids for e in episodes], pad_id, torch.long)  # (B, T)
    mask = pad_rows([[1] * len(e.token_ids) for e in episodes], 0, torch.long)  # (B, T)
    with torch.no_grad():
        values = critic(ids, mask)  # (B, T)
    out: dict = {}
    for turn in range(max(e.turns for e in episodes)):
        rows = [
            (i, e) for i, e in enumerate(episodes) if e.turns > turn and e.step_spans[turn][1] > e.step_spans[turn][0]
        ]
        v = [float(values[i, e.step_spans[turn][1] - 1]) for i, e in rows]
        out[f"turn{turn}_value_mean"] = float(np.mean(v)) if v else None
        out[f"turn{turn}_auc_success"] = auc(v, [e.success for _, e in rows])
        out[f"turn{turn}_auc_step_reward"] = auc(v, [e.step_rewards[turn] > 0 for _, e in rows])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", required=True, help="a PPO run directory, checkpoints/iter_* or state.pt")
    ap.add_argument("--eval-set", default="heldout")
    ap.add_argument("--tasks", type=int, default=64)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--temperature", type=float, help="default: the run's")
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/value_guided.json"))
    args = ap.parse_args(argv)
    import torch

    import agent_gym  # noqa: F401
    from agent_gym.tokenizer import pad_token_id
    from trainers.checkpoint import load_checkpoint
    from trainers.evaluate import load_checkpoint_models, model_episodes
    from trainers.rollout import summarize

    torch.set_num_threads(1)
    cfg, ckpt, tok, policy, critic = load_checkpoint_models(args.checkpoint)
    if critic is None:
        raise SystemExit(f"error: {ckpt} has no critic; value-guided decoding needs a PPO checkpoint")
    if args.eval_set not in cfg.eval.sets:
        raise SystemExit(f"error: --eval-set {args.eval_set!r}: the run's eval_sets are {sorted(cfg.eval.sets)}")
    env_kwargs = {**cfg.rollout.env_kwargs, **cfg.eval.sets[args.eval_set]}
    temperature = cfg.rollout.temperature if args.temperature is None else args.temperature
    tasks = list(range(args.tasks))
    load = [os.getloadavg()[0]]
    runs = []
    plan = [("greedy", 1, 0)] + [
        (m, k, s) for s in args.seeds for m, k in (("sample", 1), ("value-guided", args.k), ("random-of-k", args.k))
    ]
    for mode, k, seed in plan:
        t0 = time.perf_counter()
        eps, _, cost = model_episodes(
            cfg.rollout.env_id,
            env_kwargs,
            tasks,
            policy,
            tok,
            "hf",
            cfg.rollout.max_turn_tokens,
            mode,
            k,
            temperature,
            critic if mode == "value-guided" else None,
            seed,
        )
        m = summarize(eps)
        runs.append(
            {
                "decode": mode,
                "k": k,
                "seed": seed,
                "success_rate": m["rollout/success_rate"],
                "turns_mean": m["rollout/turns_mean"],
                **cost,
                "wall_s_total": time.perf_counter() - t0,
            }
        )
        if mode == "sample":  # the policy's own samples, unselected: how well does the critic rank them?
            runs[-1]["critic_ranking"] = critic_ranking(critic, eps, pad_token_id(tok))
        load.append(os.getloadavg()[0])
        print(
            f"{mode:>12} k={k} seed={seed}: success {m['rollout/success_rate']:.3f}  ({cost['decode/wall_s']:.1f} s)",
            flush=True,
        )

    rows = []
    greedy = next(r for r in runs if r["decode"] == "greedy")
    for mode in ("greedy", "sample", "value-guided", "random-of-k"):
        rs = [r for r in runs if r["decode"] == mode]
        succ = np.array([r["success_rate"] for r in rs])
        per = lambda key: float(np.mean([r[key] for r in rs]))  # noqa: E731
        rows.append(
            {
                "decode": mode,
                "k": rs[0]["k"],
                "seeds": len(rs),
                "episodes": len(rs) * args.tasks,
                "success_mean": float(succ.mean()),
                "success_per_seed": succ.tolist(),
                "success_std_over_seeds": float(succ.std(ddof=1)) if len(rs) > 1 else 0.0,
                "generated_tokens_per_episode": per("decode/generated_tokens_per_episode"),
                "critic_tokens_per_episode": per("decode/critic_tokens_per_episode"),
                "wall_s": per("decode/wall_s"),
                "generated_vs_greedy": per("decode/generated_tokens_per_episode")
                / greedy["decode/generated_tokens_per_episode"],
                "wall_vs_greedy": per("decode/wall_s") / greedy["decode/wall_s"],
            }
        )
    ranking = [r["critic_ranking"] for r in runs if "critic_ranking" in r]
    ranking_mean = (
        {
            key: float(np.mean([r[key] for r in ranking if r.get(key) is not None]))
            for key in ranking[0]
            if any(r.get(key) is not None for r in ranking)
        }
        if ranking
        else {}
    )
    state = load_checkpoint(ckpt)
    result = {
        "checkpoint": str(ckpt),
        "provenance": provenance(ckpt, int(state["iteration"])),
        "env_id": cfg.rollout.env_id,
        "eval_set": args.eval_set,
        "env_kwargs": env_kwargs,
        "tasks": args.tasks,
        "k": args.k,
        "temperature": temperature,
        "seeds": args.seeds,
        "load_average_1min": load,
        "table": rows,
        "critic_ranking_on_samples": ranking_mean,
        "runs": runs,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    write_raw(__file__, result, argv=argv, outputs=[out])
    print(f"\ncheckpoint {ckpt} ({json.dumps(result['provenance'])})")
    print(
        f"{args.eval_set}: {args.tasks} questions, K={args.k}, T={temperature}, seeds {args.seeds}, "
        f"load average {min(load):.1f}-{max(load):.1f}"
    )
    print(
        "| decode | K | success (mean over seeds) | per seed | generated tok/ep | critic tok/ep | wall s | "
        "generated x greedy | wall x greedy |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['decode']} | {r['k']} | {r['success_mean']:.3f} | "
            f"{' '.join(f'{x:.3f}' for x in r['success_per_seed'])} | {r['generated_tokens_per_episode']:.1f} | "
            f"{r['critic_tokens_per_episode']:.0f} | {r['wall_s']:.1f} | {r['generated_vs_greedy']:.2f} | "
            f"{r['wall_vs_greedy']:.2f} |"
        )
    print("critic on the sample-mode episodes (AUC of the value at each turn's last action token; mean over seeds):")
    print("  " + ", ".join(f"{k} {v:.3f}" for k, v in ranking_mean.items()))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
