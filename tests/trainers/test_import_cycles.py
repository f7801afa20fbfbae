"""The trainer modules' import graph has no cycle: no trainer module imports another
that imports it back, at module level or inside a function (a function-level import only delays a
cycle, it does not remove it). Imports under ``if TYPE_CHECKING:`` never run and are left out.

The checker, and the same guard for the whole project, is tests/test_import_cycles.py. Run as a
module for the figures: ``python -m tests.trainers.test_import_cycles`` prints the cycles (strongly
connected components) of the project's module graph and the count of function-level imports of the
project's own modules, per package."""

from __future__ import annotations

import sys

from tests.test_import_cycles import PACKAGES, cycles, graph  # the checker, for the whole project


def test_the_cycle_finder_finds_a_cycle_hidden_in_a_function(tmp_path):
    """The checker itself: a function-level import that closes a loop is a cycle; one under
    ``TYPE_CHECKING`` is not."""
    pkg = tmp_path / "trainers"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from trainers import b\n")
    (pkg / "b.py").write_text("def f():\n    from trainers.a import x\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from trainers import a\n")
    (pkg / "d.py").write_text("from trainers import c\n")
    for name in ("agent_gym", "envs"):
        (tmp_path / name).mkdir()
    edges, func_level = graph(tmp_path)
    assert cycles(edges, "trainers") == [["trainers.a", "trainers.b"]]
    assert func_level == {"trainers.b": 1}
    assert edges["trainers.c"] == set() and edges["trainers.d"] == {"trainers.c"}


def test_no_import_cycle_among_the_trainer_modules():
    edges, _ = graph()
    assert "trainers.trainer" in edges and edges["trainers.trainer"]  # the graph was read
    found = cycles(edges, "trainers")
    assert found == [], f"import cycles among trainers/*: {found}"


def main() -> int:
    edges, func_level = graph()
    for within in ("trainers", None):
        found = cycles(edges, within)
        print(f"import cycles (strongly connected components) within {within or 'the project'}: {len(found)}")
        for c in found:
            print("   ", " <-> ".join(c))
    total = sum(func_level.values())
    print(f"function-level imports of the project's own modules: {total}")
    for pkg in PACKAGES:
        print(f"    {pkg}: {sum(n for m, n in func_level.items() if m.split('.')[0] == pkg)}")
    print(
        "    trainers modules:",
        ", ".join(f"{m.split('.', 1)[1]} {n}" for m, n in sorted(func_level.items()) if m.startswith("trainers.")),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
