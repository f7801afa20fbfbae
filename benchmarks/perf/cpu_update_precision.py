"""One LoRA update of SmolLM2-135M-Instruct on the CPU: float32 against bf16 autocast.

    python benchmarks/perf/cpu_update_precision.py                      # the converted instruct model
    python benchmarks/perf/cpu_update_precision.py --model runs/smollm2_qa_sft/model --rows 8 --tokens 1024

A QA iteration of the SmolLM2 runs here is bound by its update (docs/results.md: scoring and the
LoRA update take 172-212 s of a 206-266 s iteration, generation 27-37 s). This measures what
``scale.mixed_precision: bf16`` (forwards under ``torch.autocast(bfloat16)``, float32 weights,
gradients and AdamW state) buys on this CPU for the two kinds of pass an update makes:

- ``score``: a no-grad forward that scores the agent tokens (old log-probs, the reference);
- ``step``: forward + backward + AdamW step of the LoRA adapters, the loss on the agent tokens.

on ``--rows`` rows of ``--tokens`` tokens of repeated English text (the content does not change
the cost), ``--agent-fraction`` of them under the loss mask, as one micro-batch. The model and its
LoRA adapters are built as the trainer builds them (``load_policy``, ``scale.add_lora`` with
``ScaleConfig``'s default target modules). The sides are interleaved (fp32, bf16, fp32, bf16, ...) over
``--rounds`` rounds after one warm-up of each; reported: the median and range of each side's
seconds and of the per-round ratio fp32/bf16, the load average, and how far bf16's log-probs are
from float32's on the scored tokens (mean and max absolute difference). Writes
benchmarks/results/cpu_update_precision.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from agent_gym.provenance import write_raw

ROOT = Path(__file__).resolve().parents[2]


def _batch(tokenizer, rows: int, tokens: int, agent_fraction: float, seed: int):
    text = (
        "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. "
        "It is named after the engineer Gustave Eiffel, whose company designed and built the tower. "
    )
    ids = tokenizer(text * (tokens // 10 + 1))["input_ids"][:tokens]
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.tensor([ids] * rows)
    mask = (torch.rand(rows, tokens, generator=g) < agent_fraction).float()
    mask[:, 0] = 0
    return input_ids, torch.ones_like(input_ids), mask


def lora_policy(model_name: str, lora_r: int, threads: int):
    """``(tokenizer, policy, AdamW)``: the model and its LoRA adapters (r ``lora_r``, alpha 2r, the
    default target modules) as the trainer builds them, in training mode, on ``threads`` threads."""
    from trainers import scale
    from trainers.config import ModelConfig, ScaleConfig
    from trainers.models import load_policy, load_tokenizer_for

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = ModelConfig(name=model_name)
    tokenizer = load_tokenizer_for(model)
    policy = scale.add_lora(load_policy(model, tokenizer), ScaleConfig(lora_r=lora_r, lora_alpha=2 * lora_r)).train()
    return tokenizer, policy, torch.optim.AdamW(scale.trainable(policy), lr=1e-6)


def lora_step(policy, opt, ids, attn, mask, mixed_precision: str = "no", clip: float | None = 1.0) -> float:
    """One LoRA step as the trainer takes it (the forward under ``mixed_precision``'s autocast,
    ``scale.autocast``; the loss on the masked tokens, backward, gradient clipping at ``clip``, none
    when None, the optimizer step); its wall time in seconds."""
    from trainers import scale
    from trainers.models import token_logprobs  # deferred: torch and transformers, at the first step

    t = time.perf_counter()
    with scale.autocast(mixed_precision, "cpu"):
        lp, _ = token_logprobs(policy, ids, attn, loss_mask=mask)
    loss = -(lp * mask).sum() / mask.sum()
    loss.backward()
    if clip is not None:
        torch.nn.utils.clip_grad_norm_(scale.trainable(policy), clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct", help="model name or HF directory")
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--agent-fraction", type=float, default=0.3)
    p.add_argument("--lora-r", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "cpu_update_precision.json"))
    args = p.parse_args(argv)

    from trainers import scale
    from trainers.models import token_logprobs  # deferred: torch and transformers, at the first step

    tokenizer, policy, opt = lora_policy(args.model, args.lora_r, args.threads)
    ids, attn, mask = _batch(tokenizer, args.rows, args.tokens, args.agent_fraction, seed=0)

    def score(mp: str) -> tuple[float, torch.Tensor]:
        t = time.perf_counter()
        with torch.no_grad(), scale.autocast(mp, "cpu"):
            lp, _ = token_logprobs(policy, ids, attn, loss_mask=mask)
        return time.perf_counter() - t, lp

    def step(mp: str) -> float:  # without clipping, as this benchmark's figures were measured
        return lora_step(policy, opt, ids, attn, mask, mixed_precision=mp, clip=None)

    sides = ("no", "bf16")
    for mp in sides:  # warm-up: oneDNN's first call of each shape builds its kernels
        score(mp)
        step(mp)
    times: dict[str, dict[str, list[float]]] = {mp: {"score": [], "step": []} for mp in sides}
    lps: dict[str, torch.Tensor] = {}
    loads = []
    for _ in range(args.rounds):
        for mp in sides:
            s, lps[mp] = score(mp)
            times[mp]["score"].append(s)
            times[mp]["step"].append(step(mp))
        loads.append(os.getloadavg()[0])
    diff = (lps["no"] - lps["bf16"]).abs()[mask > 0]

    def summary(xs: list[float]) -> dict[str, float]:
        return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}

    result = {
        "model": args.model,
        "rows": args.rows,
        "tokens": args.tokens,
        "agent_fraction": args.agent_fraction,
        "lora_r": args.lora_r,
        "rounds": args.rounds,
        "threads": args.threads,
        "load_avg_1m": loads,
        "seconds": {mp: {k: summary(v) for k, v in times[mp].items()} for mp in sides},
        "ratio_fp32_over_bf16": {
            k: summary([a / b for a, b in zip(times["no"][k], times["bf16"][k])]) for k in ("score", "step")
        },
        "bf16_logprob_abs_diff": {"mean": diff.mean().item(), "max": diff.max().item()},
    }
    print(json.dumps(result, indent=2))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    write_raw(__file__, result, argv=argv, outputs=[args.out])
    return 0


if __name__ == "__main__":
    sys.exit(main())
