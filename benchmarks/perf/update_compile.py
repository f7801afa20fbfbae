"""A LoRA micro-batch step of SmolLM2-135M-Instruct on the CPU, eager against ``torch.compile``d decoder layers.

    python -m benchmarks.perf.update_compile                       # 2 rows x 850 tokens, then 3 x 600, 3 rounds
    python -m benchmarks.perf.update_compile --shapes 2x850 --rounds 5 --threads 1

``benchmarks/perf/update_profile.py`` found a micro-batch's matmuls near the roofline and the rest of
its time in attention (21%) and unfused elementwise work (26%: RMSNorm, rotary embeddings,
SiLU-and-multiply, the LoRA scaling; tens of thousands of small ops, each a pass over memory). Fusing
the elementwise ops is what ``torch.compile`` (Inductor, C++ kernels on the CPU) does; this script
measures whether it pays here. The compiled side compiles each decoder layer in place
(``nn.Module.compile``, ``dynamic=True`` so that micro-batches of other lengths reuse the graph; the
layers share their code, so one graph serves all 30), the LM head and the loss stay eager, as the
trainer's ``token_logprobs`` runs them. Both sides are built as the trainer builds its policy (the
weights of the same seed) and step the same batches.

A step is the trainer's: forward (``token_logprobs`` with the loss mask), backward, gradient
clipping, AdamW on the adapters. Each ``--shapes`` entry (``ROWSxTOKENS``) is a batch of English
text, ``--agent-fraction`` of its tokens under the loss mask. First the compiled side's first steps
(the compile time, one per shape) and the largest log-prob difference between the sides before any
update; then ``--rounds`` rounds, eager and compiled interleaved, each round one step of each shape
on each side. Printed and saved (benchmarks/results/update_compile.json and a raw copy under
results/): per side and shape the median and range of the step's seconds, the per-round ratio
eager / compiled, and the load average.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from agent_gym.provenance import write_raw
from benchmarks.perf.cpu_update_precision import _batch, lora_policy, lora_step
from benchmarks.report import spread, write_json

ROOT = Path(__file__).resolve().parents[2]


def parse_shape(text: str) -> tuple[int, int]:
    rows, _, tokens = text.lower().partition("x")
    if not rows.isdigit() or not tokens.isdigit():
        raise argparse.ArgumentTypeError(f"a shape is ROWSxTOKENS, e.g. 2x850; got {text!r}")
    return int(rows), int(tokens)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct", help="model name or HF directory")
    p.add_argument("--shapes", type=parse_shape, nargs="+", default=[(2, 850), (3, 600)])
    p.add_argument("--agent-fraction", type=float, default=0.07)
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "update_compile.json"))
    args = p.parse_args(argv)

    from trainers.models import token_logprobs

    tokenizer, eager, opt_e = lora_policy(args.model, args.lora_r, args.threads)
    _, compiled, opt_c = lora_policy(args.model, args.lora_r, args.threads)
    for layer in compiled.get_decoder().layers:
        layer.compile(dynamic=True)
    batches = {f"{r}x{t}": _batch(tokenizer, r, t, args.agent_fraction, seed=0) for r, t in args.shapes}

    def step(policy, opt, batch) -> float:
        return lora_step(policy, opt, *batch)

    diffs = {}
    with torch.no_grad():
        for name, (ids, attn, mask) in batches.items():
            a = token_logprobs(eager, ids, attn, loss_mask=mask)[0]
            b = token_logprobs(compiled, ids, attn, loss_mask=mask)[0]
            diffs[name] = float((a - b).abs().max())
    first = {}
    for name, batch in batches.items():  # compile (forward and backward graphs) on each shape's first step
        first[name] = {"compiled": step(compiled, opt_c, batch), "eager": step(eager, opt_e, batch)}
    loads = [os.getloadavg()[0]]
    times: dict[str, dict[str, list[float]]] = {n: {"eager": [], "compiled": []} for n in batches}
    for _ in range(args.rounds):
        for name, batch in batches.items():
            times[name]["eager"].append(step(eager, opt_e, batch))
            times[name]["compiled"].append(step(compiled, opt_c, batch))
        loads.append(os.getloadavg()[0])
    result = {
        "model": args.model,
        "threads": args.threads,
        "lora_r": args.lora_r,
        "agent_fraction": args.agent_fraction,
        "torch": torch.__version__,
        "max_logprob_diff_before_update": diffs,
        "first_step_s": first,
        "shapes": {
            n: {
                "tokens": int(batches[n][1].sum()),
                "eager_s": spread(t["eager"]),
                "compiled_s": spread(t["compiled"]),
                "eager_over_compiled": spread([e / c for e, c in zip(t["eager"], t["compiled"])]),
                "rounds": t,
            }
            for n, t in times.items()
        },
        "load_avg_1m": loads,
    }
    print(f"torch {torch.__version__}, {args.threads} threads, load {min(loads):.2f}-{max(loads):.2f}")
    for n, r in result["shapes"].items():
        print(
            f"  {n}: eager {r['eager_s']['median']:.2f} s, compiled {r['compiled_s']['median']:.2f} s, "
            f"eager / compiled {r['eager_over_compiled']['median']:.2f} "
            f"({r['eager_over_compiled']['min']:.2f}-{r['eager_over_compiled']['max']:.2f}); "
            f"first compiled step {first[n]['compiled']:.1f} s; max log-prob diff {diffs[n]:.2e}"
        )
    write_json(args.out, result)
    write_raw(__file__, result, argv=argv, outputs=[args.out])
    return 0


if __name__ == "__main__":
    sys.exit(main())
