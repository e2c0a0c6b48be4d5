"""The module paths of releases before the folders along the data path, kept for one release.

``care_retriever.embedder`` is now ``care_retriever.model.embedder``, ``care_retriever.writer`` is
``care_retriever.indexing.writer``, and so on (:data:`MOVED`). Importing an old path gives the module at its
new path (the same object: its classes, functions and state are the ones the package itself uses) and warns
once with a :class:`DeprecationWarning` naming the new path. A finder placed first on ``sys.meta_path`` does
this for a moved module and everything under it (``care_retriever.towers.release``), so that no second copy of
a module is ever loaded under its old name. What the package and its names export is documented in
docs/architecture.md.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

# old path -> new path; a small module folded into the room that uses it maps to that room's module
MOVED: dict[str, str] = {
    "care_retriever.embedder": "care_retriever.model.embedder",
    "care_retriever.embedder_protocol": "care_retriever.model.protocols",
    "care_retriever.model_config": "care_retriever.model.config",
    "care_retriever.encoding": "care_retriever.model.encoding",
    "care_retriever.encoding_checks": "care_retriever.model.protocols",
    "care_retriever.fingerprint": "care_retriever.model.fingerprint",
    "care_retriever.prompts": "care_retriever.model.prompts",
    "care_retriever.loading": "care_retriever.model.loading",
    "care_retriever.locations": "care_retriever.model.loading",
    "care_retriever.baselines": "care_retriever.model.baselines",
    "care_retriever.towers": "care_retriever.model.towers",
    "care_retriever.corpus": "care_retriever.indexing.corpus",
    "care_retriever.jsonl": "care_retriever.indexing.corpus",
    "care_retriever.writer": "care_retriever.indexing.writer",
    "care_retriever.retriever": "care_retriever.search.retriever",
    "care_retriever.server": "care_retriever.search.server",
    "care_retriever.batching": "care_retriever.search.batching",
    "care_retriever.backends": "care_retriever.search.backends",
    "care_retriever.sql": "care_retriever.sparse.sqlite_bm25",
    # moved under the room that uses them, so no import runs up the layers (docs/architecture.md)
    "care_retriever.sparse.hybrid": "care_retriever.search.hybrid",
    "care_retriever.evaluation.bm25": "care_retriever.sparse.bm25",
}


def new_path(name: str) -> str | None:
    """The module ``name`` is now, if it is an old path or under one; None otherwise."""
    for old, new in MOVED.items():
        if name == old or name.startswith(old + "."):
            return new + name[len(old) :]
    return None


class _Alias(importlib.abc.Loader):
    """Loads an old path as the module at its new path (imported, or already loaded, under that name)."""

    def __init__(self, new: str) -> None:
        self.new = new
        self.spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} moved to {self.new}; the old path goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        module = importlib.import_module(self.new)
        self.spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # the import system set the old path's spec on the module; the module keeps its own
        module.__spec__ = self.spec


class OldPathFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = new_path(fullname)
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, _Alias(new))


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once): before the path finder, which would load a second
    copy of ``care_retriever.towers.release`` from the moved package's folder."""
    if not any(isinstance(finder, OldPathFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, OldPathFinder())
