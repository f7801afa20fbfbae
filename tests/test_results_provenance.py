"""Figures kept: every benchmark script writes its raw output with its provenance
through ``agent_gym/provenance.py`` (results/README.md). The record has every field, with real
values; every script in ``benchmarks/``'s folders calls the helper (checked statically, so a new
script without it fails here) and has a stem of its own (its results/ folder); a cheap script run
end to end leaves its file; every JSON file committed under ``results/`` carries the provenance and
names a script that exists."""

from __future__ import annotations

import ast
import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_gym import provenance

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
LIBRARIES = {
    "report.py": "spread() and save() shared by the interleaved benchmarks; it measures nothing",
}
"""Modules of benchmarks/ that are imported by the scripts and are not scripts themselves (and the
packages' ``__init__.py``)."""
QA_ANSWERS = BENCHMARKS / "analysis" / "qa_answers.py"


def _git_head() -> str | None:
    try:
        r = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def _check_record(p: dict) -> None:
    assert set(provenance.FIELDS) <= p.keys(), set(provenance.FIELDS) - p.keys()
    assert isinstance(p["command"], str) and p["command"]
    assert p["git"]["commit"] == "unknown" or len(p["git"]["commit"]) in (40, 64)
    for key in ("started_utc", "finished_utc"):
        t = dt.datetime.fromisoformat(p[key])
        assert t.utcoffset() == dt.timedelta(0), p[key]
    assert dt.datetime.fromisoformat(p["started_utc"]) <= dt.datetime.fromisoformat(p["finished_utc"])
    for when in ("start", "end"):
        la = p["load_average"][when]
        assert la is None or (len(la) == 3 and all(isinstance(x, float) for x in la)), la
    assert isinstance(p["cpu_count"], int) and p["cpu_count"] >= 1
    assert isinstance(p["python"], str) and isinstance(p["packages"], dict) and p["hostname"]


@pytest.mark.timeout(60)
def test_the_record_has_every_field_with_real_values():
    rec = provenance.provenance_record(QA_ANSWERS, argv=["a.jsonl", "b.jsonl"], outputs=[ROOT / "x"])
    _check_record(rec)
    head = _git_head()
    if head is not None:  # in a checkout: the commit is the real one
        assert rec["git"]["commit"] == head and rec["git"]["short"] == head[:7]
        assert isinstance(rec["git"]["dirty"], bool) and rec["git"]["script_tracked"] is True
        assert rec["label"] == head[:7] + ("-dirty" if rec["git"]["dirty"] else "")
    else:
        assert rec["git"]["commit"] == "unknown" and rec["git"]["error"]
    assert len(rec["load_average"]["start"]) == 3 and len(rec["load_average"]["end"]) == 3
    assert rec["command"] == "python benchmarks/analysis/qa_answers.py a.jsonl b.jsonl"  # main(argv) in-process
    assert rec["script"] == "benchmarks/analysis/qa_answers.py" and rec["outputs"] == ["x"]
    assert rec["cpu_count"] == os.cpu_count() and rec["python"] == ".".join(map(str, sys.version_info[:3]))
    assert "torch" not in rec["packages"] or "torch" in sys.modules  # never imported to be reported


@pytest.mark.timeout(60)
def test_git_missing_gives_unknown(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    state = provenance.git_state()
    assert state["commit"] == "unknown" and state["dirty"] is None and "not installed" in state["error"]


@pytest.mark.timeout(60)
def test_write_raw_names_the_file_and_never_overwrites(tmp_path, monkeypatch):
    monkeypatch.setenv(provenance.ENV_DIR, str(tmp_path))
    script = BENCHMARKS / "perf" / "logger_cost.py"
    paths = [provenance.write_raw(script, {"ms": 1.5, "path": Path("/a")}, label="my run/1") for _ in range(3)]
    day = dt.datetime.now(dt.UTC).date().isoformat()
    assert [p.name for p in paths] == [f"{day}_my-run-1.json", f"{day}_my-run-1_2.json", f"{day}_my-run-1_3.json"]
    assert all(p.parent == tmp_path / "logger_cost" for p in paths)
    data = json.loads(paths[0].read_text())
    assert data["result"] == {"ms": 1.5, "path": "/a"} and data["provenance"]["label"] == "my-run-1"
    _check_record(data["provenance"])


@pytest.mark.timeout(60)
def test_under_pytest_the_committed_folder_is_never_the_default(monkeypatch):
    monkeypatch.delenv(provenance.ENV_DIR, raising=False)
    assert "PYTEST_CURRENT_TEST" in os.environ
    assert provenance.results_dir() != ROOT / "results"


def _scripts() -> list[Path]:
    """Every script, in whichever folder of benchmarks/ it sits."""
    return sorted(p for p in BENCHMARKS.rglob("*.py") if p.name not in LIBRARIES and p.name != "__init__.py")


def _calls_write_raw(tree: ast.Module) -> bool:
    imported = any(
        isinstance(n, ast.ImportFrom)
        and n.module == "agent_gym.provenance"
        and any(a.name == "write_raw" for a in n.names)
        for n in ast.walk(tree)
    )
    called = any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "write_raw" for n in ast.walk(tree)
    )
    return imported and called


@pytest.mark.timeout(60)
def test_every_benchmark_script_writes_its_raw_output_through_the_helper():
    scripts = _scripts()
    assert len(scripts) >= 30, [p.name for p in scripts]
    assert not [p for p in scripts if p.parent == BENCHMARKS], "a script belongs in one of benchmarks/'s folders"
    stems = [p.stem for p in scripts]  # results/<stem>/ is the script's folder: one script per stem
    assert len(set(stems)) == len(stems), sorted({s for s in stems if stems.count(s) > 1})
    missing = [p.name for p in scripts if not _calls_write_raw(ast.parse(p.read_text(), str(p)))]
    assert not missing, (
        f"{missing}: end the script with write_raw(__file__, result) from agent_gym/provenance.py "
        "(results/README.md), or list it in LIBRARIES here if it is a module the scripts import"
    )
    for name in LIBRARIES:  # a library is not a script: were it to become one, it would need the helper
        text = (BENCHMARKS / name).read_text()
        assert "__main__" not in text, f"{name} has become a script: remove it from LIBRARIES"


@pytest.mark.timeout(120)
def test_a_cheap_benchmark_end_to_end_leaves_its_raw_file(tmp_path):
    traj, rows = tmp_path / "traj.jsonl", tmp_path / "rows.jsonl"
    traj.write_text(
        "".join(
            json.dumps(e) + "\n"
            for e in (
                {"task_index": 0, "text": "<tool_response>Paris is the capital</tool_response>", "answer": "Paris"},
                {"task_index": 1, "text": "I cannot tell.", "answer": None},
            )
        )
    )
    rows.write_text(json.dumps({"answer": "Paris"}) + "\n" + json.dumps({"answer": "yes"}) + "\n")
    out = tmp_path / "results"
    env = {**os.environ, provenance.ENV_DIR: str(out)}
    env.pop("PYTHONPATH", None)  # by path, as users run it: the helper comes from the installed agent_gym
    res = subprocess.run(
        [sys.executable, str(QA_ANSWERS), str(traj), str(rows)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    (path,) = (out / "qa_answers").glob("*.json")
    assert path.name.endswith(".json") and str(path.relative_to(out)) in res.stderr
    data = json.loads(path.read_text())
    _check_record(data["provenance"])
    assert data["provenance"]["script"] == "benchmarks/analysis/qa_answers.py"
    assert data["provenance"]["command"].endswith(f"benchmarks/analysis/qa_answers.py {traj} {rows}")
    head = _git_head()
    if head is not None:
        assert data["provenance"]["git"]["commit"] == head
    (counts,) = data["result"]
    assert counts == json.loads(res.stdout.splitlines()[-1])  # what it printed, kept
    assert (counts["episodes"], counts["answered"], counts["right"], counts["gold_retrieved"]) == (2, 1, 1, 1)


def _committed_under_results() -> list[Path]:
    try:
        r = subprocess.run(["git", "-C", str(ROOT), "ls-files", "results"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        r = None
    if r is None or r.returncode != 0:  # no git: every file there
        return sorted(p for p in (ROOT / "results").rglob("*") if p.is_file())
    return [ROOT / line for line in r.stdout.splitlines() if line.strip()]


@pytest.mark.timeout(60)
def test_every_committed_raw_file_has_its_provenance():
    scripts = {p.stem: str(p.relative_to(ROOT)) for p in _scripts()}
    for path in _committed_under_results():
        rel = path.relative_to(ROOT)
        assert path.suffix in (".json", ".md"), f"{rel}: only raw JSON outputs and notes belong in results/"
        if path.suffix != ".json":
            continue
        assert path.stat().st_size <= provenance.BIG_BYTES, f"{rel}: over 1 MiB, too big to commit"
        data = json.loads(path.read_text())
        assert set(data) == {"provenance", "result"}, rel
        _check_record(data["provenance"])
        assert path.parent.parent == ROOT / "results", rel
        stem = path.parent.name
        assert stem in scripts, f"{rel}: no benchmark script {stem}.py (a renamed script keeps its stem)"
        # the script's path now, or before benchmarks/ was sorted into folders (a raw file is history)
        assert data["provenance"]["script"] in (scripts[stem], f"benchmarks/{stem}.py"), rel
