"""Which order a FactChain agent looks relations up in, before and after training, on the same questions.

    python benchmarks/factchain_order.py BEFORE/trajectories.jsonl AFTER/trajectories.jsonl [--out FILE.json]

Both files are ``trainers/evaluate.py --out DIR`` trajectories of the same tasks (the same env
arguments and ``--tasks``; checked: each task index must carry the same question in both). A
nested question, 'Who is the mentor of the rival of "Karimel"?', is answered by looking up the
innermost relation first (rival, then mentor). Each episode is classed by its first lookup:

- ``same``: the innermost and the outermost relation are the same one, so the first lookup does
  not tell the order (on 2 hops: the order cannot be wrong);
- ``inner_first``: the first lookup is the innermost relation (the right order);
- ``outer_first``: the first lookup is the outermost relation (the order the question is written in);
- ``other``: no lookup, or another relation first.

and counted with its success. The pairing then gives the questions that went from failure to
success and back, and the exact two-sided sign test on those flips (the chance of a split at least
as uneven if training changed nothing but which questions a greedy agent gets right). The SFT
warm start of docs/results.md learned both orders from its demonstrator (40% oracle, 60% reversed),
so this shows whether RL moved it towards the right one. The question is read from the
episode's text (the last nested question in it: the system prompt's example comes first).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path

try:
    from benchmarks.provenance import write_raw
except ModuleNotFoundError:  # run by path: benchmarks/ is on sys.path, the repository root may not be
    from provenance import write_raw

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
    calls = RELATION.findall(text[q.end():])
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
        raise ValueError(f"the two files hold different tasks: {sorted(before.keys() ^ after.keys())[:5]} ... "
                         "evaluate both with the same env arguments and --tasks")
    differ = [k for k in before if before[k][2] != after[k][2]]
    if differ:
        raise ValueError(f"task {differ[0]} asks about {before[differ[0]][2]!r} in one file and {after[differ[0]][2]!r} "
                         "in the other: evaluate both with the same env arguments")

    def table(d: dict) -> dict[str, dict[str, int]]:
        c = Counter((cls, ok) for ok, cls, _ in d.values())
        return {cls: {"episodes": c[(cls, True)] + c[(cls, False)], "right": c[(cls, True)]} for cls in CLASSES}

    up = sum(1 for k in before if not before[k][0] and after[k][0])
    down = sum(1 for k in before if before[k][0] and not after[k][0])
    return {"questions": len(before), "right_before": sum(v[0] for v in before.values()),
            "right_after": sum(v[0] for v in after.values()), "fail_to_success": up, "success_to_fail": down,
            "sign_test_p": sign_test(up, down), "before": table(before), "after": table(after)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--out")
    args = p.parse_args(argv)
    result = compare(load(args.before), load(args.after))
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    write_raw(__file__, result, argv=argv, outputs=[args.out] if args.out else [])
    return 0


if __name__ == "__main__":
    sys.exit(main())
