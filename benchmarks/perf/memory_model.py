"""Measured peak memory of short training runs against the estimate the trainers log.

Each case runs a trainer for a few steps in a child process; the peak is the child's
``ru_maxrss`` (its resident high-water mark), the estimate the ``memory/estimate_gib`` it logged
(``trainers.memory_budget``: ``sft_memory_estimate`` for SFT, ``rl_step_estimate`` for RL). The
cases are SmolLM2-135M-Instruct's QA SFT warm start (``configs/smollm2_qa_sft.yaml``, full
fine-tuning at batch 4) as it was (no checkpointing, glibc's default allocator behaviour) and with
the memory keys on, so the before and after are in one run. One run per case (memory, unlike
time, does not vary with the machine's load).

    python benchmarks/perf/memory_model.py [--cases sft_plain,sft_ckpt] [--steps 3]

Needs runs/qa_split (``make qa-split``) and the SmolLM2 weights (the ``smollm`` extra).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agent_gym.provenance import write_raw

REPO = Path(__file__).resolve().parents[2]
SFT = "configs/smollm2_qa_sft.yaml"
CASES = {
    "sft_plain": (SFT, ["scale.gradient_checkpointing=false", "scale.release_freed_memory=false"]),
    "sft_release": (SFT, ["scale.gradient_checkpointing=false", "scale.release_freed_memory=true"]),
    "sft_ckpt": (SFT, ["scale.gradient_checkpointing=true", "scale.release_freed_memory=true"]),
}


def run_case(name: str, steps: int, demos: int) -> dict:
    config, over = CASES[name]
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / name
        cmd = [
            sys.executable,
            "trainers/train_sft.py",
            "--config",
            config,
            f"run_dir={run_dir}",
            f"steps={steps}",
            f"num_demos={demos}",
            "eval.tasks=1",
            "scale.memory_check=false",
            *over,
        ]
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        t0 = time.perf_counter()
        r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=3600)
        wall = time.perf_counter() - t0
        if r.returncode != 0:
            raise SystemExit(f"{name} failed:\n{r.stderr[-3000:]}")
        peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        if peak_kib <= before:  # a later child's peak only shows when it is the largest so far
            raise SystemExit(f"{name}: run the cases from the smallest peak up (see --cases)")
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    est = next(m["memory/estimate_gib"] for m in rows if "memory/estimate_gib" in m)
    peak = peak_kib / 2**20
    return {
        "case": name,
        "overrides": over,
        "steps": steps,
        "num_demos": demos,
        "peak_rss_gib": peak,
        "estimate_gib": est,
        "estimate_over_peak": est / peak,
        "wall_s": wall,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default="sft_ckpt,sft_release,sft_plain", help="smallest expected peak first")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--demos", type=int, default=16)
    ap.add_argument("--out", default="benchmarks/results/memory_model.json")
    args = ap.parse_args(argv)
    out = []
    for name in args.cases.split(","):
        r = run_case(name, args.steps, args.demos)
        print(json.dumps(r), flush=True)
        out.append(r)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    write_raw(__file__, {"cases": out}, argv=argv, outputs=[args.out])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
