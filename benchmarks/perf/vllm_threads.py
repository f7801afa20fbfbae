"""vLLM's CPU engine generating a QA rollout's turns: its OpenMP placement (``VLLM_CPU_OMP_THREADS_BIND``), A/B.

    .venv-vllm/bin/python -m benchmarks.perf.vllm_threads                       # auto vs 0-1 vs nobind, 3 rounds
    .venv-vllm/bin/python -m benchmarks.perf.vllm_threads --sides auto 0-1 --rounds 3 --batch 24

On this 2-core machine vLLM's CPU worker binds its OpenMP threads to core 0 and leaves core 1 to its
scheduler process (``VLLM_CPU_OMP_THREADS_BIND=auto``, docs/vllm.md "Several engines on one
machine"), so in a lockstep rollout, where the trainer waits while the engine generates, one core
does the model's work. Each side here is a fresh process (the variable is read when the engine
starts), run in turn (auto, 0-1, nobind, auto, ...) over ``--rounds`` rounds. A child starts a
``VLLMBackend`` on SmolLM2-135M-Instruct (float32, the QA configs' ``max_model_len`` and KV cache)
and generates the shape of a scaffolded QA GRPO rollout: ``--batch`` prompts of the real episodes a
run logged (``--trajectories``: each episode's prompt, ``prompt_len`` tokens, groups of 4 identical
prompts as GRPO samples them), ``--turns`` turns of at most ``--max-new`` tokens at temperature 0.7,
each followed by a tool response of 114 tokens (the configs cut their top 3 passages to 128
tokens in all). Reported per side: generation seconds and generated tokens/s (median, range), the
engine's start, the per-round ratio to the first side, the load average. Printed and saved
(benchmarks/results/vllm_threads.json and a raw copy under results/).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agent_gym.provenance import write_raw
from benchmarks.report import spread, write_json

ROOT = Path(__file__).resolve().parents[2]
TOOL = (
    "\n<|im_start|>user\n<tool_response>\nDoc 1 (Title: Karimel) Karimel was born in 1907 in a small town on the "
    "river, and moved to the capital as a child. Doc 2 (Title: The river) The river runs through three "
    "provinces before it reaches the sea. Doc 3 (Title: The capital) The capital has been the seat of the "
    "government since the eighteenth century, and is the country's largest city by population.\n"
    "</tool_response><|im_end|>\n<|im_start|>assistant\n"
)


def prompts_from(directory: Path, batch: int, group: int = 4) -> list[list[int]]:
    """``batch`` prompts: each logged episode's first ``prompt_len`` tokens, ``group`` copies each."""
    out: list[list[int]] = []
    for f in sorted(directory.glob("iter_*.jsonl"), reverse=True):
        r = json.loads(f.read_text().splitlines()[0])
        out += [r["token_ids"][: r["prompt_len"]]] * group
        if len(out) >= batch:
            return out[:batch]
    raise SystemExit(f"{directory}: not enough logged episodes for {batch} prompts")


def child(args: argparse.Namespace) -> None:
    from transformers import AutoTokenizer

    from benchmarks.perf.rollout import multi_turn
    from trainers import smollm
    from trainers.backends import SamplingConfig
    from trainers.backends.vllm_backend import VLLMBackend

    path = smollm.model_dir()
    tok = AutoTokenizer.from_pretrained(str(path))
    prompts = prompts_from(Path(args.trajectories), args.batch)
    tool_ids = tok.encode(TOOL, add_special_tokens=False)
    sampling = SamplingConfig(max_new_tokens=args.max_new, temperature=0.7, stop_token_ids=[tok.eos_token_id])
    t0 = time.perf_counter()
    backend = VLLMBackend(str(path), max_model_len=2560, kv_cache_memory_bytes=2 * 1024**3)
    start_s = time.perf_counter() - t0
    try:
        backend.generate(prompts[:2], sampling, seeds=[0, 1])  # warm-up
        seconds, tokens, _, _ = multi_turn(backend, prompts, sampling, tool_ids, args.turns)
    finally:
        backend.close()
    print("RESULT " + json.dumps({"start_s": start_s, "seconds": seconds, "tokens": tokens, "tool_ids": len(tool_ids)}))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sides", nargs="+", default=["auto", "0-1", "nobind"], help="VLLM_CPU_OMP_THREADS_BIND values")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch", type=int, default=24)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--max-new", type=int, default=48)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds for one child")
    p.add_argument("--trajectories", default=str(ROOT / "runs" / "smollm2_qa_grpo_scaffold_levers" / "trajectories"))
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "vllm_threads.json"))
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args)
        return 0
    runs: dict[str, list[dict]] = {s: [] for s in args.sides}
    loads = []
    for _ in range(args.rounds):
        for side in args.sides:
            env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": side}
            cmd = [sys.executable, "-m", "benchmarks.perf.vllm_threads", "--child", "--batch", str(args.batch)]
            cmd += ["--turns", str(args.turns), "--max-new", str(args.max_new), "--trajectories", args.trajectories]
            with tempfile.TemporaryFile("w+") as log:
                proc = subprocess.run(
                    cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True, timeout=args.timeout
                )
                if proc.returncode != 0:
                    log.seek(0)
                    raise SystemExit(f"side {side}: the child failed ({proc.returncode}):\n{log.read()[-3000:]}")
            line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
            r = json.loads(line[len("RESULT ") :])
            runs[side].append(r)
            print(
                f"{side}: {r['seconds']:.1f} s, {r['tokens'] / r['seconds']:.1f} tokens/s (start {r['start_s']:.0f} s)",
                flush=True,
            )
        loads.append(os.getloadavg()[0])
    first = args.sides[0]
    result = {
        "workload": {"batch": args.batch, "turns": args.turns, "max_new_tokens": args.max_new, "temperature": 0.7},
        "rounds": args.rounds,
        "cpus": os.cpu_count(),
        "load_avg_1m": loads,
        "sides": {
            s: {
                "seconds": spread(r["seconds"] for r in runs[s]),
                "tokens_per_s": spread(r["tokens"] / r["seconds"] for r in runs[s]),
                "engine_start_s": spread(r["start_s"] for r in runs[s]),
                "tokens": [r["tokens"] for r in runs[s]],
            }
            for s in args.sides
        },
        f"seconds_ratio_to_{first}": {
            s: spread(a["seconds"] / b["seconds"] for a, b in zip(runs[s], runs[first])) for s in args.sides[1:]
        },
    }
    print(json.dumps(result, indent=2))
    write_json(args.out, result)
    write_raw(__file__, result, argv=argv, outputs=[args.out])
    return 0


if __name__ == "__main__":
    sys.exit(main())
