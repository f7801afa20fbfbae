"""Which order a FactChain agent looks relations up in, before and after training, on the same questions.

    python benchmarks/analysis/factchain_order.py BEFORE/trajectories.jsonl AFTER/trajectories.jsonl [--out FILE.json]

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
episode's text (the last nested question in it: the system prompt's example comes first). The
classing and the comparison are envs/factchain_order.py's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from agent_gym.provenance import write_raw
from envs.factchain_order import compare, load


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
