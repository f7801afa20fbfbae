"""QA loaders on the project's own fixtures (every layout) and on shared/data when present."""

import json
import os
import socket
import threading
import zipfile
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agent_gym.datasets import (
    DATASETS,
    DatasetDownloadError,
    QATask,
    corpus_from_tasks,
    load_corpus,
    load_qa,
    write_corpus,
)
from agent_gym.datasets.base import Source, read_rows

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "tests" / "fixtures" / "qa"


def shared_data_dir() -> Path:
    env = os.environ.get("AGENT_GYM_SHARED_DATA")
    return Path(env) if env else REPO / ".." / "shared" / "data"


@pytest.fixture(scope="module")
def shared() -> Path:
    d = shared_data_dir()
    if not d.is_dir():
        pytest.skip(f"shared data not found at {d} (set AGENT_GYM_SHARED_DATA)")
    return d


# --- fixtures, one per layout ------------------------------------------------------------------


def test_hotpotqa_official_layout():
    tasks = load_qa("hotpotqa", FIX / "hotpotqa" / "hotpot_dev_distractor_v1.json")
    assert [t.id for t in tasks] == ["fx-hp-1", "fx-hp-2", "fx-hp-3"]
    t = tasks[0]
    assert t.question == "In which town was the director of The Glass Orchard born?"
    assert t.golds == ["Quillhaven"]
    assert t.supporting_titles == ["The Glass Orchard", "Marlow Vance"]
    assert t.type == "bridge" and t.extra["level"] == "medium"
    assert t.extra["supporting_facts"] == [["The Glass Orchard", 0], ["Marlow Vance", 0]]
    assert [c["title"] for c in t.context] == ["Vance Motor Works", "The Glass Orchard", "Quillhaven", "Marlow Vance"]
    # Sentences carry their own leading space in HotpotQA: joined without doubling it.
    assert t.context[1]["text"] == (
        "The Glass Orchard is a 1968 drama film directed by Marlow Vance. "
        "It follows two sisters who tend a greenhouse of glass fruit trees."
    )


def test_hotpotqa_hf_layout_matches_official():
    official = load_qa("hotpotqa", FIX / "hotpotqa" / "hotpot_dev_distractor_v1.json")
    hf = load_qa("hotpotqa", FIX / "hotpotqa" / "hf_rows.jsonl")
    assert [t.to_dict() for t in hf] == [t.to_dict() for t in official]


def test_directory_finds_official_name_and_limit():
    tasks = load_qa("hotpotqa", FIX / "hotpotqa", split="dev", limit=2)
    assert [t.id for t in tasks] == ["fx-hp-1", "fx-hp-2"]
    assert load_qa("hotpotqa", FIX / "hotpotqa", limit=0) == []


def test_twowiki_official_layout_with_alias_file():
    tasks = load_qa("2wikimultihopqa", FIX / "2wikimultihopqa")
    t = tasks[0]
    assert t.id == "fx-2w-1" and t.type == "compositional"
    # id_aliases.json: aliases + demonyms of answer_id Q900001; the answer itself is not repeated.
    assert t.golds == ["Quillhaven", "Quillhaven Town", "Quillhavener"]
    assert t.extra["evidences"][0] == ["The Glass Orchard", "director", "Marlow Vance"]
    # 2Wiki sentences have no leading space: joined with one.
    assert t.context[2]["text"].startswith(
        "Marlow Vance (14 March 1931 \u2013 2 May 1999) was a film director born in Quillhaven. He made"
    )
    assert tasks[1].aliases == []


def test_musique_official_layout():
    tasks = load_qa("musique", FIX / "musique" / "musique_ans_v1.0_dev.jsonl")
    t = tasks[0]
    assert t.id == "2hop__101_202" and t.type == "2hop"
    assert t.golds == ["Quillhaven", "Quillhaven Town"]
    assert t.supporting_titles == ["Marlow Vance", "The Glass Orchard"]
    assert t.extra["supporting_paragraph_idx"] == [1, 2]
    assert t.extra["answerable"] is True
    assert len(t.extra["question_decomposition"]) == 2
    # Paragraphs come back in idx order even when the file lists them otherwise.
    assert [c["title"] for c in tasks[1].context] == ["Odile Brask", "Quillhaven"]
    assert tasks[1].type == "3hop1"


def test_normalized_layout_any_dataset():
    for name in DATASETS:
        (t,) = load_qa(name, FIX / "normalized_dev.jsonl")
        assert t.id == "fx-n-1"
        assert t.golds == ["Quillhaven", "Quillhaven Town"]
        assert t.supporting_titles == ["The Glass Orchard", "Marlow Vance"]
        assert t.extra == {"level": "medium", "dev_index": 0, "context_kind": "distractor"}


def test_read_rows_detects_array_and_lines(tmp_path):
    rows = [{"a": 1}, {"a": 2}]
    (tmp_path / "x.json").write_text(json.dumps(rows, indent=2))
    (tmp_path / "y.txt").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / "z.json").write_text(json.dumps({"data": rows}, indent=2))
    (tmp_path / "w.json").write_text(json.dumps({"data": rows}))  # one line
    for name in ("x.json", "y.txt", "z.json", "w.json"):
        assert read_rows(tmp_path / name) == rows


def test_errors_name_the_path_and_valid_datasets(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(FileNotFoundError, match="nope.json"):
        load_qa("hotpotqa", missing)
    with pytest.raises(FileNotFoundError, match="hotpot_dev_distractor_v1.json"):
        load_qa("hotpotqa", tmp_path)  # an empty directory: says which names it tried
    with pytest.raises(KeyError, match="valid names: 2wikimultihopqa, hotpotqa, musique"):
        load_qa("squad", FIX / "normalized_dev.jsonl")
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_corpus(tmp_path / "nope.jsonl")


# --- download and cache ------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def file_server(tmp_path):
    """A real static HTTP server over a temp directory, standing in for the official host."""
    root = tmp_path / "www"
    root.mkdir()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), partial(_QuietHandler, directory=str(root)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def test_download_on_first_use_then_cache(tmp_path, monkeypatch, file_server):
    root, base = file_server
    (root / "hp.json").write_bytes((FIX / "hotpotqa" / "hotpot_dev_distractor_v1.json").read_bytes())
    monkeypatch.setenv("AGENT_GYM_CACHE", str(tmp_path / "cache"))
    sources = DATASETS["hotpotqa"].sources
    monkeypatch.setitem(sources, "dev", Source(base + "/hp.json", "hotpot_dev_distractor_v1.json"))
    tasks = load_qa("hotpotqa")
    assert [t.id for t in tasks] == ["fx-hp-1", "fx-hp-2", "fx-hp-3"]
    assert (tmp_path / "cache" / "datasets" / "hotpotqa" / "hotpot_dev_distractor_v1.json").is_file()
    (root / "hp.json").unlink()  # the second load must not need the server
    assert [t.id for t in load_qa("hotpotqa", limit=1)] == ["fx-hp-1"]


def test_download_zip_archive_with_side_file(tmp_path, monkeypatch, file_server):
    root, base = file_server
    with zipfile.ZipFile(root / "data.zip", "w") as zf:
        zf.write(FIX / "2wikimultihopqa" / "dev.json", "data/dev.json")
        zf.write(FIX / "2wikimultihopqa" / "id_aliases.json", "data/id_aliases.json")
    monkeypatch.setenv("AGENT_GYM_CACHE", str(tmp_path / "cache"))
    src = Source(base + "/data.zip", "dev.json", archive="data.zip", side_files=("id_aliases.json",))
    monkeypatch.setitem(DATASETS["2wikimultihopqa"].sources, "dev", src)
    tasks = load_qa("2wikimultihopqa")
    assert tasks[0].aliases == ["Quillhaven Town", "Quillhavener"]


def test_offline_download_error_says_pass_data_path(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENT_GYM_CACHE", str(tmp_path / "cache"))
    dead = f"http://127.0.0.1:{_free_port()}/hotpot_dev_distractor_v1.json"  # nothing listens
    monkeypatch.setitem(DATASETS["hotpotqa"].sources, "dev", Source(dead, "hotpot_dev_distractor_v1.json"))
    with pytest.raises(DatasetDownloadError, match="data_path="):
        load_qa("hotpotqa")
    assert not list((tmp_path / "cache").rglob("*.part"))  # no half-written file left behind
    with pytest.raises(ValueError, match="data_path="):
        load_qa("hotpotqa", split="test")  # no official source for that split


# --- corpora -----------------------------------------------------------------------------------


def test_load_corpus_both_layouts():
    docs = load_corpus(FIX / "corpus.jsonl")
    assert docs[0] == {
        "id": "fx0",
        "title": "The Glass Orchard",
        "text": docs[0]["text"],
        "contents": f'"The Glass Orchard"\n{docs[0]["text"]}',
    }
    wiki = load_corpus(FIX / "wiki18_style.jsonl")
    assert [d["title"] for d in wiki] == ["The Glass Orchard", "Marlow Vance", "Odile Brask"]
    assert wiki[1]["id"] == "2" and wiki[1]["text"].startswith("Marlow Vance Marlow Vance (14 March")
    assert len(load_corpus(FIX / "corpus.jsonl", limit=2)) == 2


def test_corpus_from_tasks_dedups_by_title_and_text(tmp_path):
    tasks = load_qa("hotpotqa", FIX / "hotpotqa")
    docs = corpus_from_tasks(tasks)
    pairs = [(d["title"], d["text"]) for d in docs]
    assert len(pairs) == len(set(pairs)) == 6  # 9 context paragraphs, 6 distinct
    assert [d["id"] for d in docs[:2]] == ["doc_000000", "doc_000001"]
    # Same title, different text: both kept.
    twin = QATask(id="x", question="q", answer="a", context=[{"title": "Quillhaven", "text": "Other."}])
    assert len(corpus_from_tasks([*tasks, twin])) == 7
    path = write_corpus(docs, tmp_path / "c.jsonl")
    assert load_corpus(path) == docs


# --- shared data (real rows) -------------------------------------------------------------------

SHARED_COUNTS = {"hotpotqa": (600, 16210), "2wikimultihopqa": (300, 9456), "musique": (100, 3141)}
OFFICIAL_SAMPLES = [
    ("hotpotqa", "hotpotqa/official_format_sample.json"),
    ("hotpotqa", "hotpotqa/hf_format_sample.json"),
    ("2wikimultihopqa", "2wikimultihopqa/official_format_sample.json"),
    ("musique", "musique/official_format_sample.jsonl"),
]


@pytest.mark.parametrize("name", sorted(SHARED_COUNTS))
def test_shared_normalized_and_corpus(shared, name):
    n_questions, n_docs = SHARED_COUNTS[name]
    tasks = load_qa(name, shared / name)  # the directory: finds dev_sample.jsonl
    assert len(tasks) == n_questions
    assert all(t.question and t.answer and t.supporting_titles and t.context for t in tasks)
    corpus = load_corpus(shared / name / "corpus.jsonl")
    assert len(corpus) == n_docs
    pool = {(d["title"], d["text"]) for d in corpus}
    own = corpus_from_tasks(tasks)
    assert {(d["title"], d["text"]) for d in own} <= pool
    for t in tasks:  # every supporting title is a paragraph of the question's own context
        assert set(t.supporting_titles) <= {c["title"] for c in t.context}


@pytest.mark.parametrize(("name", "rel"), OFFICIAL_SAMPLES)
def test_shared_official_layouts_match_normalized(shared, name, rel):
    raw = load_qa(name, shared / rel)
    assert raw
    normalized = {t.question: t for t in load_qa(name, shared / name / "dev_sample.jsonl")}
    matched = 0
    for t in raw:
        u = normalized.get(t.question)
        if u is None:
            continue
        matched += 1
        assert (t.answer, t.type, t.supporting_titles, t.context) == (u.answer, u.type, u.supporting_titles, u.context)
        if name != "2wikimultihopqa":  # 2Wiki aliases come from id_aliases.json, not shipped here
            assert t.aliases == u.aliases
    assert matched >= 10


# --- malformed files: reward hacks and errors that name file, row and key ---------------------------

from agent_gym.datasets import DatasetFormatError  # noqa: E402

NORMALIZED = json.loads((FIX / "normalized_dev.jsonl").read_text().splitlines()[0])
HOTPOT_ROWS = json.loads((FIX / "hotpotqa" / "hotpot_dev_distractor_v1.json").read_text())
MUSIQUE_ROWS = [json.loads(x) for x in (FIX / "musique" / "musique_ans_v1.0_dev.jsonl").read_text().splitlines()]


def _jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _expect(path, where, key, what, dataset="hotpotqa"):
    with pytest.raises(DatasetFormatError) as err:
        load_qa(dataset, data_path=path)
    msg = str(err.value)
    assert str(path) in msg and where in msg and what in msg, msg
    if key is not None:
        assert f"key {key!r}" in msg, msg
    return msg


@pytest.mark.parametrize(
    ("field", "value", "what"),
    [
        ("aliases", "P", "expected a list of strings"),  # was split into ["P"]: EM 1 for gold Paris
        ("answer", None, "is null"),  # was the gold "None"
        ("answer", ["Paris", "Lutetia"], "is a list"),  # was the gold "['Paris', 'Lutetia']"
        ("answer", 1.5, "must be a string"),
        ("aliases", ["ok", None], "is null"),
        ("supporting_titles", "Paris", "expected a list of strings"),
    ],
)
def test_normalized_bad_gold_values_are_rejected(tmp_path, field, value, what):
    bad = {**NORMALIZED, field: value}
    path = _jsonl(tmp_path / "dev.jsonl", [NORMALIZED, "", bad])  # the bad row is on line 3
    key = "aliases[1]" if field == "aliases" and isinstance(value, list) else field
    _expect(path, "line 3", key, what)


def test_int_answer_is_normalized_deliberately(tmp_path):
    path = _jsonl(tmp_path / "dev.jsonl", [{**NORMALIZED, "answer": 1990, "aliases": [1990, "MCMXC"]}])
    task = load_qa("hotpotqa", data_path=path)[0]
    assert task.answer == "1990" and task.aliases == ["1990", "MCMXC"]


def test_official_row_missing_key_names_file_index_and_key(tmp_path):
    rows = [dict(r) for r in HOTPOT_ROWS]
    del rows[2]["answer"]
    path = tmp_path / "hotpot_dev_distractor_v1.json"
    path.write_text(json.dumps(rows, indent=1))
    _expect(path, "index 2", "answer", "missing")  # was a bare KeyError: 'answer'


def test_truncated_json_array_names_file_and_index(tmp_path):
    text = json.dumps(HOTPOT_ROWS, indent=1)
    cut = text.index('"_id"', text.index(HOTPOT_ROWS[1]["_id"]) + 40) + 30  # inside row 2
    path = tmp_path / "hotpot_dev_distractor_v1.json"
    path.write_text(text[:cut])
    msg = _expect(path, "index 2", None, "invalid JSON")  # was "line 1 column 7186", no file
    assert "line " in msg and "column " in msg


def test_truncated_jsonl_line_names_file_and_line(tmp_path):
    path = _jsonl(tmp_path / "dev.jsonl", [NORMALIZED, json.dumps(NORMALIZED)[:50]])
    _expect(path, "line 2", None, "invalid JSON")


@pytest.mark.parametrize("scalar", ["5", '"a question"', "null", "[1, 2]"])
def test_scalar_jsonl_row_names_file_and_line(tmp_path, scalar):
    path = _jsonl(tmp_path / "dev.jsonl", [NORMALIZED, scalar])
    _expect(path, "line 2", None, "expected a JSON object")  # was AttributeError


@pytest.mark.parametrize(
    ("context", "key"),
    [
        ([["Only a title"]], "context[0]"),  # was "not enough values to unpack"
        ([["T", ["ok"]], ["U", [1, 2]]], "context[1]"),
        ("not a list", "context"),
        ({"title": ["a", "b"], "sentences": [["x"]]}, "context"),
    ],
)
def test_malformed_context_names_file_index_and_key(tmp_path, context, key):
    rows = [dict(r) for r in HOTPOT_ROWS]
    rows[1]["context"] = context
    path = tmp_path / "hotpot_dev_distractor_v1.json"
    path.write_text(json.dumps(rows))
    _expect(path, "index 1", key, "")


def test_musique_string_aliases_and_bad_paragraphs(tmp_path):
    path = _jsonl(
        tmp_path / "musique_ans_v1.0_dev.jsonl", [MUSIQUE_ROWS[0], {**MUSIQUE_ROWS[0], "answer_aliases": "Q"}]
    )
    _expect(path, "line 2", "answer_aliases", "expected a list of strings", "musique")
    bad = {**MUSIQUE_ROWS[0], "paragraphs": [{"idx": 0, "title": "T"}]}
    path = _jsonl(tmp_path / "musique_ans_v1.0_dev.jsonl", [bad])
    _expect(path, "line 1", "paragraphs[0].paragraph_text", "must be a string", "musique")


def test_twowiki_alias_file_string_aliases_rejected(tmp_path):
    d = tmp_path / "2wiki"
    d.mkdir()
    (d / "dev.json").write_text((FIX / "2wikimultihopqa" / "dev.json").read_text())
    rows = [json.loads(x) for x in (FIX / "2wikimultihopqa" / "id_aliases.json").read_text().splitlines()]
    rows[0]["aliases"] = "P"
    _jsonl(d / "id_aliases.json", rows)
    with pytest.raises(DatasetFormatError) as err:
        load_qa("2wikimultihopqa", data_path=d)
    msg = str(err.value)
    assert "id_aliases.json" in msg and "line 1" in msg and "key 'aliases'" in msg


def test_corpus_bad_lines_name_file_line_and_key(tmp_path):
    path = _jsonl(tmp_path / "corpus.jsonl", [{"id": "1", "title": "T", "text": "x"}, {"id": "2", "body": "y"}])
    with pytest.raises(DatasetFormatError, match=r"corpus.jsonl, line 2, key 'title': missing"):
        load_corpus(path)
    path = _jsonl(tmp_path / "corpus.jsonl", [{"id": "1", "title": "T", "text": "x"}, '{"id": "2", "ti'])
    with pytest.raises(DatasetFormatError, match=r"corpus.jsonl, line 2: invalid JSON"):
        load_corpus(path)


# -- blank golds are refused by every loader --------------------------------------------------------

BLANKS = ["", "   ", "\t\n", "\u00a0\u3000"]  # empty, spaces, tab/newline, no-break and ideographic spaces


@pytest.mark.parametrize("blank", BLANKS)
@pytest.mark.parametrize("where", ["answer", "alias"])
def test_normalized_blank_gold_is_refused(tmp_path, blank, where):
    # Before: accepted, so every answer that normalizes to "" ("", "the", "...") scored EM 1.
    bad = {**NORMALIZED, "answer": blank} if where == "answer" else {**NORMALIZED, "aliases": ["ok", blank]}
    path = _jsonl(tmp_path / "dev.jsonl", [NORMALIZED, bad])
    _expect(path, "line 2", "answer" if where == "answer" else "aliases[1]", "is blank")


@pytest.mark.parametrize("blank", BLANKS)
def test_hotpotqa_and_twowiki_official_blank_answer_is_refused(tmp_path, blank):
    rows = [dict(r) for r in HOTPOT_ROWS]
    rows[1]["answer"] = blank
    path = tmp_path / "hotpot_dev_distractor_v1.json"
    path.write_text(json.dumps(rows))
    _expect(path, "index 1", "answer", "is blank")
    d = tmp_path / "2wiki"
    d.mkdir()
    rows = json.loads((FIX / "2wikimultihopqa" / "dev.json").read_text())
    rows[0]["answer"] = blank
    (d / "dev.json").write_text(json.dumps(rows))
    _expect(d / "dev.json", "index 0", "answer", "is blank", "2wikimultihopqa")


@pytest.mark.parametrize("blank", BLANKS)
def test_twowiki_alias_file_blank_alias_is_refused(tmp_path, blank):
    d = tmp_path / "2wiki"
    d.mkdir()
    (d / "dev.json").write_text((FIX / "2wikimultihopqa" / "dev.json").read_text())
    rows = [json.loads(x) for x in (FIX / "2wikimultihopqa" / "id_aliases.json").read_text().splitlines()]
    rows[0]["demonyms"] = ["Ok", blank]
    _jsonl(d / "id_aliases.json", rows)
    _expect(d / "id_aliases.json", "line 1", "demonyms[1]", "is blank", "2wikimultihopqa")


@pytest.mark.parametrize("blank", BLANKS)
@pytest.mark.parametrize("key", ["answer", "answer_aliases"])
def test_musique_blank_answer_or_alias_is_refused(tmp_path, blank, key):
    bad = {**MUSIQUE_ROWS[0], key: blank if key == "answer" else [blank]}
    path = _jsonl(tmp_path / "musique_ans_v1.0_dev.jsonl", [MUSIQUE_ROWS[0], bad])
    _expect(path, "line 2", key if key == "answer" else "answer_aliases[0]", "is blank", "musique")


def test_a_gold_with_visible_characters_that_normalizes_to_empty_stays_valid(tmp_path):
    """HotpotQA dev row 5a8b3d795542997f31a41cc1 answers "!!!" (the band): official normalization
    drops punctuation, so it normalizes to "" (the official script gives EM 1 to "!!!" and to an
    empty answer; agent_gym.scoring scores such a gold 0 against everything). It is real data, so
    the loaders keep it; only blank golds are refused."""
    from agent_gym.scoring import exact_match, normalize_answer

    rows = [dict(r) for r in HOTPOT_ROWS]
    rows[0]["answer"] = "!!!"
    path = tmp_path / "hotpot_dev_distractor_v1.json"
    path.write_text(json.dumps(rows))
    task = load_qa("hotpotqa", data_path=path)[0]
    assert task.answer == "!!!" and normalize_answer(task.answer) == "" and exact_match("!!!", [task.answer]) == 0.0
    assert load_qa("hotpotqa", data_path=_jsonl(tmp_path / "n.jsonl", [{**NORMALIZED, "aliases": ["!!!"]}]))[
        0
    ].aliases == ["!!!"]


@pytest.mark.parametrize(
    ("row", "key", "what"),
    [
        ({"id": "2", "title": "T", "text": None}, "text", "must be a string, got NoneType None"),  # was "None"
        ({"id": "2", "title": None, "text": "x"}, "title", "must be a string"),
        ({"id": "2", "contents": 5}, "contents", "must be a string, got int"),
        ({"id": None, "title": "T", "text": "x"}, "id", "must be a string or an integer"),
    ],
)
def test_corpus_null_fields_are_refused_not_made_the_string_none(tmp_path, row, key, what):
    path = _jsonl(tmp_path / "corpus.jsonl", [{"id": "1", "title": "T", "text": "x"}, row])
    with pytest.raises(DatasetFormatError, match=rf"corpus.jsonl, line 2, key '{key}': {what}"):
        load_corpus(path)
