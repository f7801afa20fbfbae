"""Split QA rows into a training part and a held-out part by a hash of each row's id, and write the
training mixture with its merged corpus (the paper's HotpotQA+2WikiMultiHopQA setting, with a
held-out evaluation of your own and an out-of-domain set).

    python scripts/split_qa.py --out-dir runs/qa_split --heldout 0.2 \\
        --data hotpotqa=../shared/data/hotpotqa/dev_sample.jsonl \\
        --data 2wikimultihopqa=../shared/data/2wikimultihopqa/dev_sample.jsonl \\
        --ood musique=../shared/data/musique/dev_sample.jsonl \\
        --corpus hotpotqa=../shared/data/hotpotqa/corpus.jsonl \\
        --corpus 2wikimultihopqa=../shared/data/2wikimultihopqa/corpus.jsonl

Writes, in the normalized JSONL layout every QA env loads (``data_path=``):

- ``<dataset>_train.jsonl`` and ``<dataset>_heldout.jsonl`` for each ``--data`` source: a row is
  held out when ``agent_gym.datasets.split.is_heldout(dataset, id, fraction, salt)`` (SHA-256 of
  ``salt + dataset:id``; stable under adding, removing or reordering rows);
- ``<dataset>_heldout.jsonl`` for each ``--ood`` source: all of its rows (never trained on);
- ``train.jsonl``: every ``--data`` source's training part, ids prefixed ``<dataset>:`` and a
  ``dataset`` field added, shuffled with ``--seed`` (as ``scripts/merge_qa.py`` writes);
- ``corpus.jsonl`` (with ``--corpus``): the corpora concatenated, duplicates (same title and
  text) dropped, ids prefixed ``<dataset>:`` (and suffixed ``#n`` where two corpora of one
  dataset reuse an id for different passages), for search during training on the mixture;
- ``split.json``: the settings and the row counts.

Evaluate a trained agent on a held-out part with its own dataset's corpus, as the baselines are:
``python trainers/evaluate.py --checkpoint RUN --env-id AgentR1/HotpotQA-v0 --env-kwargs
'{data_path: runs/qa_split/hotpotqa_heldout.jsonl, corpus_path: ../shared/data/hotpotqa/corpus.jsonl}'``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from agent_gym.datasets import DATASETS, load_corpus
from agent_gym.datasets.split import is_heldout, normalized_rows


def _pairs(ap: argparse.ArgumentParser, values: list[str], flag: str) -> list[tuple[str, str]]:
    out = []
    for v in values:
        name, sep, path = v.partition("=")
        if not sep or not path:
            ap.error(f"{flag} {v!r} must look like DATASET=PATH")
        if name not in DATASETS:
            ap.error(f"{flag} {v!r}: unknown dataset {name!r}; valid: {sorted(DATASETS)}")
        if not Path(path).is_file():
            ap.error(f"{flag} {v!r}: no such file {path!r}")
        out.append((name, path))
    return out


def _write(path: Path, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", required=True)
    ap.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="DATASET=PATH",
        help="rows to split into a training and a held-out part (repeatable)",
    )
    ap.add_argument(
        "--ood",
        action="append",
        default=[],
        metavar="DATASET=PATH",
        help="rows held out whole: an out-of-domain evaluation set (repeatable)",
    )
    ap.add_argument(
        "--corpus",
        action="append",
        default=[],
        metavar="DATASET=PATH",
        help="corpora to merge into corpus.jsonl for training on the mixture (repeatable)",
    )
    ap.add_argument("--heldout", type=float, default=0.2, help="share of each --data source held out (default 0.2)")
    ap.add_argument("--salt", default="", help="a different salt draws an independent split")
    ap.add_argument("--split", default="dev", help="the split name the loaders read from each file (default dev)")
    ap.add_argument("--seed", type=int, default=0, help="shuffle seed of train.jsonl")
    args = ap.parse_args(argv)
    if not 0.0 < args.heldout < 1.0:
        ap.error(f"--heldout must be strictly between 0 and 1, got {args.heldout}")
    data, ood, corpora = (
        _pairs(ap, args.data, "--data"),
        _pairs(ap, args.ood, "--ood"),
        _pairs(ap, args.corpus, "--corpus"),
    )
    if not data:
        ap.error("give at least one --data DATASET=PATH")
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)

    counts: dict[str, dict[str, int]] = {}
    train_mix: list[dict] = []
    for name, path in data:
        rows = normalized_rows(name, path, args.split)
        held, train = [], []
        for r in rows:  # one hash per row
            (held if is_heldout(name, r["id"], args.heldout, args.salt) else train).append(r)
        _write(out / f"{name}_train.jsonl", train)
        _write(out / f"{name}_heldout.jsonl", held)
        train_mix += [{**r, "id": f"{name}:{r['id']}", "dataset": name} for r in train]
        counts[name] = {"train": len(train), "heldout": len(held)}
    for name, path in ood:
        rows = normalized_rows(name, path, args.split)
        _write(out / f"{name}_heldout.jsonl", rows)
        counts[name] = {"train": 0, "heldout": len(rows)}
    random.Random(args.seed).shuffle(train_mix)
    _write(out / "train.jsonl", train_mix)

    n_docs = 0
    if corpora:
        seen: set[tuple[str, str]] = set()
        ids: set[str] = set()
        docs = []
        for name, path in corpora:
            for d in load_corpus(path):
                key = (d["title"], d["text"])
                if key not in seen:
                    seen.add(key)
                    doc_id, n = f"{name}:{d['id']}", 1
                    while doc_id in ids:  # two corpora of one dataset reusing an id for different passages
                        doc_id, n = f"{name}:{d['id']}#{n}", n + 1
                    ids.add(doc_id)
                    docs.append({"id": doc_id, "title": d["title"], "text": d["text"]})
        _write(out / "corpus.jsonl", docs)
        n_docs = len(docs)
    summary = {
        "heldout_fraction": args.heldout,
        "salt": args.salt,
        "split": args.split,
        "seed": args.seed,
        "hash": "sha256(salt + dataset + ':' + id)[:8] / 2**64 < heldout_fraction",
        "sources": {n: p for n, p in data},
        "ood": {n: p for n, p in ood},
        "corpora": {n: p for n, p in corpora},
        "counts": counts,
        "train_rows": len(train_mix),
        "corpus_docs": n_docs,
    }
    (out / "split.json").write_text(json.dumps(summary, indent=1) + "\n")
    for name, c in counts.items():
        print(f"{name}: {c['train']} train, {c['heldout']} held out")
    print(
        f"train.jsonl: {len(train_mix)} rows" + (f"; corpus.jsonl: {n_docs} passages" if corpora else "") + f"  ({out})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
