"""Multi-hop QA tasks and corpora: the `QATask` record, the loader registry, file helpers.

Every dataset module turns its source rows into `QATask`s. A loader reads, from the same
`data_path`, whichever layout it finds (detected from the content, not the file name):

- the official release file (e.g. `hotpot_dev_distractor_v1.json`);
- rows exported from the Hugging Face dataset (`to_json`, as a JSON array or JSON lines);
- the normalized JSONL of this project (`id, question, answer, aliases, supporting_titles,
  context [{title, text}], type, ...`), as in `shared/data/*/dev_sample.jsonl`.

With `data_path=None` the official file is downloaded once into the cache
(`$AGENT_GYM_CACHE`, default `~/.cache/agent_gym`) under `datasets/<name>/`. Offline, that fails
with a `DatasetDownloadError` that says to pass `data_path=`.

Corpus rows are `{id, title, text, contents}` with `contents = '"' + title + '"\\n' + text`,
the layout of FlashRAG / Search-R1 (wiki-18) corpora; `load_corpus` also accepts rows that only
carry `contents` (or only `title` and `text`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import reprlib
import shutil
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agent_gym.cli_errors import ENV_KWARGS_FLAG, UserError

__all__ = [
    "DATASETS",
    "DataPathError",
    "DatasetDownloadError",
    "DatasetFormatError",
    "QATask",
    "Source",
    "cache_root",
    "corpus_fingerprint",
    "corpus_from_tasks",
    "join_sentences",
    "load_corpus",
    "load_qa",
    "RowRef",
    "Rows",
    "answer_string",
    "gold_aliases",
    "gold_answer",
    "read_rows",
    "register_dataset",
    "row_ref",
    "string_list",
    "resolve_data_file",
    "write_corpus",
]


@dataclass
class QATask:
    """One question with its gold answers and the paragraphs that come with it."""

    id: str
    question: str
    answer: str
    aliases: list[str] = field(default_factory=list)
    supporting_titles: list[str] = field(default_factory=list)
    """Titles of the gold (supporting) paragraphs, in source order, without duplicates."""
    context: list[dict[str, str]] = field(default_factory=list)
    """The paragraphs shipped with the question (gold + distractors): `{title, text}` each."""
    type: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    """Source-specific fields kept as they were (supporting_facts, level, evidences, ...)."""

    @property
    def golds(self) -> list[str]:
        """The answer followed by its aliases, without duplicates: what scorers take the max over."""
        return list(dict.fromkeys([self.answer, *self.aliases]))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class DatasetDownloadError(UserError, RuntimeError):
    """The official file could not be fetched (no network, moved URL, ...). Its message tells a
    Python user what to pass (``load_qa(name, data_path=...)``); ``for_command_line`` tells a
    command-line user the flag (``--env-kwargs '{data_path: ...}'``)."""

    def __init__(
        self,
        message: str,
        dataset: str | None = None,
        filename: str | None = None,
        url: str | None = None,
        reason: str | None = None,
    ):
        super().__init__(message)
        self.dataset, self.filename, self.url, self.reason = dataset, filename, url, reason

    def for_command_line(self, env_kwargs: str = ENV_KWARGS_FLAG) -> str:
        if self.dataset is None:
            return str(self)
        return (
            f"{self.dataset}: could not download {self.filename} from {self.url} ({self.reason}); offline, "
            f"download it yourself and pass {env_kwargs.format('data_path: FILE_OR_DIR, corpus_path: CORPUS.jsonl')}"
            " (corpus_path is optional: the retriever's corpus)"
        )


class DataPathError(UserError, FileNotFoundError):
    """A ``data_path`` or ``corpus_path`` (``key``) that names no file: a ``FileNotFoundError`` whose
    command-line message says the env argument to fix (``--env-kwargs '{data_path: ...}'``)."""

    def __init__(self, message: str, key: str = "data_path"):
        super().__init__(message)
        self.key = key

    def for_command_line(self, env_kwargs: str = ENV_KWARGS_FLAG) -> str:
        return f"{self}; pass an existing file or directory: {env_kwargs.format(self.key + ': PATH')}"


class DatasetFormatError(UserError, ValueError):
    """A data or corpus file that cannot be read as expected. The message names the file, the
    row (``line N`` of a JSON-lines file, ``index N`` of a JSON array) and the key."""


@dataclass(frozen=True)
class RowRef:
    """Where one row came from: the file and ``line N`` (JSON lines) or ``index N`` (array).

    ``error(key, problem)`` is the one way loaders report a bad row.
    """

    path: str
    where: str

    def error(self, key: str | None, problem: str) -> DatasetFormatError:
        at = f"{self.path}, {self.where}" + (f", key {key!r}" if key is not None else "")
        return DatasetFormatError(f"{at}: {problem}")

    def get(self, row: Mapping[str, Any], key: str) -> Any:
        """``row[key]``; a missing key raises naming the file, row and key."""
        if key not in row:
            raise self.error(key, f"missing (the row has keys {sorted(row)})")
        return row[key]


class Rows(list):
    """The rows of a data file (a plain list of dicts) that remember where each came from."""

    def __init__(self, rows: Iterable[dict[str, Any]], path: str, wheres: Sequence[str]):
        super().__init__(rows)
        self.path = path
        self.wheres = list(wheres)


def row_ref(rows: Sequence[Any], index: int, path: str | os.PathLike[str] | None = None) -> RowRef:
    """The `RowRef` of ``rows[index]``: its line or index when ``rows`` came from `read_rows`."""
    if isinstance(rows, Rows) and index < len(rows.wheres):
        return RowRef(rows.path, rows.wheres[index])
    return RowRef(str(path) if path is not None else "<rows>", f"index {index}")


def answer_string(value: Any, ref: RowRef, key: str) -> str:
    """A gold answer as a string. An int becomes its decimal string (a deliberate choice: a year
    or a count); None, a list, a float, a bool or anything else raises naming file, row, key,
    since ``str()`` would make golds such as ``"None"`` or ``"['a', 'b']"``."""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if value is None:
        raise ref.error(key, "is null; every question needs a gold answer string")
    if isinstance(value, (list, tuple)):
        raise ref.error(
            key, f"is a list {value!r}; give one answer string and put the other accepted answers in the aliases"
        )
    raise ref.error(key, f"must be a string, got {type(value).__name__} {value!r}")


def gold_answer(value: Any, ref: RowRef, key: str) -> str:
    """A gold answer or alias (`answer_string`) that is not blank. An empty or white-space-only
    gold normalizes to "" and so would give EM 1 to every answer that also normalizes to "" (an
    empty one, "the", "..."): it raises naming file, row and key. A gold with visible characters
    that normalizes to "" is kept: HotpotQA dev row ``5a8b3d795542997f31a41cc1`` has the real
    answer ``"!!!"`` (a band), which the official scripts score that way (see `agent_gym.scoring`)."""
    text = answer_string(value, ref, key)
    if not text.strip():
        raise ref.error(
            key,
            f'is blank ({text!r}): every answer that normalizes to "" (an empty one, "the", '
            '"...") would match it with EM 1; give the answer text or drop the row',
        )
    return text


def gold_aliases(value: Any, ref: RowRef, key: str) -> list[str]:
    """Alias answers: `string_list`, each a `gold_answer` (not blank)."""
    out = string_list(value, ref, key)
    for i, alias in enumerate(out):
        gold_answer(alias, ref, f"{key}[{i}]")
    return out


def string_list(value: Any, ref: RowRef, key: str) -> list[str]:
    """A list of strings (aliases, titles): None or missing is ``[]``; ints become strings. A
    bare string raises (splitting it would make every character an alias, and alias ``"P"``
    would then match any answer ``P``); so does any other non-list or a null item."""
    if value is None:
        return []
    if isinstance(value, str):
        raise ref.error(key, f"is the string {value!r}, expected a list of strings; write [{value!r}] for a single one")
    if not isinstance(value, (list, tuple)):
        raise ref.error(key, f"must be a list of strings, got {type(value).__name__} {value!r}")
    return [answer_string(v, ref, f"{key}[{i}]") for i, v in enumerate(value)]


def cache_root() -> Path:
    """Root of agent_gym's on-disk caches: `$AGENT_GYM_CACHE` or `~/.cache/agent_gym`."""
    env = os.environ.get("AGENT_GYM_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "agent_gym"


# ---------------------------------------------------------------------------------------------
# Registry

Loader = Callable[[Path, str, "int | None"], list[QATask]]


@dataclass(frozen=True)
class Source:
    """Where the official file for one split lives.

    `url` points at the file itself or, when `archive` names a zip, at that archive, which holds
    `filename` (matched by base name) and optionally `side_files` (e.g. 2Wiki's aliases).
    """

    url: str
    filename: str
    archive: str | None = None
    side_files: tuple[str, ...] = ()


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    parse: Callable[[list[dict[str, Any]], str, Path], list[QATask]]
    """(rows, split, path) -> tasks; the path lets a parser find side files (2Wiki aliases)."""
    sources: Mapping[str, Source]
    local_names: Mapping[str, Sequence[str]]
    """File names tried, per split, when `data_path` is a directory (after the official name)."""


DATASETS: dict[str, DatasetSpec] = {}


def register_dataset(spec: DatasetSpec) -> DatasetSpec:
    old = DATASETS.get(spec.name)
    if old is not None and old != spec:
        raise ValueError(f"dataset {spec.name!r} is already registered")
    DATASETS[spec.name] = spec
    return spec


def load_qa(
    dataset: str,
    data_path: str | os.PathLike[str] | None = None,
    split: str = "dev",
    limit: int | None = None,
) -> list[QATask]:
    """Load `split` of `dataset` as a list of `QATask`.

    `data_path` may be a file (any supported layout) or a directory that holds the official file
    name for the split, `<split>.jsonl`, or `<split>_sample.jsonl`. Without it, the official file
    is downloaded into the cache on first use.
    """
    try:
        spec = DATASETS[dataset]
    except KeyError:
        raise KeyError(f"unknown dataset {dataset!r}; valid names: {', '.join(sorted(DATASETS))}") from None
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    path = resolve_data_file(spec, data_path, split)
    rows = read_rows(path)
    if limit is not None:
        rows = Rows(rows[:limit], rows.path, rows.wheres[:limit])
    return spec.parse(rows, split, path)


def resolve_data_file(spec: DatasetSpec, data_path: str | os.PathLike[str] | None, split: str) -> Path:
    source = spec.sources.get(split)
    if data_path is None:
        if source is None:
            raise ValueError(
                f"{spec.name} has no official download for split {split!r} "
                f"(known: {', '.join(sorted(spec.sources))}); pass data_path="
            )
        return _cached_download(spec.name, source)
    path = Path(data_path).expanduser()
    if path.is_file():
        return path
    if not path.exists():
        raise DataPathError(f"{spec.name}: data_path {str(path)!r} does not exist")
    names = (
        ([source.filename] if source else [])
        + [n.format(split=split) for n in spec.local_names.get(split, ())]
        + [f"{split}.jsonl", f"{split}_sample.jsonl", f"{split}.json"]
    )
    tried = [path / n for n in dict.fromkeys(names)]
    for cand in tried:
        if cand.is_file():
            return cand
    raise DataPathError(
        f"{spec.name}: no {split!r} file in directory {str(path)!r}; tried " + ", ".join(p.name for p in tried)
    )


DOWNLOAD_TIMEOUT_S = 30.0


def _cached_download(name: str, source: Source) -> Path:
    target = cache_root() / "datasets" / name / source.filename
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        if source.archive:
            archive = target.parent / source.archive
            if not archive.is_file():
                download_file(source.url, archive)
            for side in source.side_files:
                side_target = target.parent / side
                if not side_target.is_file():
                    _extract_member(archive, side, side_target, required=False)
            _extract_member(archive, source.filename, target)
        else:
            download_file(source.url, target)
    except DatasetDownloadError as err:
        raise DatasetDownloadError(
            f"{name}: could not download {source.filename} ({err}). Offline, download it yourself "
            f"and pass data_path=<file or directory>, e.g. load_qa({name!r}, data_path=...)",
            dataset=name,
            filename=source.filename,
            url=source.url,
            reason=err.reason or str(err),
        ) from err
    return target


def download_file(url: str, dest: Path, timeout: float = DOWNLOAD_TIMEOUT_S) -> Path:
    """Stream `url` to `dest` atomically; any network failure raises DatasetDownloadError."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=dest.name, suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out:
            req = urllib.request.Request(url, headers={"User-Agent": "agent_gym"})
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                shutil.copyfileobj(resp, out, length=1 << 20)
        os.replace(tmp, dest)
    except (urllib.error.URLError, OSError, ValueError) as err:
        Path(tmp).unlink(missing_ok=True)
        raise DatasetDownloadError(f"GET {url} failed: {err}", reason=str(err)) from err
    return dest


def _extract_member(archive: Path, filename: str, target: Path, required: bool = True) -> None:
    try:
        with zipfile.ZipFile(archive) as zf:
            members = [m for m in zf.namelist() if Path(m).name == filename]
            if not members:
                if not required:
                    return
                raise DatasetDownloadError(f"{archive} holds no file named {filename}")
            with zf.open(members[0]) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out, length=1 << 20)
    except zipfile.BadZipFile as err:
        archive.unlink(missing_ok=True)
        raise DatasetDownloadError(f"{archive} is not a zip archive: {err}") from err


# ---------------------------------------------------------------------------------------------
# Reading rows


def read_rows(path: str | os.PathLike[str]) -> Rows:
    """Rows of a JSON array, a JSON object with a `data` list, or JSON lines (by content).

    Each row must be a JSON object. Invalid JSON, a truncated file or a non-object row raises
    `DatasetFormatError` naming the file and the row: ``line N`` for JSON lines, ``index N``
    for a JSON array (with the line and column of the fault).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {str(path)!r}")
    name = str(path)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    start = _NON_SPACE.search(text)
    nl = text.find("\n", start.start()) if start else -1
    first = text[start.start() : nl if nl >= 0 else len(text)].strip() if start else ""
    more_lines = nl >= 0 and _NON_SPACE.search(text, nl) is not None
    if more_lines and not _is_json_value(first):  # one (pretty-printed) JSON document
        obj = _load_json_document(text, name)
        if isinstance(obj, dict) and isinstance(obj.get("data"), list):
            rows, label = obj["data"], 'index {} of "data"'
        elif isinstance(obj, list):
            rows, label = obj, "index {}"
        else:
            rows, label = [obj], "index {}"
        wheres = [label.format(i) for i in range(len(rows))]
    else:
        rows, wheres = [], []
        for lineno, line in enumerate(text.split("\n"), 1):  # not splitlines: U+2028 may sit in a string
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise DatasetFormatError(
                    f"{name}, line {lineno}: invalid JSON at column {err.colno} ({err.msg}); "
                    "every line of a JSON-lines file must be one complete JSON object"
                ) from None
            wheres.append(f"line {lineno}")
        if len(rows) == 1 and isinstance(rows[0], dict) and isinstance(rows[0].get("data"), list):
            rows = rows[0]["data"]  # a one-line {"data": [...]}
            wheres = [f'index {i} of "data"' for i in range(len(rows))]
        elif len(rows) == 1 and isinstance(rows[0], list):
            rows = rows[0]  # a one-line JSON array
            wheres = [f"index {i}" for i in range(len(rows))]
    for row, where in zip(rows, wheres):
        if not isinstance(row, dict):
            raise RowRef(name, where).error(
                None, f"expected a JSON object (one question per row), got {type(row).__name__} {_short(row)}"
            )
    return Rows(rows, name, wheres)


_NON_SPACE = re.compile(r"\S")


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlist, _REPR.maxdict = 3, 200, 200, 8, 8


def _short(value: Any, n: int = 60) -> str:
    r = _REPR.repr(value)  # bounded: repr() of a deeply nested value raises RecursionError
    return r if len(r) <= n else r[: n - 3] + "..."


def _load_json_document(text: str, name: str) -> Any:
    """``json.loads(text)``; on a decode error, find which element of a top-level array (or of
    its ``"data"`` list) is broken and raise naming the file, that index, line and column."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        index = _failing_element(text)
        at = f"index {index}, " if index is not None else ""
        raise DatasetFormatError(
            f"{name}, {at}line {err.lineno} column {err.colno}: invalid JSON ({err.msg}); "
            "is the file truncated or not JSON?"
        ) from None


def _failing_element(text: str) -> int | None:
    """The index of the first element of the top-level array (or of the ``"data"`` array of a
    top-level object) that does not decode; None if that cannot be told."""
    dec = json.JSONDecoder()
    ws = " \t\n\r"
    i = len(text) - len(text.lstrip(ws))
    if text[i : i + 1] == "{":
        j = text.find('"data"', i)
        if j < 0:
            return None
        i = text.find("[", j)
        if i < 0:
            return None
    if text[i : i + 1] != "[":
        return None
    i += 1
    index = 0
    while True:
        while i < len(text) and text[i] in ws:
            i += 1
        if text[i : i + 1] == "]":
            return None
        try:
            _, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return index
        while i < len(text) and text[i] in ws:
            i += 1
        if text[i : i + 1] == ",":
            i += 1
            index += 1
            continue
        return index if text[i : i + 1] != "]" else None


def _is_json_value(line: str) -> bool:
    """True when the first line on its own is a complete JSON value (so: JSON lines)."""
    try:
        json.loads(line)
    except json.JSONDecodeError:
        return False
    return True


def clean_text(text: str) -> str:
    """Collapse every run of white space (newlines, NBSP, ...) to one space, as the normalized
    files do; paragraphs then compare equal whichever layout they came from."""
    return " ".join(text.split())


def join_sentences(sentences: Iterable[str]) -> str:
    """Join a paragraph's sentences (HotpotQA keeps a leading space in each, 2Wiki does not)."""
    return clean_text(" ".join(sentences))


def _maybe_json(value: Any) -> Any:
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def parse_context(raw: Any, ref: RowRef | None = None, key: str = "context") -> list[dict[str, str]]:
    """`[[title, [sents]]]` (official), `{title: [...], sentences|content: [[...]]}` (HF),
    or `[{title, text}]` (normalized) -> `[{title, text}]`. A malformed value raises
    `DatasetFormatError` naming the file, the row and ``context[i]``."""
    ref = ref or RowRef("<rows>", "a row")
    raw = _maybe_json(raw)
    pairs: list[tuple[Any, Any, str]] = []
    if isinstance(raw, Mapping):
        titles = raw.get("title") or raw.get("titles") or []
        bodies = raw.get("sentences") or raw.get("content") or raw.get("text") or []
        if not isinstance(titles, list) or not isinstance(bodies, list) or len(titles) != len(bodies):
            raise ref.error(
                key,
                "must hold a list of titles and a list of paragraphs of the same "
                f"length; got {_short(titles)} and {_short(bodies)}",
            )
        pairs = [(t, b, f"{key}[{i}]") for i, (t, b) in enumerate(zip(titles, bodies))]
    elif isinstance(raw, list):
        for i, item in enumerate(raw):
            k = f"{key}[{i}]"
            if isinstance(item, Mapping):
                body = item.get("text", item.get("sentences", item.get("paragraph_text")))
                pairs.append((item.get("title"), body, k))
            elif isinstance(item, (list, tuple)) and len(item) == 2:
                pairs.append((item[0], item[1], k))
            else:
                raise ref.error(k, f"must be [title, [sentences]] or {{title, text}}, got {_short(item)}")
    elif raw is not None:
        raise ref.error(key, f"must be a list of paragraphs, got {type(raw).__name__} {_short(raw)}")
    out = []
    for title, body, k in pairs:
        if not isinstance(title, str):
            raise ref.error(k, f"has no string title (got {_short(title)})")
        if isinstance(body, str):
            text = clean_text(body)
        elif isinstance(body, (list, tuple)) and all(isinstance(x, str) for x in body):
            text = join_sentences(body)
        else:
            raise ref.error(
                k, f"paragraph {title!r} must be a string or a list of sentence strings, got {_short(body)}"
            )
        out.append({"title": title, "text": text})
    return out


def parse_supporting_facts(raw: Any, ref: RowRef | None = None, key: str = "supporting_facts") -> list[list[Any]]:
    """`[[title, sent_id]]` (official) or `{title: [...], sent_id: [...]}` (HF) -> list form."""
    ref = ref or RowRef("<rows>", "a row")
    raw = _maybe_json(raw)
    if isinstance(raw, Mapping):
        titles, ids = raw.get("title", []), raw.get("sent_id", [])
        if not isinstance(titles, list) or not isinstance(ids, list) or len(titles) != len(ids):
            raise ref.error(key, f"must hold lists title and sent_id of the same length, got {_short(raw)}")
        facts = [[t, i] for t, i in zip(titles, ids)]
    elif isinstance(raw, list) or raw is None:
        facts = [list(x) if isinstance(x, (list, tuple)) else x for x in raw or []]
    else:
        raise ref.error(key, f"must be a list of [title, sentence index], got {_short(raw)}")
    for i, fact in enumerate(facts):
        if not (isinstance(fact, list) and len(fact) == 2 and isinstance(fact[0], str)):
            raise ref.error(f"{key}[{i}]", f"must be [title, sentence index], got {_short(fact)}")
    return facts


def unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


_NORMALIZED_KEYS = {"id", "question", "answer", "aliases", "supporting_titles", "context", "type"}


def is_normalized(row: Mapping[str, Any]) -> bool:
    ctx = row.get("context")
    return "supporting_titles" in row and isinstance(ctx, list) and (not ctx or isinstance(ctx[0], Mapping))


def task_from_normalized(row: Mapping[str, Any], ref: RowRef | None = None) -> QATask:
    ref = ref or RowRef("<rows>", "a row")
    question = ref.get(row, "question")
    if not isinstance(question, str) or not question.strip():
        raise ref.error("question", f"must be a non-empty string, got {_short(question)}")
    return QATask(
        id=str(ref.get(row, "id")),
        question=question,
        answer=gold_answer(ref.get(row, "answer"), ref, "answer"),
        aliases=gold_aliases(row.get("aliases"), ref, "aliases"),
        supporting_titles=string_list(row.get("supporting_titles"), ref, "supporting_titles"),
        context=parse_context(row.get("context"), ref),
        type=str(row.get("type") or ""),
        extra={k: v for k, v in row.items() if k not in _NORMALIZED_KEYS},
    )


def parse_rows(
    rows: Sequence[Mapping[str, Any]], path: Path, convert: Callable[[Mapping[str, Any], int, RowRef], QATask]
) -> list[QATask]:
    """``convert(row, index, ref)`` over every row; the normalized layout (detected from the
    first row) is read by `task_from_normalized` instead."""
    if rows and is_normalized(rows[0]):
        return [task_from_normalized(r, row_ref(rows, i, path)) for i, r in enumerate(rows)]
    return [convert(r, i, row_ref(rows, i, path)) for i, r in enumerate(rows)]


# ---------------------------------------------------------------------------------------------
# Corpora


def _split_contents(contents: str) -> tuple[str, str]:
    title, sep, text = contents.partition("\n")
    if not sep:
        return "", contents
    title = title.strip()
    if len(title) >= 2 and title[0] == title[-1] == '"':
        title = title[1:-1]
    return title, text


def make_doc(doc_id: str, title: str, text: str) -> dict[str, str]:
    return {"id": doc_id, "title": title, "text": text, "contents": f'"{title}"\n{text}'}


def normalize_doc(row: Mapping[str, Any], index: int, ref: RowRef | None = None) -> dict[str, str]:
    """One corpus row -> `{id, title, text, contents}` (title/text recovered from `contents`).

    ``title``, ``text`` and ``contents`` must be strings and ``id`` a string or an integer: a
    null or any other value raises naming the key (``str()`` would make the passage "None")."""
    ref = ref or RowRef("corpus", f"row {index}")
    if not isinstance(row, Mapping):
        raise ref.error(None, f"expected a JSON object, got {type(row).__name__} {_short(row)}")
    id_key = "id" if "id" in row else "docid" if "docid" in row else None
    doc_id = row[id_key] if id_key else index
    if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)):
        raise ref.error(id_key, f"must be a string or an integer, got {type(doc_id).__name__} {_short(doc_id)}")

    def text_field(key: str) -> str:
        value = row[key]
        if not isinstance(value, str):
            raise ref.error(key, f"must be a string, got {type(value).__name__} {_short(value)}")
        return value

    if "title" in row and "text" in row:
        return make_doc(str(doc_id), text_field("title"), text_field("text"))
    if "contents" in row:
        title, text = _split_contents(text_field("contents"))
        return make_doc(str(doc_id), text_field("title") if "title" in row else title, text)
    raise ref.error("title", f"missing: a corpus row needs title and text, or contents (it has keys {sorted(row)})")


def load_corpus(path: str | os.PathLike[str], limit: int | None = None) -> list[dict[str, str]]:
    """Read a corpus JSONL (`{id,title,text,contents}` or wiki-18 `{id,contents}`). A bad line
    raises `DatasetFormatError` naming the file, the line and the key."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file not found: {str(path)!r}")
    docs: list[dict[str, str]] = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if limit is not None and len(docs) >= limit:
                break
            if line.strip():
                ref = RowRef(str(path), f"line {i + 1}")
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise ref.error(None, f"invalid JSON at column {err.colno} ({err.msg})") from None
                docs.append(normalize_doc(row, i, ref))
    return docs


def corpus_from_tasks(tasks: Iterable[QATask]) -> list[dict[str, str]]:
    """The distractor-pool corpus: every context paragraph of `tasks`, deduplicated by (title,
    text), in first-seen order, with ids `doc_000000`, `doc_000001`, ..."""
    seen: dict[tuple[str, str], None] = {}
    for task in tasks:
        for para in task.context:
            seen.setdefault((para["title"], para["text"]), None)
    return [make_doc(f"doc_{i:06d}", t, x) for i, (t, x) in enumerate(seen)]


def write_corpus(docs: Iterable[Mapping[str, Any]], path: str | os.PathLike[str]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for i, row in enumerate(docs):
            f.write(json.dumps(normalize_doc(row, i), ensure_ascii=False) + "\n")
    return path


def corpus_fingerprint(docs: Sequence[Mapping[str, str]]) -> str:
    """sha256 over the (id, title, text) of every doc, in order: the key of on-disk indexes."""
    h = hashlib.sha256()
    for d in docs:
        for part in (d["id"], d["title"], d["text"]):
            h.update(part.encode("utf-8"))
            h.update(b"\x1f")
        h.update(b"\x1e")
    return h.hexdigest()
