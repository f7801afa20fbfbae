"""Oracle scores of the Math, HumanEval and MBPP envs: the canonical solution on every problem.

    python benchmarks/verdicts/oracle_math_code.py [--math-tasks 500] [--workers 2] [--out benchmarks/results/oracle_math_code.json]
    python benchmarks/verdicts/oracle_math_code.py --mbpp-path mbpp.jsonl --math-path MATH/   # official data, when you have it

Each problem is played through its env with the env's ``demonstration(task)`` (Math synthetic: a
python call running the task's program, then the boxed answer; HumanEval: prompt +
``canonical_solution``; MBPP: ``code``), the hidden tests run in the sandbox. Prints and saves,
per env: problems, successes, the success rate, the ids of failures and the wall time. For the
synthetic Math tasks it also checks that the program's printed output (what the python tool
returned) matches the gold answer.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gymnasium as gym  # noqa: E402

import agent_gym  # noqa: E402,F401
from agent_gym.math_answer import answers_match  # noqa: E402
from agent_gym.provenance import write_raw
from trainers.sft import play  # noqa: E402


def oracle(env_id: str, kwargs: dict, n: int | None, workers: int) -> dict:
    local = threading.local()

    def one(k: int):
        if not hasattr(local, "env"):  # one env per thread: an env is not thread-safe
            local.env = gym.make(env_id, **kwargs).unwrapped
        env = local.env
        ep = play(env, k, env.demonstration)
        tool_ok = None
        if env.task.get("program"):  # the python tool's output is the answer too
            tool_out = [c for role, c in env.transcript if role == "tool"]
            tool_ok = bool(tool_out) and answers_match(tool_out[-1].strip(), env.task["answer"])
        return ep.task_id, ep.success, tool_ok

    total = gym.make(env_id, **kwargs).unwrapped.num_tasks()
    n = total if n is None else min(n, total)
    t0 = time.monotonic()
    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(one, range(n)))
    took = time.monotonic() - t0
    out = {
        "env": env_id,
        "kwargs": kwargs,
        "problems": n,
        "successes": sum(s for _, s, _ in results),
        "success_rate": sum(s for _, s, _ in results) / n,
        "failures": [i for i, s, _ in results if not s],
        "wall_s": round(took, 1),
        "workers": workers,
    }
    checked = [t for _, _, t in results if t is not None]
    if checked:
        out["tool_output_matches_gold"] = f"{sum(checked)}/{len(checked)}"
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--math-tasks", type=int, default=500)
    ap.add_argument("--math-path", help="the MATH directory or a JSONL file (default: the synthetic set)")
    ap.add_argument("--mbpp-path", help="the official mbpp.jsonl (default: the built-in problems)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/oracle_math_code.json")
    args = ap.parse_args(argv)
    math_kw = {"data_path": args.math_path} if args.math_path else {"num_tasks": args.math_tasks}
    runs = [
        ("AgentR1/Math-v0", math_kw),
        ("AgentR1/HumanEval-v0", {}),
        ("AgentR1/MBPP-v0", {"data_path": args.mbpp_path} if args.mbpp_path else {}),
    ]
    report = {"load_avg_1m_before": round(os.getloadavg()[0], 1), "results": []}
    for env_id, kw in runs:
        r = oracle(env_id, kw, None, args.workers)
        print(json.dumps(r))
        report["results"].append(r)
    report["load_avg_1m_after"] = round(os.getloadavg()[0], 1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"saved {args.out}")
    write_raw(__file__, report, argv=argv, outputs=[args.out])
    return 0 if all(r["success_rate"] == 1.0 for r in report["results"]) else 1


if __name__ == "__main__":
    sys.exit(main())
