"""Merge QA datasets into one normalized JSONL, for training on a mixture (the paper's
HotpotQA+2WikiMultiHopQA setting).

    python scripts/merge_qa.py --out data/hotpot_2wiki_train.jsonl \\
        hotpotqa=data/hotpot_train_v1.1.json 2wikimultihopqa=data/2wiki/train.json

Each source is DATASET=PATH (any layout the loaders read). Rows keep their official ids,
prefixed with the dataset name, and get a ``dataset`` field. The output loads with any of the QA
envs, e.g. ``gym.make("AgentR1/HotpotQA-v0", data_path="data/hotpot_2wiki_train.jsonl")``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys

from agent_gym.datasets.split import normalized_rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sources", nargs="+", metavar="DATASET=PATH")
    ap.add_argument("--split", default="train")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0, help="shuffle seed for the merged rows")
    args = ap.parse_args(argv)
    rows = []
    for src in args.sources:
        if "=" not in src:
            ap.error(f"source {src!r} must look like DATASET=PATH")
        name, path = src.split("=", 1)
        rows += [{**r, "id": f"{name}:{r['id']}", "dataset": name} for r in normalized_rows(name, path, args.split)]
    random.Random(args.seed).shuffle(rows)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(f"wrote {len(rows)} rows to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
