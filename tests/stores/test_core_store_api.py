"""Nothing outside ``care_retriever/stores/`` reaches into a store's (or an embedder's) private members.

Every ``obj._name`` outside the stores package is an error unless ``obj`` is ``self`` / ``cls`` (a class
touching its own members), an imported module, or ``super()``; dunders are public protocol. That is
stricter than "stores and embedders only", and needs no guess of which names hold a store: a store
reached through any variable, attribute chain or call result is caught.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (ROOT / "care_retriever", ROOT / "integrations", ROOT / "training")
EXEMPT = ROOT / "care_retriever" / "stores"
# Exact expressions that are neither a store nor an embedder, each owned by another change:
ALLOWED = {
    ("care_retriever/indexing/distributed.py", "encoder._encode_slice"),  # ShardedEncoder, a class of that module
    ("integrations/langchain/embeddings.py", "instance._towers"),  # a classmethod filling its new instance
    ("training/pretraining.py", "AutoModelForCausalLM._model_mapping"),  # transformers' own attribute
    # torch has no public accessor for a process group's timeout; the run records the one in force.
    ("training/distributed.py", "dist.distributed_c10d._get_default_group"),
    ("training/distributed.py", "group._get_backend"),
    ("training/distributed.py", "group._get_backend(device).options._timeout"),
}


def _modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES if pkg.is_dir() for p in pkg.rglob("*.py") if EXEMPT not in p.parents)


def _module_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def private_accesses(source: str) -> list[tuple[int, str]]:
    """(line, expression) of each ``x._name`` where ``x`` is not self, cls, super() or an imported module."""
    tree = ast.parse(source)
    modules = _module_names(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
            continue
        if node.attr.startswith("__") and node.attr.endswith("__"):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and (owner.id in ("self", "cls") or owner.id in modules):
            continue
        if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
            continue
        found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_checker_sees_private_access_through_any_expression() -> None:
    source = (
        "import faiss\nclass A:\n    def f(self, store):\n        self._x = faiss._swig\n"
        "        return store._index, self._store._db, open_store('x')._lock, super()._y, type(self).__len__\n"
    )
    assert [expr for _, expr in private_accesses(source)] == [
        "store._index",
        "self._store._db",
        "open_store('x')._lock",
    ]


def test_no_module_outside_the_stores_touches_private_members() -> None:
    offences = [
        f"{path.relative_to(ROOT)}:{line}: {expr}"
        for path in _modules()
        for line, expr in private_accesses(path.read_text("utf-8"))
        if (path.relative_to(ROOT).as_posix(), expr) not in ALLOWED
    ]
    assert _modules(), "no modules found"
    assert not offences, "private members used outside their class:\n" + "\n".join(offences)
