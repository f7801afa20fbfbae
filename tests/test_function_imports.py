"""A function-level import in ``agent_gym/``, ``trainers/`` or ``envs/`` says why it is not at the top
of its module, in a comment on the import's line (any line of a multi-line import: the formatter
puts a long line's comment after the one name it imports):

- ``# optional: <what> (extra <name>)``: an optional dependency, imported where it is used so that
  the module imports without it;
- ``# deferred: <reason>``: a heavy module kept out of a light import path (``import agent_gym``,
  ``import trainers``, a command's ``--help``), an import cycle, or another reason it names.

Every other import belongs at the top of its module. An import counts as function-level when it
sits anywhere inside a ``def`` or ``async def`` (a class or block within the function included).
The check reads each file's syntax tree and its comments (``tokenize``), and is shown to flag an
uncommented import in a small source of its own. Run as a script to list the function-level
imports and their reasons, per kind: ``python tests/test_function_imports.py``.
"""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agent_gym", "trainers", "envs")
REASON = re.compile(r"#\s*(optional|deferred):\s*\S")
"""A reason in a comment (anywhere in it: ``# noqa: F401  # deferred: ...`` counts), with some text."""


def function_level_imports(source: str) -> list[tuple[int, int]]:
    """The first and last line of each ``import`` / ``from ... import`` statement inside a function."""
    out: list[tuple[int, int]] = []

    def visit(node: ast.AST, in_func: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_func and isinstance(child, (ast.Import, ast.ImportFrom)):
                out.append((child.lineno, child.end_lineno or child.lineno))
            visit(child, in_func or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(ast.parse(source), False)
    return sorted(out)


def comments(source: str) -> dict[int, str]:
    """The comment on each line that has one (``tokenize``: a ``#`` inside a string is no comment)."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return {t.start[0]: t.string for t in tokens if t.type == tokenize.COMMENT}


def reasons(source: str) -> dict[int, str | None]:
    """Each function-level import's line and its kind (``optional``, ``deferred``), or ``None``."""
    found = comments(source)
    out: dict[int, str | None] = {}
    for first, last in function_level_imports(source):
        m = next((m for n in range(first, last + 1) if (m := REASON.search(found.get(n, "")))), None)
        out[first] = m.group(1) if m else None
    return out


def unexplained(source: str, name: str) -> list[str]:
    """``name:line`` of each function-level import of ``source`` without a reason."""
    return [f"{name}:{line}" for line, kind in reasons(source).items() if kind is None]


def project_files(root: Path = ROOT) -> list[Path]:
    return [p for pkg in PACKAGES for p in sorted((root / pkg).rglob("*.py")) if "__pycache__" not in p.parts]


def test_the_check_flags_an_import_without_a_reason():
    source = (
        "import os\n"  # 1: module level, no reason needed
        "def f():\n"
        "    import json\n"  # 3: flagged
        "    import yaml  # deferred: yaml stays out of --help\n"  # 4
        "    # optional: on the line before does not count\n"
        "    import torch\n"  # 6: flagged
        "    from openai import (  # optional: openai (extra openai)\n"  # 7: multi-line, first line
        "        OpenAI,\n"
        "    )\n"
        "    s = '# deferred: in a string, no comment'; import re\n"  # 10: flagged
        "    import gzip  # noqa: F401  # deferred: a reason after another comment\n"  # 11
        "    import bz2  # deferred:\n"  # 12: flagged, a marker with no reason
        "async def g():\n"
        "    class C:\n"
        "        from typing import Any\n"  # 15: flagged, inside a function's class
        "    if True:\n"
        "        import lzma  # optional: lzma (extra none)\n"  # 17
        "    from base64 import (\n"  # 18: the formatter's layout, the comment on the name's line
        "        b64encode,  # deferred: a reason on the name's line\n"
        "    )\n"
        "    from uuid import (\n"  # 21: flagged
        "        uuid4,\n"
        "    )  # no reason here\n"
        "class D:\n"
        "    import csv\n"  # 25: a class body outside a function is module level
        "    def m(self):\n"
        "        import zlib\n"  # 27: flagged
    )
    assert [first for first, _ in function_level_imports(source)] == [3, 4, 6, 7, 10, 11, 12, 15, 17, 18, 21, 27]
    assert unexplained(source, "x.py") == ["x.py:3", "x.py:6", "x.py:10", "x.py:12", "x.py:15", "x.py:21", "x.py:27"]
    kinds = reasons(source)
    assert (kinds[4], kinds[7], kinds[11], kinds[17], kinds[18]) == (
        "deferred",
        "optional",
        "deferred",
        "optional",
        "deferred",
    )


def test_every_function_level_import_says_why():
    files = project_files()
    assert {p.relative_to(ROOT).parts[0] for p in files} == set(PACKAGES)  # every package was read
    total, missing = 0, []
    for path in files:
        source = path.read_text()
        total += len(function_level_imports(source))
        missing += unexplained(source, str(path.relative_to(ROOT)))
    assert total > 0  # the walk found the function-level imports there are
    assert missing == [], (
        "function-level imports without a reason: move each to the top of its module, or end its line "
        "with '# optional: <what> (extra <name>)' or '# deferred: <reason>':\n  " + "\n  ".join(missing)
    )


def main() -> int:
    counts: dict[str | None, int] = {}
    for path in project_files():
        source = path.read_text()
        found = comments(source)
        for line, kind in reasons(source).items():
            counts[kind] = counts.get(kind, 0) + 1
            print(f"{path.relative_to(ROOT)}:{line}: {found.get(line, '(no comment)')}")
    print(", ".join(f"{kind or 'without a reason'}: {n}" for kind, n in sorted(counts.items(), key=str)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
