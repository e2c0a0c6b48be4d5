"""The installed packages' imports form no circle and never run up the layers of docs/architecture.md.

A circle makes a module's names depend on which module of the circle was imported first, ties the torch-free
search path to the modules that import torch, and (through a lazy import inside a function) hides a dependency
a reader would not guess from the module's head. So every import counts: at module level, inside functions and
methods, and ``importlib.import_module`` by name (a module calling it has an edge to every package module whose
full name it holds as a string). Not edges: imports under ``if TYPE_CHECKING:`` (never executed), the implicit
import of a parent package (importing ``a.b.c`` runs ``a/b/__init__.py``; counting it would make every package
whose ``__init__`` imports its own submodules a circle), and the lazy imports on purpose in :data:`LAZY_ON_PURPOSE`.

The layers (:data:`FLOORS`, bottom first) are those docs/architecture.md draws: a module imports only rooms on
floors below its own, or modules of its own room; two rooms on one floor do not import each other.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
# (module, function) whose imports are lazy on purpose, with why. Only for heavy dependencies kept off a light
# import: ``import care_retriever`` stays torch-free, its public names loading their module on first use.
LAZY_ON_PURPOSE = {
    ("care_retriever", "__getattr__"): "the package's public names, loaded on first use",
}


def package_modules() -> dict[str, Path]:
    """Every module of the wheel's import packages, by its installed name (pyproject's package-dir)."""
    package_dir: dict[str, str] = tomllib.loads((REPO / "pyproject.toml").read_text("utf-8"))["tool"]["setuptools"][
        "package-dir"
    ]
    modules: dict[str, Path] = {}
    folders = {REPO / folder for folder in package_dir.values()}
    for package, folder in package_dir.items():
        for file in (REPO / folder).rglob("*.py"):
            inner = [other for other in folders if REPO / folder in other.parents and other in file.parents]
            if inner:
                continue  # a folder inside this one that installs under a name of its own
            parts = file.relative_to(REPO / folder).with_suffix("").parts
            modules[".".join([package, *parts[:-1], *([] if parts[-1] == "__init__" else parts[-1:])])] = file
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(module: str, tree: ast.Module, names: set[str]) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement the module can execute (module level, functions, methods), and an ``Import``
    of each package module it names as a string if it calls ``import_module``."""
    found: list[ast.Import | ast.ImportFrom] = []
    strings: set[str] = set()
    calls_import_module = False

    def walk(node: ast.AST, function: str | None) -> None:
        nonlocal calls_import_module
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                walk(child, function)
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if (module, node.name) in LAZY_ON_PURPOSE:
                return
            function = node.name
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.Call):
            called = node.func
            if (isinstance(called, ast.Attribute) and called.attr == "import_module") or (
                isinstance(called, ast.Name) and called.id == "import_module"
            ):
                calls_import_module = True
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
            strings.add(node.value)
        for child in ast.iter_child_nodes(node):
            walk(child, function)

    walk(tree, None)
    if calls_import_module:
        found += [ast.Import(names=[ast.alias(name=name)]) for name in sorted(strings)]
    return found


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the package modules its imports name."""
    graph: dict[str, set[str]] = {}
    for name, file in modules.items():
        package = name if file.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in _imports(name, ast.parse(file.read_text("utf-8"), str(file)), set(modules)):
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
    assert {
        "care_retriever.search.retriever",
        "care_retriever.integrations.common",
        "care_retriever.training.recipe",
    } <= set(modules)
    graph = import_graph(modules)
    assert "care_retriever.stores.base" in graph["care_retriever.search.hybrid"]  # from X import name
    assert "care_retriever.search.backends.layout" in graph["care_retriever.search.backends"]
    # imports inside functions are edges (the CLI imports each command's work when it runs)
    assert "care_retriever.search.retriever" in graph["care_retriever.cli.searching"]
    # importlib by name: the CLI's command modules
    assert "care_retriever.cli.core" in graph["care_retriever.cli.main"]
    # TYPE_CHECKING imports are not edges
    assert "care_retriever.model.protocols" not in graph["care_retriever.search.backends"]


def test_find_cycle_reports_a_circle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_imports_are_acyclic() -> None:
    cycle = find_cycle(import_graph(package_modules()))
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


# The floors of docs/architecture.md, bottom first: each a set of rooms (a module belongs to the room that is the
# longest prefix of its name). Errors, strict JSON and the version import nothing of the package; the ground floor
# (torch-free) is what every room may read: documents and JSONL rows, the batch defaults, the settings helpers,
# the package's version. The document-side runtime lies under the towers, the towers under the model that pairs
# them. The BM25 side lies under the stores that hold one and the baselines that use its tokens.
FLOORS: tuple[frozenset[str], ...] = tuple(
    frozenset(floor)
    for floor in (
        {"care_retriever.errors", "care_retriever.strict_json", "care_retriever.version"},
        {
            "care_retriever",
            "care_retriever.documents",
            "care_retriever.faults",
            "care_retriever.vectors",
            "care_retriever.runtime.batch_limits",
            "care_retriever.runtime.choices",
            "care_retriever.model.settings",
        },
        {"care_retriever.sparse"},
        {"care_retriever.runtime"},  # the document side's runtime: imports nothing of the model
        {"care_retriever.model.towers"},  # the towers as their own libraries read them: nothing above them
        {"care_retriever.model", "care_retriever.stores"},
        {"care_retriever.indexing", "care_retriever.search"},
        {"care_retriever.evaluation"},
        {"care_retriever.training"},
        {"care_retriever.cli", "care_retriever.integrations"},
        {"haystack_integrations"},  # the Haystack components, in Haystack's integrations namespace
        {"care_retriever.integrations.haystack"},  # their names for code
        {"care_retriever.index"},  # the entry torchrun starts: `care-retriever index`
    )
)


def room_of(module: str) -> str | None:
    """The room of ``module``: the longest room name it is, or is under."""
    rooms = [r for floor in FLOORS for r in floor if module == r or module.startswith(r + ".")]
    return max(rooms, key=len, default=None)


def floor_of(room: str) -> int:
    return next(i for i, floor in enumerate(FLOORS) if room in floor)


def wrong_way_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a room on the same floor or above, as ``a -> b (room floor -> room floor)``."""
    found = []
    for module, imported in sorted(graph.items()):
        here = room_of(module)
        assert here is not None, f"{module} is on no floor of docs/architecture.md"
        for target in sorted(imported):
            there = room_of(target)
            assert there is not None, f"{target} is on no floor of docs/architecture.md"
            if there != here and floor_of(there) >= floor_of(here):
                found.append(f"{module} -> {target} ({here} {floor_of(here)} -> {there} {floor_of(there)})")
    return found


def test_wrong_way_imports_finds_an_import_up_or_across() -> None:
    graph = {
        "care_retriever.model.embedder": {"care_retriever.documents", "care_retriever.model.encoding"},
        "care_retriever.model.encoding": {"care_retriever.runtime.batch_limits"},
        "care_retriever.stores.base": {"care_retriever.indexing.corpus"},  # up a floor
        "care_retriever.search.retriever": {"care_retriever.indexing.writer"},  # across one floor
    }
    assert wrong_way_imports(graph) == [
        "care_retriever.search.retriever -> care_retriever.indexing.writer "
        "(care_retriever.search 6 -> care_retriever.indexing 6)",
        "care_retriever.stores.base -> care_retriever.indexing.corpus "
        "(care_retriever.stores 5 -> care_retriever.indexing 6)",
    ]


def test_no_import_runs_up_the_layers() -> None:
    wrong = wrong_way_imports(import_graph(package_modules()))
    assert not wrong, "imports up (or across) the layers of docs/architecture.md:\n" + "\n".join(wrong)


@pytest.mark.slow
def test_model_and_stores_import_without_indexing() -> None:
    """What the floors mean for a user: the model and the stores load with no module of the indexing room."""
    code = (
        "import sys\n"
        "import care_retriever.model.embedder, care_retriever.model.baselines, care_retriever.stores.faiss\n"
        "import care_retriever.stores.qdrant\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(('care_retriever.indexing', 'care_retriever.cli')))\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
