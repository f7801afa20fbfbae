"""The cost of one step with a huge tool output, and of one turn with thousands of
empty tool calls, before vs after the caps (``max_tool_output_chars``, ``max_calls_per_turn``).

Two scenarios, each one timed ``env.step`` (reset untimed), with every env argument at its default
except the context budget (262,144 tokens, so the 4,000 calls fit in one action and, before the
cap, their 4,000 error messages fit in the context too: the worst case):

- ``big_output``: a tool that returns 10 MB of text (words);
- ``many_calls``: one turn of 4,000 empty ``<tool_call></tool_call>``;
- ``parse_only``: the env's parse of that turn's text alone (20 repeats per process).

The chat-template delta cache is off (``renderer._cache_size = 0``) and the big output differs
from step to step, so every timed step does the whole work, as a fresh result would.

"Before" is the source tree at ``--before-rev`` (extracted with ``git archive`` into a temporary
directory), "after" the working tree. Each (side, round) is a fresh process, run interleaved
A, B, A, B over ``--rounds`` rounds; each process times ``--steps`` steps per scenario and reports
their median. Printed and saved: the median over rounds, the range, and the load average.

    python benchmarks/faults/tool_output_cap.py --before-rev 1dec0ef [--rounds 3] [--steps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUTPUT_BYTES = 10_000_000
EMPTY_CALLS = 4_000
CONTEXT = 262_144  # room for all 4,000 error messages (about 150k tokens): the uncapped worst case


def worker(steps: int) -> dict:
    """Runs in the tree on ``sys.path[0]``: times the two scenarios there."""
    from agent_gym.env import ToolEnv
    from agent_gym.tools import tool

    text = ("lorem ipsum dolor sit amet consectetur " * (OUTPUT_BYTES // 39 + 1))[:OUTPUT_BYTES]

    served = []

    @tool(description="Returns a lot.", parameters={"type": "object", "properties": {}})
    def big() -> str:
        served.append(1)
        return f"{len(served)} {text}"  # a new output each step

    class Env(ToolEnv):
        def num_tasks(self):
            return 1

        def get_task(self, i):
            return {"id": "t", "question": "Call the tool.", "answer": "x"}

        def score_answer(self, answer, task):
            return {"em": 0.0}

    env = Env(tools=[big], max_context_tokens=CONTEXT)
    env.renderer._cache_size = 0  # every delta rendered through the chat template, never memoized
    actions = {
        "big_output": env.encode_turn('<tool_call>{"name": "big", "arguments": {}}</tool_call>'),
        "many_calls": env.encode_turn("<tool_call></tool_call>" * EMPTY_CALLS),
    }
    out: dict = {}
    for name, action in actions.items():
        times, info = [], {}
        for _ in range(steps):
            env.reset(options={"task_index": 0})
            t0 = time.perf_counter()
            *_, info = env.step(action)
            times.append(time.perf_counter() - t0)
        out[name] = {
            "median_s": statistics.median(times),
            "calls_reported": len(info["tool_calls"]),
            "obs_tokens": info["obs_span"][1],
            "truncation_reason": info["truncation_reason"],
        }
    # The parser alone on the 4,000 calls, as the env calls it (capped after the fix).
    parse = getattr(env, "_parse", env.format.parse)
    text = "<tool_call></tool_call>" * EMPTY_CALLS
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        parsed = parse(text)
        times.append(time.perf_counter() - t0)
    out["parse_only"] = {
        "median_s": statistics.median(times),
        "calls_reported": len(parsed.calls),
        "obs_tokens": None,
        "truncation_reason": None,
    }
    return out


def run_side(src: Path, steps: int) -> dict:
    here = str(Path(__file__).resolve().parent)  # this module, imported by name in the child
    code = (
        f"import sys, json; sys.path.insert(0, {str(src)!r}); sys.path.insert(1, {here!r}); "
        f"import tool_output_cap as b; print(json.dumps(b.worker({steps})))"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=src, capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    # Imported here, not at the top: run_side's child imports this module against the "before"
    # tree, whose agent_gym may have no provenance module.
    from agent_gym.provenance import write_raw

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before-rev", required=True, help="the commit to measure as 'before'")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "tool_output_cap.json"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp) / "before"
        before.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", args.before_rev, "agent_gym", "envs"], capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(before)], input=archive, check=True)
        sides = {"before": before, "after": ROOT}
        runs: dict[str, list[dict]] = {k: [] for k in sides}
        load = [os.getloadavg()]
        for r in range(args.rounds):
            for side, src in sides.items():
                runs[side].append(run_side(src, args.steps))
                print(f"round {r} {side}: {json.dumps(runs[side][-1])}", flush=True)
            load.append(os.getloadavg())
    summary: dict = {
        "before_rev": args.before_rev,
        "rounds": args.rounds,
        "steps_per_round": args.steps,
        "load_average_1m": [round(x[0], 2) for x in load],
        "scenarios": {},
    }
    for scen in ("big_output", "many_calls", "parse_only"):
        row = {}
        for side in sides:
            ts = [run[scen]["median_s"] for run in runs[side]]
            row[side] = {
                "median_s": round(statistics.median(ts), 4),
                "min_s": round(min(ts), 4),
                "max_s": round(max(ts), 4),
                **{k: runs[side][-1][scen][k] for k in ("calls_reported", "obs_tokens", "truncation_reason")},
            }
        summary["scenarios"][scen] = row
        print(
            f"{scen}: before {row['before']['median_s']:.3f} s [{row['before']['min_s']:.3f}, "
            f"{row['before']['max_s']:.3f}], after {row['after']['median_s']:.4f} s [{row['after']['min_s']:.4f}, "
            f"{row['after']['max_s']:.4f}]"
        )
    print(f"load average (1 min) before/after each round: {summary['load_average_1m']}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")
    write_raw(__file__, {**summary, "runs": runs}, outputs=[args.out])


if __name__ == "__main__":
    main()
