"""HotpotQA (Yang et al., 2018; CC BY-SA 4.0), distractor setting.

Layouts read (detected per file from its first row):
- official `hotpot_dev_distractor_v1.json` / `hotpot_train_v1.1.json`: `_id, question, answer,
  supporting_facts [[title, sent_id]], context [[title, [sentences]]], type, level`;
- Hugging Face `hotpot_qa` (config `distractor`) rows exported to JSON/JSONL: `id, ...,
  supporting_facts {title, sent_id}, context {title, sentences}`;
- the normalized JSONL (see `agent_gym.datasets.base`).

HotpotQA has no answer aliases. Sentences keep their leading space in the source, so a
paragraph's text is their plain concatenation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .base import (
    DatasetSpec,
    QATask,
    RowRef,
    Source,
    gold_answer,
    parse_context,
    parse_rows,
    parse_supporting_facts,
    register_dataset,
    unique,
)

_BASE_URL = "http://curtis.ml.cmu.edu/datasets/hotpot/"


def task_from_hotpot_row(row: dict[str, Any], index: int, prefix: str, ref: RowRef | None = None) -> QATask:
    """A HotpotQA-style row (official or HF layout) -> QATask. Shared with 2WikiMultiHopQA.

    A missing or malformed key raises `DatasetFormatError` naming the file, the row and the key.
    """
    ref = ref or RowRef("<rows>", f"index {index}")
    facts = parse_supporting_facts(ref.get(row, "supporting_facts"), ref)
    known = {"_id", "id", "question", "answer", "supporting_facts", "context", "type"}
    extra = {k: v for k, v in row.items() if k not in known}
    extra["supporting_facts"] = facts
    question = ref.get(row, "question")
    if not isinstance(question, str) or not question.strip():
        raise ref.error("question", f"must be a non-empty string, got {question!r}")
    return QATask(
        id=str(row.get("_id") or row.get("id") or f"{prefix}-{index}"),
        question=question,
        answer=gold_answer(ref.get(row, "answer"), ref, "answer"),
        aliases=[],
        supporting_titles=unique(t for t, _ in facts),
        context=parse_context(ref.get(row, "context"), ref),
        type=str(row.get("type") or ""),
        extra=extra,
    )


def parse_hotpotqa(rows: list[dict[str, Any]], split: str, path: Path) -> list[QATask]:
    return parse_rows(rows, path, lambda r, i, ref: task_from_hotpot_row(r, i, f"hotpotqa-{split}", ref))


SPEC = register_dataset(
    DatasetSpec(
        name="hotpotqa",
        parse=parse_hotpotqa,
        sources={
            "dev": Source(_BASE_URL + "hotpot_dev_distractor_v1.json", "hotpot_dev_distractor_v1.json"),
            "train": Source(_BASE_URL + "hotpot_train_v1.1.json", "hotpot_train_v1.1.json"),
        },
        local_names={"dev": ("validation.jsonl", "validation.json")},
    )
)
