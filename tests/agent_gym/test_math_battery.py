"""The hand-labelled battery of (answer, gold) pairs (tests/fixtures/math_battery.jsonl), each labelled
by mathematical truth, through Math-v0's checker (:func:`agent_gym.math_answer.check_answer`, worker
process included). Every row runs (about 30 s here at load 10): each wrong answer must be refused
and each right one accepted, so the figures docs/results.md gives for this checker (0 false
positives, 1 false negative among 404 rows) are what the suite enforces; the one known false
negative is a strict expected failure. benchmarks/verdicts/math_verifier.py runs the battery through the old
checker and raw math-verify too, with timings."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from agent_gym.math_answer import check_answer

BATTERY = Path(__file__).resolve().parents[1] / "fixtures" / "math_battery.jsonl"
ROWS = [json.loads(line) for line in BATTERY.read_text().splitlines() if line.strip()]

KNOWN_FALSE_NEGATIVES = {  # id -> why
    "text-14": "a run of letters is read as a word (so that 'dynamo' is not 'Monday'), so the product ab is not ba",
}
DOCUMENTED = {"rows": 404, "false_positives": 0, "false_negatives": 1}  # docs/results.md, "Math answer checking"


def test_the_battery_covers_every_answer_type_both_ways():
    assert len(ROWS) >= 300 and len({r["id"] for r in ROWS}) == len(ROWS)
    kinds = Counter((r["category"], r["correct"]) for r in ROWS)
    categories = {
        "integers",
        "large_integers",
        "fractions",
        "radicals",
        "pi_e",
        "infinity",
        "intervals",
        "sets",
        "tuples",
        "matrices",
        "equations",
        "units",
        "text",
        "percentages",
        "degrees",
    }
    assert {c for c, _ in kinds} == categories
    assert all(kinds[(c, label)] >= 5 for c in categories for label in (True, False)), kinds
    # With every row below passing, the checker's errors are exactly the known false negatives.
    assert len(ROWS) == DOCUMENTED["rows"] and len(KNOWN_FALSE_NEGATIVES) == DOCUMENTED["false_negatives"]
    assert all(r["correct"] for r in ROWS if r["id"] in KNOWN_FALSE_NEGATIVES) and DOCUMENTED["false_positives"] == 0


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "row",
    [
        pytest.param(
            r,
            id=r["id"],
            marks=[pytest.mark.xfail(reason=KNOWN_FALSE_NEGATIVES[r["id"]], strict=True)]
            if r["id"] in KNOWN_FALSE_NEGATIVES
            else [],
        )
        for r in ROWS
    ],
)
def test_battery(row):
    ok, how = check_answer(row["pred"], row["gold"], timeout=30.0)  # generous: verdicts, not speed, are tested here
    assert ok is row["correct"], f"{row['pred']!r} vs gold {row['gold']!r}: {how}"
