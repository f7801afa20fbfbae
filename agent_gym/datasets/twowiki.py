"""2WikiMultiHopQA (Ho et al., 2020; Apache-2.0).

Layouts read (detected per file from its first row):
- official `dev.json` / `train.json` (from `data_ids_april7.zip`): `_id, type, question,
  context [[title, [sentences]]], supporting_facts [[title, sent_id]], evidences, answer`,
  plus `answer_id` in the `ids` release;
- Hugging Face exports with `context {title, sentences|content}` and dict `supporting_facts`;
- the normalized JSONL (see `agent_gym.datasets.base`).

Aliases: the official release ships `id_aliases.json` (one JSON object per line:
`{"Q_id", "aliases", "demonyms"}`), which its evaluation script uses. When that file sits next
to the data file, the aliases and demonyms of the row's `answer_id` become the task's aliases.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .base import (
    DatasetSpec,
    QATask,
    Source,
    gold_aliases,
    parse_rows,
    read_rows,
    register_dataset,
    row_ref,
)
from .hotpotqa import task_from_hotpot_row

_ZIP_URL = "https://www.dropbox.com/s/ms2m13252h6xubs/data_ids_april7.zip?dl=1"
_ZIP = "data_ids_april7.zip"
ALIASES_FILE = "id_aliases.json"


def _read_aliases(path: Path) -> dict[str, list[str]]:
    """``Q_id`` -> its aliases and demonyms (what the official script adds to the gold). A bad
    row raises `DatasetFormatError` naming the file, the line and the key."""
    out: dict[str, list[str]] = {}
    if not path.is_file():
        return out
    rows = read_rows(path)
    for i, row in enumerate(rows):
        ref = row_ref(rows, i, path)
        qid = ref.get(row, "Q_id")
        out[str(qid)] = gold_aliases(row.get("aliases"), ref, "aliases") + gold_aliases(
            row.get("demonyms"), ref, "demonyms"
        )
    return out


def parse_twowiki(rows: list[dict[str, Any]], split: str, path: Path) -> list[QATask]:
    aliases: dict[str, list[str]] | None = None

    def convert(row: dict[str, Any], i: int, ref: Any) -> QATask:
        nonlocal aliases
        if aliases is None:
            aliases = _read_aliases(path.parent / ALIASES_FILE)
        task = task_from_hotpot_row(row, i, f"2wikimultihopqa-{split}", ref)
        extra_aliases = aliases.get(str(row.get("answer_id", "")), [])
        task.aliases = [a for a in dict.fromkeys(extra_aliases) if a != task.answer]
        return task

    return parse_rows(rows, path, convert)


SPEC = register_dataset(
    DatasetSpec(
        name="2wikimultihopqa",
        parse=parse_twowiki,
        sources={
            split: Source(_ZIP_URL, f"{split}.json", archive=_ZIP, side_files=(ALIASES_FILE,))
            for split in ("dev", "train")
        },
        local_names={"dev": ("validation.jsonl",)},
    )
)
