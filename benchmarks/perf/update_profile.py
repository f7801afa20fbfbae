"""Where one LoRA micro-batch step of SmolLM2-135M-Instruct spends its time on the CPU, operator by operator.

    python -m benchmarks.perf.update_profile                        # the QA GRPO micro-batch: 2 rows x 850 tokens
    python -m benchmarks.perf.update_profile --rows 4 --tokens 512 --agent-fraction 0.3 --threads 1

The roofline (``benchmarks/perf/roofline.py``, docs/results.md) says this machine's fp32 matmuls run
at 200-250 GFLOP/s on 2 threads at the model's shapes, which puts a LoRA step (about 0.45 GFLOP a
token) near 500 tokens/s; a micro-batch of the QA runs measured about 225. This script says where
the difference goes: one step (forward, backward and AdamW step of the LoRA adapters, the loss on
the agent tokens, as the trainer computes it with ``token_logprobs(..., loss_mask=...)``) under
``torch.profiler``, after ``--warmup`` unprofiled steps, on ``--rows`` rows of ``--tokens`` tokens of
English text, ``--agent-fraction`` of them under the loss mask (the QA scaffold runs: about 57 agent
tokens of 850). The model and adapters are built as the trainer builds them (``load_policy``,
``scale.add_lora`` with ``ScaleConfig``'s default target modules, r ``--lora-r``).

Printed and saved (benchmarks/results/update_profile.json, and a raw copy under results/): the
step's wall time and tokens/s; self CPU time by operator class (matmul, attention, the rest) with
the matmuls' FLOP count (the profiler's own, from the recorded shapes) and achieved GFLOP/s; the
top operators by self time; the load average. One profiled step is one measurement: compare
classes within it, not steps across runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from agent_gym.provenance import write_raw
from benchmarks.perf.cpu_update_precision import _batch, lora_policy, lora_step
from benchmarks.report import write_json

ROOT = Path(__file__).resolve().parents[2]

MATMUL = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_mkldnn_matmul")
ATTENTION = ("scaled_dot_product", "flash_attention", "_efficient_attention")


def op_class(name: str) -> str:
    if name in MATMUL:
        return "matmul"
    if any(a in name for a in ATTENTION):
        return "attention"
    if "Backward" in name or name.startswith("autograd::"):
        return "autograd bookkeeping"
    if name.startswith("aten::"):
        return "other aten ops"
    return "python and optimizer"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct", help="model name or HF directory")
    p.add_argument("--rows", type=int, default=2)
    p.add_argument("--tokens", type=int, default=850)
    p.add_argument("--agent-fraction", type=float, default=0.07)
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "update_profile.json"))
    args = p.parse_args(argv)

    tokenizer, policy, opt = lora_policy(args.model, args.lora_r, args.threads)
    ids, attn, mask = _batch(tokenizer, args.rows, args.tokens, args.agent_fraction, seed=0)

    def step() -> float:
        return lora_step(policy, opt, ids, attn, mask)

    plain = [step() for _ in range(args.warmup)]  # oneDNN builds its kernels on a shape's first call
    load0 = os.getloadavg()[0]
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True, with_flops=True
    ) as prof:
        wall = step()
    unprofiled = step()
    events = prof.key_averages()
    total_self = sum(e.self_cpu_time_total for e in events) / 1e6  # seconds, over every thread
    classes: dict[str, dict[str, float]] = {}
    for e in events:
        c = classes.setdefault(op_class(e.key), {"self_s": 0.0, "flops": 0.0, "calls": 0})
        c["self_s"] += e.self_cpu_time_total / 1e6
        c["flops"] += float(e.flops or 0)
        c["calls"] += e.count
    for c in classes.values():
        c["share"] = c["self_s"] / total_self
        c["gflop_per_s"] = c["flops"] / 1e9 / c["self_s"] if c["flops"] and c["self_s"] else None
    top = sorted(events, key=lambda e: -e.self_cpu_time_total)[: args.top]
    tokens = int(attn.sum())
    result = {
        "model": args.model,
        "rows": args.rows,
        "tokens_per_row": args.tokens,
        "agent_fraction": args.agent_fraction,
        "lora_r": args.lora_r,
        "threads": args.threads,
        "warmup_step_s": plain,
        "profiled_step_s": wall,
        "unprofiled_step_s": unprofiled,
        "tokens_per_s": tokens / unprofiled,
        "profiler_self_s_total": total_self,
        "classes": classes,
        "top_ops": [
            {
                "op": e.key,
                "calls": e.count,
                "self_s": e.self_cpu_time_total / 1e6,
                "share": e.self_cpu_time_total / 1e6 / total_self,
                "gflop_per_s": (e.flops / 1e3 / e.self_cpu_time_total) if e.flops and e.self_cpu_time_total else None,
            }
            for e in top
        ],
        "load_avg_1m": [load0, os.getloadavg()[0]],
    }
    print(
        f"step {unprofiled:.2f} s unprofiled ({result['tokens_per_s']:.0f} tokens/s), {wall:.2f} s profiled; "
        f"load {load0:.2f}"
    )
    for name, c in sorted(classes.items(), key=lambda kv: -kv[1]["self_s"]):
        rate = f", {c['gflop_per_s']:.0f} GFLOP/s" if c["gflop_per_s"] else ""
        print(f"  {name:22s} {c['self_s']:7.2f} s  {100 * c['share']:5.1f}%  {int(c['calls']):6d} calls{rate}")
    for t in result["top_ops"]:
        rate = f"  {t['gflop_per_s']:.0f} GFLOP/s" if t["gflop_per_s"] else ""
        print(f"    {t['op'][:48]:48s} {t['calls']:6d} {t['self_s']:7.3f} s {100 * t['share']:5.1f}%{rate}")
    write_json(args.out, result)
    write_raw(__file__, result, argv=argv, outputs=[args.out])
    return 0


if __name__ == "__main__":
    sys.exit(main())
