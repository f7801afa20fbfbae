"""MuSiQue-Ans v1.0 (Trivedi et al., 2022; CC BY 4.0).

Layouts read (detected per file from its first row):
- official `musique_ans_v1.0_{dev,train}.jsonl` (from `musique_v1.0.zip`): `id, paragraphs
  [{idx, title, paragraph_text, is_supporting}], question, question_decomposition, answer,
  answer_aliases, answerable` (the Hugging Face copies use the same rows);
- the normalized JSONL (see `agent_gym.datasets.base`).

The task type is the hop pattern taken from the id prefix (`2hop`, `3hop1`, `4hop3`, ...).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .base import (
    DatasetSpec,
    QATask,
    RowRef,
    Source,
    clean_text,
    gold_aliases,
    gold_answer,
    parse_rows,
    register_dataset,
    unique,
)

_ZIP_URL = (
    "https://drive.usercontent.google.com/download?id=1tGdADlNjWFaHLeZZGShh2IRcpO6Lv24h&export=download&confirm=t"
)
_ZIP = "musique_v1.0.zip"


def _paragraphs(row: dict[str, Any], ref: RowRef) -> list[dict[str, Any]]:
    raw = ref.get(row, "paragraphs")
    if not isinstance(raw, list):
        raise ref.error("paragraphs", f"must be a list of {{idx, title, paragraph_text}}, got {type(raw).__name__}")
    for i, p in enumerate(raw):
        key = f"paragraphs[{i}]"
        if not isinstance(p, dict):
            raise ref.error(key, f"must be an object {{idx, title, paragraph_text}}, got {p!r:.60}")
        for k in ("title", "paragraph_text"):
            if not isinstance(p.get(k), str):
                raise ref.error(f"{key}.{k}", f"must be a string, got {p.get(k)!r:.60}")
        if not isinstance(p.get("idx", 0), int):
            raise ref.error(f"{key}.idx", f"must be an integer, got {p.get('idx')!r:.60}")
    return sorted(raw, key=lambda p: p.get("idx", 0))


def task_from_musique_row(row: dict[str, Any], index: int, prefix: str, ref: RowRef | None = None) -> QATask:
    """An official MuSiQue row -> QATask; a missing or malformed key raises
    `DatasetFormatError` naming the file, the row and the key."""
    ref = ref or RowRef("<rows>", f"index {index}")
    paragraphs = _paragraphs(row, ref)
    known = {"id", "question", "answer", "answer_aliases", "paragraphs"}
    extra = {k: v for k, v in row.items() if k not in known}
    extra["supporting_paragraph_idx"] = [p.get("idx", 0) for p in paragraphs if p.get("is_supporting")]
    task_id = str(row.get("id") or f"{prefix}-{index}")
    question = ref.get(row, "question")
    if not isinstance(question, str) or not question.strip():
        raise ref.error("question", f"must be a non-empty string, got {question!r}")
    answer = gold_answer(ref.get(row, "answer"), ref, "answer")
    return QATask(
        id=task_id,
        question=question,
        answer=answer,
        aliases=[a for a in gold_aliases(row.get("answer_aliases"), ref, "answer_aliases") if a != answer],
        supporting_titles=unique(p["title"] for p in paragraphs if p.get("is_supporting")),
        context=[{"title": p["title"], "text": clean_text(p["paragraph_text"])} for p in paragraphs],
        type=task_id.split("__", 1)[0] if "__" in task_id else "",
        extra=extra,
    )


def parse_musique(rows: list[dict[str, Any]], split: str, path: Path) -> list[QATask]:
    return parse_rows(rows, path, lambda r, i, ref: task_from_musique_row(r, i, f"musique-{split}", ref))


SPEC = register_dataset(
    DatasetSpec(
        name="musique",
        parse=parse_musique,
        sources={
            split: Source(_ZIP_URL, f"musique_ans_v1.0_{split}.jsonl", archive=_ZIP) for split in ("dev", "train")
        },
        local_names={"dev": ("validation.jsonl",)},
    )
)
