"""The installed packages' module-level imports form no cycle.

A cycle makes a module's names depend on which module of the circle was imported first, and ties
the torch-free search path (``care_retriever.backends``) to the modules that import torch. Imports
inside functions (deliberately lazy) and under ``if TYPE_CHECKING:`` (never executed) are not edges.
Importing ``a.b.c`` also runs ``a/b/__init__.py``; that implicit parent edge is not counted either,
or every package whose ``__init__`` imports its own submodules would be a cycle.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]


def package_modules() -> dict[str, Path]:
    """Every module of the wheel's import packages, by its installed name (pyproject's package-dir)."""
    package_dir: dict[str, str] = tomllib.loads((REPO / "pyproject.toml").read_text("utf-8"))["tool"]["setuptools"][
        "package-dir"
    ]
    modules: dict[str, Path] = {}
    for package, folder in package_dir.items():
        for file in (REPO / folder).rglob("*.py"):
            parts = file.relative_to(REPO / folder).with_suffix("").parts
            modules[".".join([package, *parts[:-1], *([] if parts[-1] == "__init__" else parts[-1:])])] = file
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _module_level_imports(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    """Import statements that run when the module is imported: not in functions or classes' methods,
    not under ``if TYPE_CHECKING``; inside ``try`` / ``if`` / ``with`` blocks they count."""
    found: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If):
            found += _module_level_imports(node.orelse)
            if not _is_type_checking(node.test):
                found += _module_level_imports(node.body)
        elif isinstance(node, ast.Try):
            for block in (node.body, *(h.body for h in node.handlers), node.orelse, node.finalbody):
                found += _module_level_imports(block)
        elif isinstance(node, (ast.With, ast.ClassDef)):
            found += _module_level_imports(node.body)
    return found


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the package modules its module-level imports name."""
    graph: dict[str, set[str]] = {}
    for name, file in modules.items():
        package = name if file.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in _module_level_imports(ast.parse(file.read_text("utf-8"), str(file)).body):
            if isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names)
                continue
            base = node.module or ""
            if node.level:  # relative: from the importing module's package, up level - 1 packages
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], *([base] if base else [])])
            for alias in node.names:  # `from pkg import sub` imports the submodule; `from mod import x`, mod
                edges.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
        graph[name] = {e for e in edges if e in modules and e != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as ``[a, b, ..., a]``, or None (depth-first search, white/grey/black)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_the_walk_sees_every_package_and_their_imports() -> None:
    modules = package_modules()
    assert {"care_retriever.retriever", "care_retriever.integrations.common", "care_retriever.training.recipe"} <= set(
        modules
    )
    graph = import_graph(modules)
    assert "care_retriever.stores.base" in graph["care_retriever.sparse.hybrid"]  # from X import name
    assert "care_retriever.backends.layout" in graph["care_retriever.backends"]
    # lazy (inside a function) and TYPE_CHECKING imports are not edges
    assert "care_retriever.embedder" not in graph["care_retriever.backends"]
    assert "care_retriever.embedder_protocol" not in graph["care_retriever.backends"]


def test_find_cycle_reports_a_circle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_module_level_imports_are_acyclic() -> None:
    cycle = find_cycle(import_graph(package_modules()))
    assert cycle is None, "module-level import cycle: " + " -> ".join(cycle or [])
