"""The trainer modules' import graph has no cycle (issue 21): no trainer module imports another
that imports it back, at module level or inside a function (a function-level import only delays a
cycle, it does not remove it). Imports under ``if TYPE_CHECKING:`` never run and are left out.

Run as a script for the figures: ``python tests/trainers/test_import_cycles.py`` prints the cycles
(strongly connected components) of the project's module graph and the count of function-level
imports of the project's own modules, per package."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("trainers", "agent_gym", "envs")


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the project's packages, by dotted name (packages by their ``__init__``)."""
    out = {}
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The deepest project module that importing ``name`` runs (``a.b.C`` -> ``a.b``)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, bool]]:
    """``(imported project module, inside a function)`` for each import that runs."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: list[tuple[str, bool]] = []

    def visit(node: ast.AST, in_func: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit(sub, in_func)
                continue
            if isinstance(child, ast.Import):
                targets = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")
                    up = up[: len(up) - (child.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                # ``from pkg import sub``: the submodule when it is one, else the package
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in child.names]
            else:
                visit(child, in_func or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))
                continue
            for r in dict.fromkeys(_resolve(t, modules) for t in targets):  # once per statement and module
                if r is not None and r != module:
                    out.append((r, in_func))

    visit(tree, False)
    return out


def graph(root: Path = ROOT) -> tuple[dict[str, set[str]], dict[str, int]]:
    """The project's import graph (function-level imports included) and, per module, the number of
    function-level import statements' targets that are project modules."""
    modules = project_modules(root)
    edges: dict[str, set[str]] = {m: set() for m in modules}
    func_level: dict[str, int] = {}
    for m, p in modules.items():
        for target, in_func in imports_of(m, p, modules):
            edges[m].add(target)
            if in_func:
                func_level[m] = func_level.get(m, 0) + 1
    return edges, func_level


def cycles(edges: dict[str, set[str]], within: str | None = None) -> list[list[str]]:
    """The strongly connected components of more than one module (each holds at least one cycle),
    restricted to modules under ``within`` when given. Tarjan's algorithm, iterative."""
    nodes = [n for n in edges if within is None or n == within or n.startswith(within + ".")]
    keep = set(nodes)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start] & keep)))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(edges[nxt] & keep))))
                elif nxt in on:
                    low[v] = min(low[v], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


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
    print("    trainers modules:", ", ".join(f"{m.split('.', 1)[1]} {n}" for m, n in sorted(func_level.items())
                                            if m.startswith("trainers.")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
