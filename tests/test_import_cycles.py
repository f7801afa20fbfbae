"""The project's import graph has no circle: no module of ``agent_gym``, ``agent_gym_verifiers``,
``envs``, ``trainers``, ``benchmarks`` or ``scripts`` imports another that imports it back, directly
or through others.

What counts as an import (an arrow of the graph), decided here:

- every ``import`` and ``from ... import`` statement that can run, **at module level or inside a
  function**: a function-level import only delays a circle to the first call, it does not remove it
  (farm-studio, the project's architecture view, counts both too);
- not the imports under ``if TYPE_CHECKING:``, which never run;
- an arrow goes to the deepest project module the statement names (``from agent_gym.vector import
  ToolVectorEnv`` -> ``agent_gym.vector``; ``from agent_gym import serve`` -> ``agent_gym.serve``;
  ``import agent_gym`` -> the package's ``__init__``), relative imports resolved; importing a
  submodule also runs its parent packages, but that is no arrow (else every package would be a circle
  with its own modules);
- ``scripts/`` is no package: a script runs with its own folder first on ``sys.path``, so a bare
  ``import sibling`` there is an arrow to ``scripts/sibling.py``;
- not a module named at run time by a string (``importlib.import_module``, Gymnasium's
  ``"envs.factchain:FactChainEnv"`` entry points, a plugin list): that is how ``agent_gym`` reaches
  the envs without importing them (docs/design.md, "Layers").

Run as a script for the figures: ``python tests/test_import_cycles.py`` prints the circles (the
strongly connected components of the graph) and the function-level imports of project modules, per
package.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agent_gym", "agent_gym_verifiers", "envs", "trainers", "benchmarks")
SCRIPT_DIRS = ("scripts",)
"""Folders of scripts (no ``__init__.py``): their modules are named ``scripts.NAME`` here."""


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the project, by dotted name (a package by its ``__init__``)."""
    out = {}
    for top in PACKAGES + SCRIPT_DIRS:
        for path in sorted((root / top).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
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
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, bool]]:
    """``(imported project module, inside a function)`` for each import statement that can run."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    script_dir = package if package.split(".")[0] in SCRIPT_DIRS else None
    out: list[tuple[str, bool]] = []

    def absolute(name: str) -> str:
        """A bare name in a script folder is a sibling script when one has that name."""
        if script_dir is not None and f"{script_dir}.{name.split('.')[0]}" in modules:
            return f"{script_dir}.{name}"
        return name

    def visit(node: ast.AST, in_func: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit(sub, in_func)
                continue
            if isinstance(child, ast.Import):
                targets = [absolute(a.name) for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    up = package.split(".")
                    up = up[: len(up) - (child.level - 1)]
                    base = ".".join(up + ([child.module] if child.module else []))
                else:
                    base = absolute(child.module or "")
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
    """The strongly connected components of more than one module (each holds at least one circle),
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


def test_the_checker_finds_each_kind_of_circle(tmp_path):
    """The checker itself, on a planted tree: a circle closed by a function-level import, one through
    a relative import, one between two scripts; an import under ``TYPE_CHECKING`` and a module named
    in a string are no arrows."""
    for pkg in ("agent_gym", "benchmarks"):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "agent_gym" / "a.py").write_text("from agent_gym import b\n")
    (tmp_path / "agent_gym" / "b.py").write_text("def f():\n    from agent_gym.a import x\n")
    (tmp_path / "agent_gym" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from agent_gym import d\n"
    )
    (tmp_path / "agent_gym" / "d.py").write_text(
        "import importlib\nfrom agent_gym import c\nimportlib.import_module('agent_gym.d')\n"
    )
    (tmp_path / "benchmarks" / "p.py").write_text("from .q import y\n")
    (tmp_path / "benchmarks" / "q.py").write_text("import benchmarks.p\n")
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "s.py").write_text("if __name__ == '__main__':\n    import t\n")
    (tmp_path / "scripts" / "t.py").write_text("from s import main\n")
    edges, func_level = graph(tmp_path)
    assert cycles(edges) == [
        ["agent_gym.a", "agent_gym.b"],
        ["benchmarks.p", "benchmarks.q"],
        ["scripts.s", "scripts.t"],
    ]
    assert cycles(edges, "agent_gym") == [["agent_gym.a", "agent_gym.b"]]
    assert func_level == {"agent_gym.b": 1}
    assert edges["agent_gym.c"] == set() and edges["agent_gym.d"] == {"agent_gym.c"}


def test_no_import_circle_anywhere_in_the_project():
    edges, _ = graph()
    for pkg in PACKAGES + SCRIPT_DIRS:  # the graph was read: every part of the project is in it
        assert any(m == pkg or m.startswith(pkg + ".") for m in edges), pkg
    assert "agent_gym.env_wire" in edges["agent_gym.env_server"]  # and its arrows
    found = cycles(edges)
    assert found == [], (
        "import circles (each a group of modules that import each other, at module level "
        f"or inside a function): {found}"
    )


def main() -> int:
    edges, func_level = graph()
    found = cycles(edges)
    print(f"modules: {len(edges)}, arrows: {sum(map(len, edges.values()))}")
    print(f"import circles (strongly connected components): {len(found)}")
    for c in found:
        print("   ", " <-> ".join(c))
    print(f"function-level imports of the project's own modules: {sum(func_level.values())}")
    for pkg in PACKAGES + SCRIPT_DIRS:
        print(f"    {pkg}: {sum(n for m, n in func_level.items() if m.split('.')[0] == pkg)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
