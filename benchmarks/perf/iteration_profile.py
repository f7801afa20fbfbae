"""Where a training iteration goes, phase by phase, and how far its compute is from the machine's roofline.

    .venv-vllm/bin/python -m benchmarks.perf.iteration_profile                      # the scaffolded QA GRPO config, 2 iterations
    .venv-vllm/bin/python -m benchmarks.perf.iteration_profile --config configs/smollm2_qa_grpo_from_sft.yaml run.iterations=2
    python -m benchmarks.perf.iteration_profile --metrics runs/X/metrics.jsonl      # a run already made: only the analysis

Runs ``--config`` (with the overrides given; 2 iterations by default, so that the second row
carries the first iteration's logging and checkpoint, ``time/log_s`` and ``time/checkpoint_s``)
with the trainer's own command path (``trainers.compose.run``), into ``runs/bench_iteration_profile``,
then reads its metrics.jsonl: each row's phases (docs/metrics.md: generation, env steps with the
retrieval, scoring, advantages, the update's forwards and backwards, the optimizer, the weight
sync, evaluation, logging, the checkpoint, and the rest), in seconds and as shares of the
iteration. For the compute phases the achieved GFLOP/s: the update's tokens
(``perf/update_tokens``) times the FLOPs a token costs in a forward and backward of this model
(``flops_per_token``: the decoder's matmuls, attention at the batch's mean length, the LM head on
the agent tokens only, no weight gradients of a frozen base under LoRA), against the fp32 matmul
roofline of the newest ``results/roofline/*.json`` at the same thread count (the median of its
576-wide kernels). Printed and saved (benchmarks/results/iteration_profile.json and a raw copy
under results/), with the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from agent_gym.provenance import write_raw
from benchmarks.report import write_json
from trainers import smollm

ROOT = Path(__file__).resolve().parents[2]

PHASES = (
    "generate",
    "env",
    "score",
    "advantages",
    "update",
    "optimizer",
    "sync",
    "eval",
    "log",
    "checkpoint",
)


def flops_per_token(cfg: dict, context: float, agent_frac: float, lora: bool, backward: bool) -> float:
    """FLOPs of one token through the model (``cfg``: an HF config as a dict): the decoder's matmuls
    (2 per weight), causal attention over ``context`` tokens on average half-visible, and the LM
    head on the ``agent_frac`` of tokens that are scored. ``backward``: the activation gradients
    (as much again) and, without ``lora``, the weight gradients (as much again); LoRA's own
    adapters are small and left out."""
    h, i, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    heads, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    d = cfg.get("head_dim") or h // heads
    weights = layers * (2 * h * heads * d + 2 * h * kv * d + 3 * h * i)
    attention = layers * 4 * heads * d * context / 2
    head = agent_frac * 2 * h * cfg["vocab_size"]
    fwd = 2 * weights + attention + head
    if not backward:
        return fwd
    return fwd + (2 * weights + 2 * attention + head) + (0 if lora else 2 * weights + head)


def roofline_gflops(threads: int) -> tuple[float | None, str | None]:
    files = sorted((ROOT / "results" / "roofline").glob("*.json"))
    if not files:
        return None, None
    table = json.loads(files[-1].read_text())["result"]["table"]
    keys = [k for k in table if k.startswith("matmul_gflops:") and k.endswith("/float32") and "head" not in k]
    vals = [table[k][str(threads)]["median"] for k in keys if str(threads) in table[k]]
    return (statistics.median(vals), str(files[-1].relative_to(ROOT))) if vals else (None, None)


def analyse(rows: list[dict], model_cfg: dict, lora: bool, threads: int, epochs: int, passes: int) -> dict:
    peak, source = roofline_gflops(threads)
    out = []
    for r in rows:
        total = r["time/iteration_s"]
        ph = {k: r.get(f"time/{k}_s", 0.0) for k in PHASES}
        ph["other"] = max(0.0, total - sum(ph.values()))
        tokens = r.get("perf/update_tokens", 0.0)
        ctx = r.get("rollout/length_mean", 0.0)
        frac = r.get("rollout/agent_tokens_mean", 0.0) / ctx if ctx else 0.0
        upd = tokens * flops_per_token(model_cfg, ctx, frac, lora, backward=True) / 1e9
        # The old log-probs' pass is not run when the update's forward gives them (train/old_from_update).
        n = passes - int(bool(r.get("train/old_from_update")))
        score = (tokens / max(epochs, 1)) * n * flops_per_token(model_cfg, ctx, frac, lora, backward=False) / 1e9
        row = {
            "iteration": r["iteration"],
            "iteration_s": total,
            "seconds": ph,
            "share": {k: v / total for k, v in ph.items()},
            "update_tokens": tokens,
            "update_gflop": upd,
            "update_gflop_per_s": upd / ph["update"] if ph["update"] else None,
            "score_passes": n,
            "score_gflop_per_s": score / ph["score"] if ph["score"] and n else None,
            "generated_tokens_per_s": r.get("perf/generated_tokens_per_s"),
        }
        if peak:
            for k in ("update", "score"):
                v = row[f"{k}_gflop_per_s"]
                row[f"{k}_of_roofline"] = v / peak if v else None
        out.append(row)
    return {"roofline_gflop_per_s": peak, "roofline_source": source, "threads": threads, "iterations": out}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default=str(ROOT / "configs" / "smollm2_qa_grpo_scaffold.yaml"))
    p.add_argument("--metrics", help="analyse this metrics.jsonl (with the config beside it) instead of running")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "iteration_profile.json"))
    p.add_argument("overrides", nargs="*", help="config overrides, key=value (default adds run.iterations=2)")
    args = p.parse_args(argv)

    from trainers.config import load_config

    load0 = os.getloadavg()[0]
    if args.metrics:
        metrics = Path(args.metrics)
        cfg = load_config(str(metrics.parent / "config.yaml"))
    else:
        from trainers.compose import run

        over = (
            args.overrides
            if any(o.startswith("run.iterations=") for o in args.overrides)
            else [*args.overrides, "run.iterations=2"]
        )
        cfg = load_config(args.config, [*over, "run.run_dir=runs/bench_iteration_profile", "run.overwrite=true"])
        run(cfg)
        metrics = Path(cfg.run.run_dir) / "metrics.jsonl"
    rows = [json.loads(x) for x in metrics.read_text().splitlines()]
    from transformers import AutoConfig  # deferred: transformers' config reader

    model_cfg = AutoConfig.from_pretrained(_model_dir(cfg)).to_dict()
    passes = int(cfg.rollout.recompute_logprobs) + int(cfg.algorithm.kl_coef > 0)
    result = {
        "config": args.config if not args.metrics else str(metrics.parent / "config.yaml"),
        "overrides": args.overrides,
        "metrics": str(metrics),
        "load_avg_1m": [load0, os.getloadavg()[0]],
        **analyse(
            rows, model_cfg, cfg.scale.lora_r > 0, cfg.model.torch_threads or 1, cfg.algorithm.ppo_epochs, passes
        ),
    }
    for it in result["iterations"]:
        print(f"iteration {it['iteration']}: {it['iteration_s']:.1f} s")
        for k, v in it["seconds"].items():
            print(f"  {k:11s} {v:7.1f} s  {100 * it['share'][k]:5.1f}%")
        for k in ("update", "score"):
            g = it[f"{k}_gflop_per_s"]
            if g:
                roof = it.get(f"{k}_of_roofline")
                print(
                    f"  {k}: {g:.0f} GFLOP/s"
                    + (f", {100 * roof:.0f}% of the roofline's {result['roofline_gflop_per_s']:.0f}" if roof else "")
                )
    write_json(args.out, result)
    write_raw(__file__, result, argv=argv, outputs=[args.out])
    return 0


def _model_dir(cfg) -> str:
    name = cfg.model.init_from or cfg.model.name
    return smollm.resolve(name) if smollm.is_alias(name) else name


if __name__ == "__main__":
    sys.exit(main())
