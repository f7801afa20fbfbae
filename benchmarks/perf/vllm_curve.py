"""vLLM's CPU engine on SmolLM2-135M-Instruct: decode tokens/s against batch size and context length,
beside what memory bandwidth and matmul throughput allow for one decode step.

    .venv-vllm/bin/python -m benchmarks.perf.vllm_curve                  # the grid below, 3 rounds
    .venv-vllm/bin/python -m benchmarks.perf.vllm_curve --batches 16 64 --contexts 512 --rounds 1

One engine serves every cell: ``VLLMBackend`` with the project's CPU settings (float32, whole-prompt
prefills, every core bound as a lone lockstep engine binds them), ``max_num_seqs`` = the largest
batch and a KV cache sized for the largest cell; requests go in as the lockstep rollout sends them
(``vllm.LLM.generate``: the whole batch queued, then stepped). The rounds go over the cells in turn
(round 1: every cell, round 2: every cell, ...). A cell is ``batch`` distinct random prompts of
``context`` tokens (no shared prefix; a context that is a multiple of vLLM's CPU block, 128 tokens,
gets one token more, so that a cached prompt recomputes one token, not a block), generated three times: (A) 1 token each, a fresh prefill
(prefill tokens/s); (C) ``1 + --decode`` tokens each (``ignore_eos``) and (B) 1 token each, both
with the prompts now in the prefix cache, so that C - B is ``--decode`` decode steps of the whole
batch; decode tokens/s = batch x decode / (C - B). Each sequence still reads its own KV blocks (the
prompts differ), so the steps read what an uncached batch's would.

The bound for a decode step (``--bandwidth-gbs``, ``--gflops``: the roofline's 2-thread read
bandwidth and float32 matmul throughput, results/roofline/): the step reads the weights once and the
KV cache of every sequence (``30 layers x 2 x 192 x 4`` bytes a token in float32) and does
``iteration_profile.flops_per_token``'s forward FLOP a token (2 per weight, the head, attention
over the whole context); the step takes at
least the larger of bytes / bandwidth and FLOP / throughput, and ``batch`` tokens per step is the
bound. Printed and saved (benchmarks/results/vllm_curve.json, a raw copy under results/vllm_curve/).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

from agent_gym.provenance import write_raw
from benchmarks.perf.iteration_profile import flops_per_token
from benchmarks.report import RESULTS, spread, write_json
from trainers.memory_budget import kv_width


def kv_bytes_per_token(cfg) -> int:
    """Keys and values of one token over every layer, float32 (SmolLM2-135M: 30 x 2 x 192 x 4)."""
    return cfg.num_hidden_layers * 2 * kv_width(cfg) * 4


def step_bound(cfg, batch: int, context: int, bandwidth_gbs: float, gflops: float) -> dict[str, float]:
    """The decode-step floor and the tokens/s it allows (docstring of the module)."""
    kv = batch * context * kv_bytes_per_token(cfg)
    read_s = (4 * parameters(cfg) + kv) / (bandwidth_gbs * 1e9)
    # a decoded token attends to the whole context (flops_per_token counts half of it, on average)
    flop = batch * flops_per_token(cfg.to_dict(), 2 * context, agent_frac=1.0, lora=False, backward=False)
    compute_s = flop / (gflops * 1e9)
    step = max(read_s, compute_s)
    return {"read_s": read_s, "compute_s": compute_s, "tokens_per_s": batch / step, "kv_gib": kv / 2**30}


def parameters(cfg) -> int:
    """A Llama config's parameter count, tied embeddings once (SmolLM2-135M: 134,515,008)."""
    H, I, L, V = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
    KV = cfg.num_key_value_heads * (H // cfg.num_attention_heads)
    layer = 2 * H * H + 2 * H * KV + 3 * H * I + 2 * H
    return V * H * (1 if cfg.tie_word_embeddings else 2) + L * layer + H


def one_cell(llm, batch: int, context: int, decode: int, vocab: int, rng: random.Random) -> dict:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=[rng.randrange(100, vocab) for _ in range(context)]) for _ in range(batch)]

    def timed(tokens: int) -> float:
        params = SamplingParams(max_tokens=tokens, min_tokens=tokens, ignore_eos=True, temperature=1.0, seed=0)
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        dt = time.perf_counter() - t0
        assert all(len(o.outputs[0].token_ids) == tokens for o in outs)
        return dt

    a = timed(1)  # fresh prompts: the prefill
    c = timed(1 + decode)  # cached prompts: decode steps
    b = timed(1)  # cached prompts: what C pays besides its decode steps
    return {
        "decode_tokens_per_s": batch * decode / (c - b),
        "prefill_tokens_per_s": batch * context / a,
        "prefill_s": a,
        "cached_s": b,
        "decode_run_s": c,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batches", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    p.add_argument("--batch-context", type=int, default=128, help="context of the batch sweep's cells")
    p.add_argument("--contexts", type=int, nargs="+", default=[128, 512, 1024, 2048])
    p.add_argument("--context-batch", type=int, default=16, help="batch of the context sweep's cells")
    p.add_argument("--decode", type=int, default=32, help="tokens each sequence generates")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--bandwidth-gbs", type=float, default=17.1, help="read bandwidth, 2 threads (roofline.py)")
    p.add_argument("--gflops", type=float, default=240.0, help="float32 matmul GFLOP/s, 2 threads (roofline.py)")
    p.add_argument(
        "--bind", default="all", help="omp_threads_bind of the engine ('all': every core, as a lone lockstep engine)"
    )
    p.add_argument("--out", default=str(RESULTS / "vllm_curve.json"))
    args = p.parse_args(argv)

    from transformers import AutoConfig

    from trainers import smollm
    from trainers.backends.vllm_backend import VLLMBackend

    def ctx(c: int) -> int:
        return c + 1 if c % 128 == 0 else c

    cells = [(b, ctx(args.batch_context)) for b in args.batches]
    cells += [(args.context_batch, ctx(c)) for c in args.contexts if (args.context_batch, ctx(c)) not in cells]
    max_len = max(c for _, c in cells) + args.decode + 1
    # every sequence holds whole blocks of 128 tokens (vLLM's CPU block size)
    kv_tokens = max(b * -(-(c + args.decode + 1) // 128) * 128 for b, c in cells)
    path = smollm.ensure_converted()
    cfg = AutoConfig.from_pretrained(str(path))
    kv_bytes = int(1.25 * kv_tokens * kv_bytes_per_token(cfg)) + 64 * 2**20
    t0 = time.perf_counter()
    backend = VLLMBackend(
        str(path),
        max_model_len=max_len,
        kv_cache_memory_bytes=kv_bytes,
        omp_threads_bind=args.bind,
        max_num_seqs=max(b for b, _ in cells),
    )
    start_s = time.perf_counter() - t0
    vocab = cfg.vocab_size
    rng = random.Random(0)
    readings: dict[tuple[int, int], list[dict]] = {c: [] for c in cells}
    loads = []
    try:
        one_cell(backend.llm, 2, 64, 4, vocab, rng)  # warm-up
        for r in range(args.rounds):
            for b, c in cells:
                out = one_cell(backend.llm, b, c, args.decode, vocab, rng)
                readings[(b, c)].append(out)
                print(
                    f"round {r + 1} batch {b:4d} context {c:5d}: decode {out['decode_tokens_per_s']:7.1f} tokens/s "
                    f"(C {out['decode_run_s']:.2f} s, B {out['cached_s']:.2f} s), prefill {out['prefill_tokens_per_s']:7.1f} "
                    f"tokens/s ({out['prefill_s']:.1f} s)",
                    flush=True,
                )
            loads.append(os.getloadavg()[0])
    finally:
        backend.close()
    table = []
    for b, c in cells:
        rs = readings[(b, c)]
        bound = step_bound(cfg, b, c, args.bandwidth_gbs, args.gflops)
        dec = spread(x["decode_tokens_per_s"] for x in rs)
        table.append(
            {
                "batch": b,
                "context": c,
                "decode_tokens_per_s": dec,
                "prefill_tokens_per_s": spread(x["prefill_tokens_per_s"] for x in rs),
                "step_ms": 1000 * b / dec["median"],
                "bound": bound,
                "of_bound": dec["median"] / bound["tokens_per_s"],
            }
        )
    result = {
        "conditions": {
            "model": "SmolLM2-135M-Instruct, float32",
            "decode_tokens": args.decode,
            "rounds": args.rounds,
            "kv_cache_gib": kv_bytes / 2**30,
            "max_num_seqs": max(b for b, _ in cells),
            "omp_threads_bind": args.bind,
            "engine_start_s": start_s,
            "bandwidth_gbs": args.bandwidth_gbs,
            "gflops": args.gflops,
            "cpus": os.cpu_count(),
            "load_avg_1m": loads,
        },
        "cells": table,
    }
    print(f"{'batch':>5} {'context':>7} {'decode tok/s':>22} {'step ms':>8} {'bound tok/s':>11} {'of bound':>8}")
    for row in table:
        d = row["decode_tokens_per_s"]
        print(
            f"{row['batch']:5d} {row['context']:7d} {d['median']:8.1f} ({d['min']:.1f}-{d['max']:.1f}) "
            f"{row['step_ms']:8.1f} {row['bound']['tokens_per_s']:11.1f} {row['of_bound']:8.2f}"
        )
    write_json(args.out, result)
    write_raw(__file__, result, argv=argv, outputs=[args.out])
    return 0


if __name__ == "__main__":
    sys.exit(main())
