"""No numbered reference to the project's issue tracker in the repository's text: users cannot see
the tracker, so a comment, docstring, config note or doc says what was changed or found (and when),
not which tracker entry asked for it. Checked over the tracked text files and new ones not yet
added (``git ls-files``), outside ``results/`` and ``runs/`` (raw outputs whose file names are kept
as they were written)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".sh", ".toml", ".txt", ".cfg", ".ini"}
NAMES = {"Makefile", ".importlinter"}
SKIP_DIRS = ("results/", "runs/")
# The word and a number (with a space, a hyphen, a "#" or nothing between), and a bare "#" and a
# number after a space or bracket; not a name inside a path or identifier (a raw file named after
# its tracker entry under results/), nor a CSS colour (``color:#555``).
PATTERN = re.compile(r"(?<![\w/])[Ii]ssues?[ -]?#?\d+|(?:^|(?<=[\s(\[]))#\d+\b")


def text_files() -> list[Path]:
    out = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    files = []
    for rel in sorted(set(out.splitlines())):
        if rel.startswith(SKIP_DIRS):
            continue
        p = ROOT / rel
        if (p.suffix in SUFFIXES or p.name in NAMES) and p.is_file():
            files.append(p)
    return files


def references(text: str) -> list[tuple[int, str]]:
    return [(n, m.group(0)) for n, line in enumerate(text.splitlines(), 1) for m in PATTERN.finditer(line)]


@pytest.mark.timeout(60)
def test_the_pattern_finds_the_forms_in_use_and_spares_paths():
    i, big = "iss" + "ue", "Iss" + "ue"  # split, so that this file holds no reference itself
    h = "#"  # and a hash apart from its number (the formatter joins adjacent literals)
    found = [
        ref
        for _, ref in references(
            f"a ({i} 21)\n{big} 10 item 7: x\nbefore {i}s 18-20\n{i} {h}22\nthe pre-{i}-19 harness\nsee ({h}13)\n"
        )
    ]
    assert found == [f"{i} 21", f"{big} 10", f"{i}s 18", f"{i} {h}22", f"{i}-19", f"{h}13"]
    assert references(f"`results/serve_soak/2026-11-27_{i}33-after.json`\ncolor:#555\nx = 1  # 2 rows\n") == []


@pytest.mark.timeout(60)
def test_no_numbered_issue_references_in_the_repository_text():
    files = text_files()
    assert len(files) > 100, f"only {len(files)} text files found: is this a git checkout?"
    hits = []
    for p in files:
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        hits += [f"{p.relative_to(ROOT)}:{n}: {ref}" for n, ref in references(text)]
    assert not hits, (
        "numbered issue references (say what was changed or found instead; users have no "
        "access to the tracker):\n" + "\n".join(hits)
    )
