"""Torch intra-op threads on a busy (or idle) machine: 1 thread, 2 threads (libgomp's default wait),
2 threads with ``OMP_WAIT_POLICY=PASSIVE``, 2 threads whose waits spin 10,000 times before they sleep
(``GOMP_SPINCOUNT=10000``, the policy unset), and 2 threads passive with the sampler on 1, on one
step's worth of work (HF sampling of 16 prompts x 2 turns x 32 tokens on the tiny Qwen2, then a
forward/backward over the sampled rows).

    python -m benchmarks.perf.threads_under_load [--hogs 2] [--rounds 3] [--configs 1_thread 2_threads ...]

``--hogs N`` starts N busy-loop processes for the duration (N=0: whatever else runs on the
machine is the load). Every configuration runs in its own fresh process (the OpenMP wait policy
is read when torch loads), interleaved: round 1 runs A, B, C, round 2 A, B, C, ... Each process
times only the workload (after a warm-up) and prints its seconds. Prints the median and range per
configuration, ratios to 1 thread, and the load average; writes
``benchmarks/results/threads_under_load.json``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from agent_gym.provenance import write_raw

ROOT = Path(__file__).resolve().parents[2]

from benchmarks.report import save, spread  # noqa: E402

WORKER = r"""
import os, sys, time
sys.path.insert(0, sys.argv[1])
import torch
from agent_gym.tokenizer import default_tokenizer
from trainers.backends import HFBackend, SamplingConfig
from trainers.tiny_model import build_tiny_qwen2
threads = int(sys.argv[2])
gen_threads = int(sys.argv[3])
torch.set_num_threads(threads)
tok = default_tokenizer()
model = build_tiny_qwen2(tok, seed=0)
hf = HFBackend(model, pad_token_id=tok.pad_token_id, num_threads=gen_threads)
g = torch.Generator().manual_seed(0)
prompts = [torch.randint(5, 200, (int(n),), generator=g).tolist() for n in torch.randint(40, 120, (16,), generator=g)]
sampling = SamplingConfig(max_new_tokens=32, temperature=1.0, stop_token_ids=[tok.eos_token_id])
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

def step():
    ps = prompts
    for turn in range(2):
        out = hf.generate(ps, sampling, seeds=[1000 * turn + i for i in range(len(ps))])
        ps = [p + o.token_ids for p, o in zip(ps, out)]
    L = max(len(p) for p in ps)
    ids = torch.tensor([p + [tok.pad_token_id] * (L - len(p)) for p in ps])
    att = (torch.arange(L)[None, :] < torch.tensor([len(p) for p in ps])[:, None]).long()
    loss = model(input_ids=ids, attention_mask=att, labels=ids.masked_fill(att == 0, -100)).loss
    opt.zero_grad(); loss.backward(); opt.step()

step()  # warm-up
t0 = time.perf_counter(); step(); step()
print("SECONDS", (time.perf_counter() - t0) / 2)
"""


def hog(stop_at: float) -> None:
    x = 0
    while time.time() < stop_at:
        x = (x * 31 + 7) % 1000003


_UNSET = {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": None}
# name -> (torch threads, the sampler's threads, environment: None unsets a variable)
CONFIGS = {
    "1_thread": (1, 1, _UNSET),
    "2_threads": (2, 2, _UNSET),
    "2_threads_passive": (2, 2, {**_UNSET, "OMP_WAIT_POLICY": "PASSIVE"}),
    "2_threads_spin10k": (2, 2, {**_UNSET, "GOMP_SPINCOUNT": "10000"}),
    "2_threads_passive_sample1": (2, 1, {**_UNSET, "OMP_WAIT_POLICY": "PASSIVE"}),
}


def run_one(threads: int, gen_threads: int, extra_env: dict[str, str | None], timeout: float) -> float:
    env = {**os.environ, **{k: v for k, v in extra_env.items() if v is not None}}
    for k in [k for k, v in extra_env.items() if v is None]:
        env.pop(k, None)
    out = subprocess.run(
        [sys.executable, "-c", WORKER, str(ROOT), str(threads), str(gen_threads)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    for line in out.stdout.splitlines():
        if line.startswith("SECONDS"):
            return float(line.split()[1])
    raise RuntimeError(f"worker failed (exit {out.returncode}): {out.stderr[-2000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hogs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per worker process")
    ap.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS), help="which to run")
    args = ap.parse_args()
    configs = {k: CONFIGS[k] for k in args.configs}
    if "1_thread" not in configs:
        ap.error("--configs must include 1_thread (the ratios are to it)")
    load_before = os.getloadavg()
    stop_at = time.time() + args.rounds * len(configs) * args.timeout
    hogs = [mp.Process(target=hog, args=(stop_at,), daemon=True) for _ in range(args.hogs)]
    for h in hogs:
        h.start()
    secs: dict[str, list[float]] = {k: [] for k in configs}
    try:
        for r in range(args.rounds):
            for name, (threads, gen_threads, extra) in configs.items():
                secs[name].append(run_one(threads, gen_threads, extra, args.timeout))
                print(f"round {r}: {name} {secs[name][-1]:.3f} s", flush=True)
    finally:
        for h in hogs:
            h.terminate()
            h.join(5)
    base = statistics.median(secs["1_thread"])
    out = {
        "hogs": args.hogs,
        "rounds": args.rounds,
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "seconds_per_step": {k: {**spread(v), "all": v} for k, v in secs.items()},
        "ratio_to_1_thread": {k: statistics.median(v) / base for k, v in secs.items()},
    }
    for k, v in out["seconds_per_step"].items():
        print(
            f"{k}: {v['median']:.3f} s per step [{v['min']:.3f}-{v['max']:.3f}], "
            f"{out['ratio_to_1_thread'][k]:.2f}x of 1 thread"
        )
    print(f"hogs {args.hogs}; load average before {load_before[0]:.2f}, after {out['load_after'][0]:.2f}")
    write_raw(__file__, out, outputs=[save("threads_under_load", out)])


if __name__ == "__main__":
    main()
