"""Retrieval benchmark: recall of supporting paragraphs and single-process queries/s.

    python benchmarks/perf/retrieval.py                       # all three corpora, dense on musique
    python benchmarks/perf/retrieval.py --dense-datasets all  # dense everywhere (slow on a CPU)
    python benchmarks/perf/retrieval.py --limit 100 --skip-dense

For each corpus in `<data-dir>/{hotpotqa,2wikimultihopqa,musique}/corpus.jsonl` and the questions
of `dev_sample.jsonl`, every retriever answers each question alone (one `search([q], 10)` call
at a time, one process), and we report:
- recall@k: the fraction of a question's supporting titles found among the titles of its top k
  passages, averaged over questions;
- qps: questions / total search seconds (tokenizing or encoding the query included);
- build_s: seconds to build the index from scratch (a fresh cache directory);
- overlap@10 (bm25s only): mean |top10(bm25s) & top10(pyserini)| / 10, by doc id.

Dense encodes with torch.set_num_threads(1) (see DENSE_TORCH_THREADS). Its corpus embeddings
are cached in the user cache between runs (build_s is then the load time; see
`cached_embeddings`); the BM25 indexes are built from scratch in a temporary directory.

Comparability: bm25s runs with the analysis of Anserini's default English analyzer (Lucene's 33
stop words, possessive removal, Porter stemming) and Anserini's BM25 parameters (k1=0.9,
b=0.4), and both index title + text; see `agent_gym/retrievers/bm25.py`.

Targets: bm25s recall@5 within 1 point of pyserini's, and bm25s qps >= 5x pyserini's.
Results go to `benchmarks/results/retrieval.json` (git-ignored).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from agent_gym.provenance import write_raw

ROOT = Path(__file__).resolve().parents[2]

from agent_gym.datasets import load_corpus, load_qa  # noqa: E402
from agent_gym.retrievers.base import Retriever  # noqa: E402

DATASETS = ("hotpotqa", "2wikimultihopqa", "musique")
KS = (1, 5, 10)
DENSE_TORCH_THREADS = 1  # one short query at a time: 1 intra-op thread is fastest on 2 cores


def default_data_dir() -> Path:
    env = os.environ.get("AGENT_GYM_SHARED_DATA")
    return Path(env) if env else ROOT / ".." / "shared" / "data"


def build(kind: str, docs: list[dict[str, str]], cache: Path) -> Retriever:
    if kind == "bm25s":
        from agent_gym.retrievers.bm25 import BM25Retriever

        return BM25Retriever(docs, cache_dir=cache / "bm25s")
    if kind == "pyserini":
        from agent_gym.retrievers.pyserini_bm25 import PyseriniBM25Retriever

        return PyseriniBM25Retriever(corpus=docs, cache_dir=cache / "pyserini", threads=2)
    if kind == "dense":
        from agent_gym.retrievers.dense import DenseRetriever

        # Embeddings are worth keeping between runs: encoding is minutes on a CPU.
        return DenseRetriever(docs, torch_threads=DENSE_TORCH_THREADS)
    raise ValueError(kind)


def evaluate(retriever: Retriever, tasks: list, kmax: int) -> tuple[dict[str, float], float, list[list[str]]]:
    hits_per_q: list[list[str]] = []
    titles_per_q: list[list[str]] = []
    retriever.search([tasks[0].question], kmax)  # warm-up (JIT, caches)
    t0 = time.perf_counter()
    for task in tasks:
        hits = retriever.search([task.question], kmax)[0]
        hits_per_q.append([p.id for p in hits])
        titles_per_q.append([p.title for p in hits])
    elapsed = time.perf_counter() - t0
    recall = {}
    for k in KS:
        vals = []
        for task, titles in zip(tasks, titles_per_q):
            gold = set(task.supporting_titles)
            if gold:
                vals.append(len(gold & set(titles[:k])) / len(gold))
        recall[f"recall@{k}"] = sum(vals) / len(vals)
    return recall, len(tasks) / elapsed, hits_per_q


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", type=Path, default=default_data_dir())
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--retrievers", default="bm25s,pyserini,dense")
    ap.add_argument("--dense-datasets", default="musique", help="comma list or 'all'")
    ap.add_argument("--skip-dense", action="store_true")
    ap.add_argument("--limit", type=int, default=None, help="questions per dataset")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "retrieval.json")
    args = ap.parse_args()

    if not args.data_dir.is_dir():
        print(f"no data directory at {args.data_dir} (set AGENT_GYM_SHARED_DATA)", file=sys.stderr)
        return 2
    kinds = [k for k in args.retrievers.split(",") if k and not (args.skip_dense and k == "dense")]
    dense_sets = set(DATASETS) if args.dense_datasets == "all" else set(args.dense_datasets.split(","))
    rows = []
    with tempfile.TemporaryDirectory(prefix="agent_gym_bench_") as tmp:
        for name in args.datasets.split(","):
            docs = load_corpus(args.data_dir / name / "corpus.jsonl")
            tasks = load_qa(name, args.data_dir / name / "dev_sample.jsonl", limit=args.limit)
            ids_by_kind: dict[str, list[list[str]]] = {}
            for kind in kinds:
                if kind == "dense" and name not in dense_sets:
                    continue
                t0 = time.perf_counter()
                retriever = build(kind, docs, Path(tmp) / name)
                build_s = time.perf_counter() - t0
                recall, qps, ids = evaluate(retriever, tasks, max(KS))
                ids_by_kind[kind] = ids
                row = {
                    "dataset": name,
                    "retriever": kind,
                    "docs": len(docs),
                    "questions": len(tasks),
                    **recall,
                    "qps": qps,
                    "build_s": build_s,
                }
                if kind == "dense":
                    row["cached_embeddings"] = retriever.loaded_from_cache
                rows.append(row)
                print(json.dumps(row), flush=True)
            if "bm25s" in ids_by_kind and "pyserini" in ids_by_kind:
                a, b = ids_by_kind["bm25s"], ids_by_kind["pyserini"]
                overlap = sum(len(set(x) & set(y)) / 10 for x, y in zip(a, b)) / len(a)
                for row in rows:
                    if row["dataset"] == name and row["retriever"] == "bm25s":
                        row["overlap@10_vs_pyserini"] = overlap

    print()
    header = f"{'dataset':16} {'retriever':9} {'docs':>6} {'qs':>4} {'R@1':>6} {'R@5':>6} {'R@10':>6} {'qps':>9} {'build_s':>8}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['dataset']:16} {r['retriever']:9} {r['docs']:6d} {r['questions']:4d} "
            f"{100 * r['recall@1']:6.1f} {100 * r['recall@5']:6.1f} {100 * r['recall@10']:6.1f} "
            f"{r['qps']:9.1f} {r['build_s']:8.1f}"
        )
    targets = []
    for name in args.datasets.split(","):
        by = {r["retriever"]: r for r in rows if r["dataset"] == name}
        if "bm25s" in by and "pyserini" in by:
            d = 100 * (by["bm25s"]["recall@5"] - by["pyserini"]["recall@5"])
            ratio = by["bm25s"]["qps"] / by["pyserini"]["qps"]
            targets.append(
                {
                    "dataset": name,
                    "recall@5_diff_points": d,
                    "qps_ratio": ratio,
                    "recall_target_met": abs(d) <= 1.0,
                    "speed_target_met": ratio >= 5.0,
                }
            )
            print(
                f"{name}: bm25s - pyserini recall@5 = {d:+.2f} points; qps ratio = {ratio:.1f}x; "
                f"overlap@10 = {by['bm25s'].get('overlap@10_vs_pyserini', float('nan')):.3f}"
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "load_avg_at_end": os.getloadavg(),
        "dense_torch_threads": DENSE_TORCH_THREADS,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    result = {"meta": meta, "rows": rows, "targets": targets}
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")
    write_raw(__file__, result, outputs=[args.out])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
