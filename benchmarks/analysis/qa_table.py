"""The paper's Table 2 layout from evaluation files: EM and F1 per method and dataset with 95%
bootstrap intervals over rows, each method's ratio to a baseline, paired tests between methods on
the same rows, and the agent's behaviour (answered, valid calls, gold in what it retrieved).

    python benchmarks/analysis/qa_table.py --spec benchmarks/analysis/tables/smollm2_qa.yaml --out runs/qa_table

The spec (YAML) names the rows and, per method, one episode file per dataset: ``trajectories.jsonl``
of ``trainers/evaluate.py --out`` or ``<condition>__<dataset>.jsonl`` of
``benchmarks/experiments/smollm_baselines.py``; both hold one record per episode with ``task_id`` and
``answer_scores``::

    rows: {hotpotqa: runs/qa_split/hotpotqa_heldout.jsonl, ...}   # the gold answers, for gold_in_retrieved
    baseline: naive_rag                # the ratios' denominator
    pairs: [[rl_scaffold, base_scaffold], [rl_scaffold, naive_rag]]   # paired tests (a against b)
    methods:
      naive_rag: {label: Naive RAG, files: {hotpotqa: runs/.../naiverag-text__hotpotqa.jsonl, ...}}

Rows are matched by ``task_id``; every method must hold the same rows of a dataset (else it fails
naming the difference). A method without a file for a dataset shows "-". Writes ``table.md`` and
``table.json`` (every figure, with the command, the date and the load average) under ``--out``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from agent_gym.provenance import write_raw
from agent_gym.scoring import normalize_answer
from agent_gym.stats import bootstrap_ci, paired_test

DATASET_NAMES = {"hotpotqa": "HotpotQA", "2wikimultihopqa": "2Wiki", "musique": "MuSiQue"}


def load_records(path: str | Path) -> dict[str, dict[str, Any]]:
    """task_id -> the episode record."""
    out = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                out[str(r["task_id"])] = r
    if not out:
        raise ValueError(f"{path}: no episode records")
    return out


def load_golds(path: str | Path) -> dict[str, list[str]]:
    """task_id -> the gold answer and its aliases, from a normalized rows file."""
    golds = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                golds[str(r["id"])] = [r["answer"], *(r.get("aliases") or [])]
    return golds


def retrieved_text(rec: dict[str, Any], tok: Any) -> str:
    """What the env showed the agent after the prompt (its search results), decoded."""
    n = rec["prompt_len"]
    return tok.decode(
        [t for t, m in zip(rec["token_ids"][n:], rec["loss_mask"][n:]) if not m], skip_special_tokens=True
    )


def behaviour(recs: list[dict[str, Any]], golds: dict[str, list[str]] | None, tok: Any) -> dict[str, float | None]:
    calls = sum(sum(r["call_statuses"].values()) for r in recs)
    ok = sum(r["call_statuses"].get("ok", 0) for r in recs)
    out: dict[str, float | None] = {
        "answered": sum(r["answer"] is not None for r in recs) / len(recs),
        "valid_call_rate": ok / calls if calls else None,
        "calls_per_episode": calls / len(recs),
        "gold_in_retrieved": None,
    }
    if golds is not None and tok is not None and calls:
        hits = 0
        for r in recs:
            text = normalize_answer(retrieved_text(r, tok))
            hits += any(normalize_answer(g) and normalize_answer(g) in text for g in golds.get(r["task_id"], []))
        out["gold_in_retrieved"] = hits / len(recs)
    return out


def build(spec: dict[str, Any], tok: Any = None) -> dict[str, Any]:
    methods = spec["methods"]
    rows = spec.get("rows", {})
    datasets = [d for d in DATASET_NAMES if any(d in m.get("files", {}) for m in methods.values())]
    golds = {d: load_golds(rows[d]) for d in datasets if d in rows}
    cells: dict[str, dict[str, Any]] = {}
    missing: list[str] = []
    scores: dict[tuple[str, str], dict[str, list[float]]] = {}
    for name, m in methods.items():
        cells[name] = {}
        for d in datasets:
            path = m.get("files", {}).get(d)
            if path is None:
                continue
            if not Path(path).is_file():  # not evaluated (yet): a "-" in the table, listed under "missing"
                missing.append(str(path))
                continue
            recs = load_records(path)
            ids = sorted(recs)
            em = [float(recs[i]["answer_scores"].get("em", 0.0)) for i in ids]
            f1 = [float(recs[i]["answer_scores"].get("f1", 0.0)) for i in ids]
            scores[(name, d)] = {"ids": ids, "em": em, "f1": f1}
            cells[name][d] = {
                "rows": len(ids),
                "em": bootstrap_ci(em),
                "f1": bootstrap_ci(f1),
                **behaviour([recs[i] for i in ids], golds.get(d), tok),
                "file": str(path),
            }
    base = spec.get("baseline")
    for name in methods:
        for d, c in cells[name].items():
            b = cells.get(base, {}).get(d)
            if b is not None:
                c["em_ratio"] = c["em"][0] / b["em"][0] if b["em"][0] > 0 else None
                c["f1_ratio"] = c["f1"][0] / b["f1"][0] if b["f1"][0] > 0 else None
    pairs = []
    for a, b in spec.get("pairs", []):
        for d in datasets:
            if (a, d) not in scores or (b, d) not in scores:
                continue
            sa, sb = scores[(a, d)], scores[(b, d)]
            if sa["ids"] != sb["ids"]:
                diff = sorted(set(sa["ids"]) ^ set(sb["ids"]))
                raise ValueError(
                    f"{a} and {b} hold different {d} rows ({len(diff)} differ, e.g. {diff[:3]}); "
                    "evaluate both on the same rows"
                )
            pairs.append(
                {
                    "a": a,
                    "b": b,
                    "dataset": d,
                    "em": paired_test(sa["em"], sb["em"]),
                    "f1": paired_test(sa["f1"], sb["f1"]),
                }
            )
    return {"datasets": datasets, "cells": cells, "pairs": pairs, "baseline": base, "missing": missing}


def _ci(v: tuple[float, float, float]) -> str:
    return f"{v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}]"


def markdown(table: dict[str, Any], methods: dict[str, Any]) -> str:
    ds = table["datasets"]
    head = "| method | " + " | ".join(f"{DATASET_NAMES[d]} EM [95% CI] | F1 [95% CI]" for d in ds) + " |"
    lines = [head, "|---|" + "---|---|" * len(ds)]
    for name, m in methods.items():
        row = [m.get("label", name)]
        for d in ds:
            c = table["cells"][name].get(d)
            row += ["-", "-"] if c is None else [_ci(c["em"]), _ci(c["f1"])]
        lines.append("| " + " | ".join(row) + " |")
    if table["baseline"]:
        lines += [
            "",
            f"Ratio to {methods[table['baseline']].get('label', table['baseline'])} (EM / F1):",
            "",
            "| method | " + " | ".join(DATASET_NAMES[d] for d in ds) + " |",
            "|---|" + "---|" * len(ds),
        ]
        for name, m in methods.items():
            row = [m.get("label", name)]
            for d in ds:
                c = table["cells"][name].get(d)
                if c is None or "em_ratio" not in c:
                    row.append("-")
                else:
                    fmt = lambda r: "-" if r is None else f"{r:.2f}x"  # noqa: E731
                    row.append(f"{fmt(c['em_ratio'])} / {fmt(c['f1_ratio'])}")
            lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        "Behaviour (answered / valid-call rate / gold answer in the retrieved passages):",
        "",
        "| method | " + " | ".join(DATASET_NAMES[d] for d in ds) + " |",
        "|---|" + "---|" * len(ds),
    ]
    for name, m in methods.items():
        row = [m.get("label", name)]
        for d in ds:
            c = table["cells"][name].get(d)
            if c is None:
                row.append("-")
            else:
                f = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
                row.append(f"{f(c['answered'])} / {f(c['valid_call_rate'])} / {f(c['gold_in_retrieved'])}")
        lines.append("| " + " | ".join(row) + " |")
    if table["pairs"]:
        lines += [
            "",
            "Paired tests on the same rows (a better / b better; exact sign test, McNemar's on EM; "
            "mean difference a - b with its 95% paired bootstrap interval):",
            "",
            "| a vs b | dataset | EM: a / b rows, p | EM diff [95% CI] | F1: a / b rows, p | F1 diff [95% CI] |",
            "|---|---|---|---|---|---|",
        ]
        for p in table["pairs"]:
            e, f = p["em"], p["f1"]
            la, lb = methods[p["a"]].get("label", p["a"]), methods[p["b"]].get("label", p["b"])
            lines.append(
                f"| {la} vs {lb} | {DATASET_NAMES[p['dataset']]} | {e['a_better']} / {e['b_better']}, "
                f"p = {e['sign_test_p']:.3g} | {e['diff']:+.3f} [{e['diff_low']:+.3f}, {e['diff_high']:+.3f}] | "
                f"{f['a_better']} / {f['b_better']}, p = {f['sign_test_p']:.3g} | "
                f"{f['diff']:+.3f} [{f['diff_low']:+.3f}, {f['diff_high']:+.3f}] |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", required=True, help="YAML: rows, baseline, pairs, methods (see the module docstring)")
    ap.add_argument("--out", default="runs/qa_table")
    ap.add_argument(
        "--tokenizer",
        default="smollm2-135m-instruct",
        help="model name whose tokenizer decodes the episodes (for gold_in_retrieved); 'none' to skip",
    )
    args = ap.parse_args(argv)
    spec = yaml.safe_load(Path(args.spec).read_text())
    tok = None
    if args.tokenizer != "none":
        from trainers.config import ModelConfig
        from trainers.models import load_tokenizer_for

        tok = load_tokenizer_for(ModelConfig(name=args.tokenizer))
    table = build(spec, tok)
    md = markdown(table, spec["methods"])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(md)
    meta = {
        "command": " ".join(sys.argv),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "loadavg": os.getloadavg(),
        "spec": spec,
    }
    (out / "table.json").write_text(json.dumps({**meta, **table}, indent=1))
    write_raw(__file__, {**meta, **table, "table_md": md}, argv=argv, outputs=[out / "table.md", out / "table.json"])
    print(md)
    for path in table["missing"]:
        print(f"not evaluated yet (shown as -): {path}")
    print(f"saved {out / 'table.md'} and {out / 'table.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
