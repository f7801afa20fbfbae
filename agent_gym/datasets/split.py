"""A held-out part of a QA rows file that stays the same whatever else changes: each row goes to
``heldout`` or ``train`` by a hash of its id, so adding, removing or reordering rows never moves
another row across the split, and the split needs no stored list of ids.

    from agent_gym.datasets.split import is_heldout, normalized_rows
    rows = normalized_rows("hotpotqa", "dev_sample.jsonl", split="dev")
    heldout = [r for r in rows if is_heldout("hotpotqa", r["id"], 0.2)]

The hash is SHA-256 of ``"<salt><dataset>:<id>"``; its first 8 bytes read as an integer over
2**64 give a number in [0, 1), and a row is held out when it is below ``fraction``. So the split
is deterministic across machines and Python versions (no ``hash()`` randomization), the expected
held-out share is ``fraction``, and a different ``salt`` draws an independent split.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from .base import load_qa


def heldout_score(dataset: str, row_id: str, salt: str = "") -> float:
    """The row's position in [0, 1) under the hash described in the module's docstring."""
    digest = hashlib.sha256(f"{salt}{dataset}:{row_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def is_heldout(dataset: str, row_id: str, fraction: float, salt: str = "") -> bool:
    """Whether the row with this id is in the held-out part of ``fraction`` (0 <= fraction <= 1)."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"heldout fraction must be in [0, 1], got {fraction!r}")
    return heldout_score(dataset, row_id, salt) < fraction


def normalized_rows(dataset: str, path: str | os.PathLike[str], split: str = "dev") -> list[dict[str, Any]]:
    """Every row of ``path`` (any layout ``load_qa`` reads) in the normalized JSONL layout: the
    task's fields plus its ``extra`` fields at the top level, as the QA envs load them back."""
    rows = []
    for task in load_qa(dataset, data_path=path, split=split):
        d = task.to_dict()
        extra = d.pop("extra", {}) or {}
        rows.append({**extra, **d})
    return rows
