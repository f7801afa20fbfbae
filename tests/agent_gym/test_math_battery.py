"""The hand-labelled battery of (answer, gold) pairs (tests/fixtures/math_battery.jsonl), each labelled
by mathematical truth, through Math-v0's checker (:func:`agent_gym.math_answer.check_answer`, worker
process included). The whole battery takes about 30 s here at load 10, over the test budget, so the test
takes a fixed third of it (every third row: each category, both labels, at least 2 of each);
benchmarks/math_verifier.py runs all of it, through the old checker and raw math-verify too, with
timings. The known false negative is tested on its own, as an expected failure."""

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
SUBSET = ROWS[::3] + [r for r in ROWS[1::3] + ROWS[2::3] if r["id"] in KNOWN_FALSE_NEGATIVES]


def test_the_battery_covers_every_answer_type_both_ways():
    assert len(ROWS) >= 300 and len({r["id"] for r in ROWS}) == len(ROWS)
    kinds = Counter((r["category"], r["correct"]) for r in ROWS)
    categories = {"integers", "large_integers", "fractions", "radicals", "pi_e", "infinity", "intervals", "sets",
                  "tuples", "matrices", "equations", "units", "text", "percentages", "degrees"}
    assert {c for c, _ in kinds} == categories
    assert all(kinds[(c, label)] >= 5 for c in categories for label in (True, False)), kinds
    part = Counter((r["category"], r["correct"]) for r in SUBSET)
    assert all(part[(c, label)] >= 2 for c in categories for label in (True, False)), part


@pytest.mark.timeout(300)
@pytest.mark.parametrize("row", [
    pytest.param(r, id=r["id"], marks=[pytest.mark.xfail(reason=KNOWN_FALSE_NEGATIVES[r["id"]], strict=True)]
                 if r["id"] in KNOWN_FALSE_NEGATIVES else []) for r in SUBSET])
def test_battery(row):
    ok, how = check_answer(row["pred"], row["gold"], timeout=30.0)  # generous: verdicts, not speed, are tested here
    assert ok is row["correct"], f"{row['pred']!r} vs gold {row['gold']!r}: {how}"
