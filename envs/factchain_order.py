"""Which order a FactChain agent looked relations up in: each episode classed by its first lookup
(:func:`classify`), and two evaluations of the same questions compared (:func:`compare`, with the
exact sign test on the questions that flipped). Reads FactChain's question wording, so it lives
beside the env (tests/envs/test_factchain_order.py checks it on the env's own questions). The
command line, and what the classes mean, are in benchmarks/analysis/factchain_order.py.
"""

from __future__ import annotations

import json
import re
from collections import Counter

from agent_gym.stats import sign_test

QUESTION = re.compile(r'Who is the ((?:\w+ of the )*\w+) of "([^"]+)"\?')
RELATION = re.compile(r'"relation"\s*:\s*"(\w+)"')
CLASSES = ("same", "inner_first", "outer_first", "other")


def classify(text: str) -> tuple[str, str]:
    """``(class, start entity)`` of one episode's text."""
    matches = list(QUESTION.finditer(text))
    if not matches:
        raise ValueError("no nested FactChain question ('Who is the R of the R of \"X\"?') in the episode's text")
    q = matches[-1]
    chain = q.group(1).split(" of the ")  # as written: outermost first
    calls = RELATION.findall(text[q.end() :])
    if chain[0] == chain[-1]:
        return "same", q.group(2)
    if calls and calls[0] == chain[-1]:
        return "inner_first", q.group(2)
    if calls and calls[0] == chain[0]:
        return "outer_first", q.group(2)
    return "other", q.group(2)


def load(path: str) -> dict[int, tuple[bool, str, str]]:
    """task index -> (success, class, start entity)."""
    out = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                ep = json.loads(line)
                cls, start = classify(ep["text"])
                out[ep["task_index"]] = (bool(ep["success"]), cls, start)
    return out


def compare(before: dict, after: dict) -> dict:
    if before.keys() != after.keys():
        raise ValueError(
            f"the two files hold different tasks: {sorted(before.keys() ^ after.keys())[:5]} ... "
            "evaluate both with the same env arguments and --tasks"
        )
    differ = [k for k in before if before[k][2] != after[k][2]]
    if differ:
        raise ValueError(
            f"task {differ[0]} asks about {before[differ[0]][2]!r} in one file and {after[differ[0]][2]!r} "
            "in the other: evaluate both with the same env arguments"
        )

    def table(d: dict) -> dict[str, dict[str, int]]:
        c = Counter((cls, ok) for ok, cls, _ in d.values())
        return {cls: {"episodes": c[(cls, True)] + c[(cls, False)], "right": c[(cls, True)]} for cls in CLASSES}

    up = sum(1 for k in before if not before[k][0] and after[k][0])
    down = sum(1 for k in before if before[k][0] and not after[k][0])
    return {
        "questions": len(before),
        "right_before": sum(v[0] for v in before.values()),
        "right_after": sum(v[0] for v in after.values()),
        "fail_to_success": up,
        "success_to_fail": down,
        "sign_test_p": sign_test(up, down),
        "before": table(before),
        "after": table(after),
    }


__all__ = ["CLASSES", "classify", "compare", "load"]
