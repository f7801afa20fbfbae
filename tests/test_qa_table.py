"""benchmarks/analysis/qa_table.py end to end on hand-made episode files: means, intervals, ratios
to the baseline and the paired tests match values worked by hand; rows that differ between two
methods are refused; a method not evaluated yet shows as missing."""

import json
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def records(path, rows):
    with open(path, "w") as f:
        for tid, em, f1, calls in rows:
            f.write(
                json.dumps(
                    {
                        "task_id": tid,
                        "answer_scores": {"em": em, "f1": f1},
                        "answer": "x",
                        "call_statuses": {"ok": calls} if calls else {},
                        "prompt_len": 0,
                        "token_ids": [],
                        "loss_mask": [],
                    }
                )
                + "\n"
            )


def run(tmp_path, spec):
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    return subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "analysis" / "qa_table.py"),
            "--spec",
            str(tmp_path / "spec.yaml"),
            "--out",
            str(tmp_path / "out"),
            "--tokenizer",
            "none",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )


def test_table_by_hand(tmp_path):
    records(tmp_path / "a.jsonl", [("q1", 1, 1.0, 2), ("q2", 1, 0.5, 2), ("q3", 0, 0.2, 1), ("q4", 0, 0.0, 2)])
    records(tmp_path / "b.jsonl", [("q4", 0, 0.0, 0), ("q3", 0, 0.1, 0), ("q2", 0, 0.5, 0), ("q1", 1, 1.0, 0)])
    spec = {
        "baseline": "b",
        "pairs": [["a", "b"]],
        "methods": {
            "a": {"label": "A", "files": {"hotpotqa": str(tmp_path / "a.jsonl")}},
            "b": {
                "label": "B",
                "files": {"hotpotqa": str(tmp_path / "b.jsonl"), "musique": str(tmp_path / "none.jsonl")},
            },
        },
    }
    r = run(tmp_path, spec)
    assert r.returncode == 0, r.stderr
    t = json.loads((tmp_path / "out" / "table.json").read_text())
    a, b = t["cells"]["a"]["hotpotqa"], t["cells"]["b"]["hotpotqa"]
    assert a["rows"] == 4 and a["em"][0] == 0.5 and a["f1"][0] == 1.7 / 4 and b["em"][0] == 0.25
    assert a["em"][1] <= 0.5 <= a["em"][2] and a["em_ratio"] == 2.0 and a["f1_ratio"] == 1.7 / 1.6
    assert a["valid_call_rate"] == 1.0 and a["calls_per_episode"] == 7 / 4 and b["valid_call_rate"] is None
    (p,) = t["pairs"]
    assert (p["em"]["a_better"], p["em"]["b_better"], p["em"]["sign_test_p"]) == (1, 0, 1.0)
    assert (p["f1"]["a_better"], p["f1"]["b_better"]) == (1, 0) and abs(p["f1"]["diff"] - 0.025) < 1e-12
    assert (
        t["missing"] == [str(tmp_path / "none.jsonl")]
        and "| A | 0.500 [" in (tmp_path / "out" / "table.md").read_text()
    )


def test_methods_on_different_rows_are_refused(tmp_path):
    records(tmp_path / "a.jsonl", [("q1", 1, 1.0, 1)])
    records(tmp_path / "b.jsonl", [("q2", 1, 1.0, 1)])
    spec = {
        "pairs": [["a", "b"]],
        "methods": {
            "a": {"files": {"hotpotqa": str(tmp_path / "a.jsonl")}},
            "b": {"files": {"hotpotqa": str(tmp_path / "b.jsonl")}},
        },
    }
    r = run(tmp_path, spec)
    assert r.returncode != 0 and "hold different hotpotqa rows" in r.stderr
