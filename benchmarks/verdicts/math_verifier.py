"""Math answer checkers on a hand-labelled battery: false positives and negatives, and time per check.

    python benchmarks/verdicts/math_verifier.py [--rounds 3] [--out benchmarks/results/math_verifier.json]

The battery (``tests/fixtures/math_battery.jsonl``) holds (prediction, gold) pairs across answer types,
each labelled by hand by mathematical truth (``correct``). Three checkers decide each pair:

- ``old``: the project's own sympy checker, ``agent_gym/math_answer.py`` before math-verify (read from git
  at commit ``OLD_COMMIT``; skipped, with a note, when git or that commit is missing);
- ``math-verify``: Hugging Face's math-verify as is: ``verify(parse("\\boxed{gold}"),
  parse("\\boxed{answer}"))`` with its defaults (6-place float rounding, its signal timeouts);
- ``final``: :func:`agent_gym.math_answer.check_answer`, what Math-v0 pays on: math-verify after the
  pre-processing step, in a worker process under a hard time limit. ``final (in-process)`` is its
  verdict function :func:`agent_gym.math_answer.judge` called directly, so the difference of the
  two times is the worker's cost (a round trip through a pipe).

A false positive (FP) is a wrong answer accepted; a false negative (FN) a right answer rejected. The
checkers run interleaved (old, math-verify, final, final in-process; then again) over ``--rounds``
rounds; the time per check is the median over rounds of each pair's time, summarised by its median
and p99 over the battery. The reported hang cases (``(x+1)^{10000}`` and others) are then checked by
``final`` with its default limit, and their wall time reported. Prints a table and saves JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

from agent_gym.provenance import write_raw

ROOT = Path(__file__).resolve().parents[2]

from agent_gym import math_answer  # noqa: E402

OLD_COMMIT = "e5dff7d"
BATTERY = ROOT / "tests" / "fixtures" / "math_battery.jsonl"
HANG_CASES = ["\\boxed{x^{10000}-1}", "(x+1)^{10000}", "(x+y+z)^{300}", "((((x+1)^2+1)^2+1)^2+1)^{50}", "9^{9^{9^9}}"]


def load_old_checker():
    """The ``check_answer`` from before math-verify, from git, as a module of its own (``None`` if unavailable)."""
    try:
        src = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{OLD_COMMIT}:agent_gym/math_answer.py"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    mod = types.ModuleType("old_math_answer")
    exec(compile(src, f"{OLD_COMMIT}:agent_gym/math_answer.py", "exec"), mod.__dict__)  # noqa: S102  our own code
    return mod


def math_verify_raw(pred: str, gold: str) -> bool:
    from math_verify import parse, verify

    return bool(verify(parse("\\boxed{" + gold + "}"), parse("\\boxed{" + math_answer.extract_answer(pred) + "}")))


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "math_verifier.json"))
    args = ap.parse_args(argv)
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    rows = [json.loads(line) for line in BATTERY.read_text().splitlines() if line.strip()]
    checkers = {}
    old = load_old_checker()
    if old is not None:
        checkers["old"] = lambda p, g: old.answers_match(p, g)
    else:
        print(f"note: the old checker ({OLD_COMMIT}) is not in this checkout's git history; skipped")
    checkers["math-verify"] = math_verify_raw
    checkers["final"] = lambda p, g: math_answer.check_answer(p, g)[0]
    checkers["final (in-process)"] = lambda p, g: math_answer.judge(p, g)[0]
    math_answer.check_answer("1", "\\frac{2}{2}")  # start the first worker outside the timings

    verdicts: dict[str, list[bool]] = {name: [] for name in checkers}
    times: dict[str, list[list[float]]] = {name: [[] for _ in rows] for name in checkers}
    loads = [os.getloadavg()[0]]
    t_all = time.monotonic()
    for r in range(args.rounds):
        for name, fn in checkers.items():
            for i, row in enumerate(rows):
                t0 = time.perf_counter()
                ok = bool(fn(row["pred"], row["gold"]))
                times[name][i].append(time.perf_counter() - t0)
                if r == 0:
                    verdicts[name].append(ok)
                elif ok != verdicts[name][i]:
                    print(f"warning: {name} gave two verdicts on {row['id']}")
            loads.append(os.getloadavg()[0])

    categories = sorted({row["category"] for row in rows})
    table: dict[str, dict] = {}
    for name in checkers:
        per_cat = {}
        for cat in categories + ["all"]:
            idx = [i for i, row in enumerate(rows) if cat in ("all", row["category"])]
            fp = [rows[i]["id"] for i in idx if verdicts[name][i] and not rows[i]["correct"]]
            fn = [rows[i]["id"] for i in idx if not verdicts[name][i] and rows[i]["correct"]]
            per_cat[cat] = {
                "pairs": len(idx),
                "wrong_pairs": sum(not rows[i]["correct"] for i in idx),
                "right_pairs": sum(rows[i]["correct"] for i in idx),
                "fp": len(fp),
                "fn": len(fn),
                "fp_ids": fp,
                "fn_ids": fn,
            }
        per_check = [statistics.median(t) for t in times[name]]
        table[name] = {
            "categories": per_cat,
            "median_ms": 1000 * statistics.median(per_check),
            "p99_ms": 1000 * pct(per_check, 0.99),
            "max_ms": 1000 * max(per_check),
            "total_s_per_round": [sum(t[k] for t in times[name]) for k in range(args.rounds)],
        }

    hangs = []
    for case in HANG_CASES:
        t0 = time.perf_counter()
        ok, how = math_answer.check_answer(case, "x^2+1")
        hangs.append({"answer": case, "verdict": ok, "how": how, "wall_s": round(time.perf_counter() - t0, 2)})

    names = list(checkers)
    print(
        f"battery: {len(rows)} pairs ({sum(r['correct'] for r in rows)} right, "
        f"{sum(not r['correct'] for r in rows)} wrong), {args.rounds} rounds, "
        f"load average {min(loads):.1f}-{max(loads):.1f}, {time.monotonic() - t_all:.0f} s"
    )
    header = "| category | pairs (right/wrong) | " + " | ".join(f"{n} FP/FN" for n in names) + " |"
    print(header)
    print("|" + "---|" * (2 + len(names)))
    for cat in categories + ["all"]:
        c0 = table[names[0]]["categories"][cat]
        cells = " | ".join(f"{table[n]['categories'][cat]['fp']}/{table[n]['categories'][cat]['fn']}" for n in names)
        label = "**all**" if cat == "all" else cat
        print(f"| {label} | {c0['pairs']} ({c0['right_pairs']}/{c0['wrong_pairs']}) | {cells} |")
    print(
        "| time per check, median / p99 (ms) | | "
        + " | ".join(f"{table[n]['median_ms']:.1f} / {table[n]['p99_ms']:.0f}" for n in names)
        + " |"
    )
    for n in names:
        c = table[n]["categories"]["all"]
        print(f"{n}: FP {c['fp_ids']}  FN {c['fn_ids']}")
    print(f"hang cases under final (limit {math_answer.DEFAULT_TIMEOUT_S} s):")
    for h in hangs:
        print(f"  {h['answer']}: {h['verdict']} ({h['how']}) in {h['wall_s']} s")
    out = {
        "battery": str(BATTERY.relative_to(ROOT)),
        "pairs": len(rows),
        "rounds": args.rounds,
        "load_average": [min(loads), max(loads)],
        "checkers": table,
        "hang_cases": hangs,
        "timeout_s": math_answer.DEFAULT_TIMEOUT_S,
        "cpu_count": os.cpu_count(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"saved {args.out}")
    write_raw(__file__, out, argv=argv, outputs=[args.out])
    return 0


if __name__ == "__main__":
    sys.exit(main())
