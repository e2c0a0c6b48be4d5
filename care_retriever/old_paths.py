"""Every compatibility alias of the package, in one place, each with the release that removes it.

Module paths of releases before the folders along the data path, and modules moved since to the room that uses
them: ``care_retriever.embedder`` is now ``care_retriever.model.embedder``, ``care_retriever.sparse.hybrid`` is
``care_retriever.search.hybrid``, and so on (:data:`MOVED`). Importing an old path gives the module at its new path
(the same object: its classes, functions and state are the ones the package itself uses) and warns once with a
:class:`DeprecationWarning` naming the new path. A finder placed first on ``sys.meta_path`` does this for a moved
module and everything under it (``care_retriever.towers.release``), so that no second copy of a module is ever
loaded under its old name.

Names still importable from the module they lived in (:data:`MOVED_NAMES`: ``Document`` from
``care_retriever.indexing.corpus``, ``IndexSettings`` from ``care_retriever.index``, ...) are listed here too, with
theirs. ``tests/test_old_paths.py`` checks that each alias gives the object at its new place, and fails once the
package's version reaches an alias's removal: the alias is then deleted (and its line here), not kept.
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

# old module path -> (new path, the release that removes the old one); a small module folded into the room that
# uses it maps to that room's module
MOVED_MODULES: dict[str, tuple[str, str]] = {
    "care_retriever.embedder": ("care_retriever.model.embedder", "0.2.0"),
    "care_retriever.embedder_protocol": ("care_retriever.model.protocols", "0.2.0"),
    "care_retriever.model_config": ("care_retriever.model.config", "0.2.0"),
    "care_retriever.encoding": ("care_retriever.model.encoding", "0.2.0"),
    "care_retriever.encoding_checks": ("care_retriever.model.protocols", "0.2.0"),
    "care_retriever.fingerprint": ("care_retriever.model.fingerprint", "0.2.0"),
    "care_retriever.prompts": ("care_retriever.model.prompts", "0.2.0"),
    "care_retriever.loading": ("care_retriever.model.loading", "0.2.0"),
    "care_retriever.locations": ("care_retriever.model.loading", "0.2.0"),
    "care_retriever.baselines": ("care_retriever.model.baselines", "0.2.0"),
    "care_retriever.towers": ("care_retriever.model.towers", "0.2.0"),
    "care_retriever.corpus": ("care_retriever.indexing.corpus", "0.2.0"),
    "care_retriever.jsonl": ("care_retriever.indexing.corpus", "0.2.0"),
    "care_retriever.writer": ("care_retriever.indexing.writer", "0.2.0"),
    "care_retriever.retriever": ("care_retriever.search.retriever", "0.2.0"),
    "care_retriever.server": ("care_retriever.search.server", "0.2.0"),
    "care_retriever.batching": ("care_retriever.search.batching", "0.2.0"),
    "care_retriever.backends": ("care_retriever.search.backends", "0.2.0"),
    "care_retriever.sql": ("care_retriever.sparse.sqlite_bm25", "0.2.0"),
    # moved under the room that uses them, so that no import runs up the layers (docs/architecture.md)
    "care_retriever.sparse.hybrid": ("care_retriever.search.hybrid", "0.3.0"),
    "care_retriever.evaluation.bm25": ("care_retriever.sparse.bm25", "0.3.0"),
    # the Qdrant store, one module per concern (Qdrant Edge for a folder, qdrant-client for a server)
    "care_retriever.stores.qdrant_store": ("care_retriever.stores.qdrant", "0.3.0"),
}
MOVED: dict[str, str] = {old: new for old, (new, _) in MOVED_MODULES.items()}

# "module:name" -> ("module:name" where it lives, the release that removes the old place). A name whose old module
# still uses it is imported there for that use too; the alias is that callers may import it from there.
# "module:*": every name of the new module (a module ``__getattr__`` that forwards and warns).
MOVED_NAMES: dict[str, tuple[str, str]] = {
    # care_retriever.index is the entry torchrun starts; its names of earlier releases, by its __getattr__ (warns)
    "care_retriever.index:*": ("care_retriever.indexing.distributed:*", "0.2.0"),
    # model.config's names, re-exported by model.embedder for callers of earlier releases
    "care_retriever.model.embedder:CONFIG_NAME": ("care_retriever.model.config:CONFIG_NAME", "0.3.0"),
    "care_retriever.model.embedder:DEFAULT_INSTRUCTION": ("care_retriever.model.config:DEFAULT_INSTRUCTION", "0.3.0"),
    "care_retriever.model.embedder:FORMAT_VERSION": ("care_retriever.model.config:FORMAT_VERSION", "0.3.0"),
    "care_retriever.model.embedder:QUERY_PROMPT_TEMPLATE": (
        "care_retriever.model.config:QUERY_PROMPT_TEMPLATE",
        "0.3.0",
    ),
    "care_retriever.model.embedder:CareConfig": ("care_retriever.model.config:CareConfig", "0.3.0"),
    "care_retriever.model.embedder:TowerInfo": ("care_retriever.model.config:TowerInfo", "0.3.0"),
    # where and how a tower runs, in its own module (model.runtime), re-exported by model.embedder for earlier callers
    **{
        f"care_retriever.model.embedder:{name}": (f"care_retriever.model.runtime:{name}", "0.3.0")
        for name in (
            "DTYPES",
            "auto_dtype",
            "flash_attn_installed",
            "gpu_dtype",
            "native_bf16",
            "resolve_attn_implementation",
            "resolve_device",
            "resolve_dtype",
        )
    },
    # the model's jobs in modules of their own: a tower as a value (model.tower), the ways a model is read
    # (model.reading), what a tower's modules are (model.towers.modules), re-exported by model.embedder
    "care_retriever.model.embedder:Tower": ("care_retriever.model.tower:Tower", "0.3.0"),
    "care_retriever.model.embedder:Side": ("care_retriever.model.tower:Side", "0.3.0"),
    "care_retriever.model.embedder:Load": ("care_retriever.model.reading:Load", "0.3.0"),
    "care_retriever.model.embedder:ROUTES": ("care_retriever.model.reading:ROUTES", "0.3.0"),
    "care_retriever.model.embedder:is_decoder": ("care_retriever.model.towers.modules:is_decoder", "0.3.0"),
    # the model floor's save raises it (care_retriever.model.saving), which may not import training
    "care_retriever.training.runner:DiskFullError": ("care_retriever.errors:DiskFullError", "0.3.0"),
    # the ground floor (docs/architecture.md): a document and JSONL rows, the batch defaults and their parser
    "care_retriever.indexing.corpus:Document": ("care_retriever.documents:Document", "0.3.0"),
    "care_retriever.indexing.corpus:document_text": ("care_retriever.documents:document_text", "0.3.0"),
    "care_retriever.indexing.corpus:iter_jsonl": ("care_retriever.documents:iter_jsonl", "0.3.0"),
    "care_retriever.indexing.config:DOCUMENT_BATCH_SIZE": (
        "care_retriever.model.batch_limits:DOCUMENT_BATCH_SIZE",
        "0.3.0",
    ),
    "care_retriever.indexing.config:CUDA_DOCUMENT_BATCH_SIZE": (
        "care_retriever.model.batch_limits:CUDA_DOCUMENT_BATCH_SIZE",
        "0.3.0",
    ),
    "care_retriever.indexing.config:parse_max_batch_tokens": (
        "care_retriever.model.batch_limits:parse_max_batch_tokens",
        "0.3.0",
    ),
    "care_retriever.model.encoding:BatchLimits": ("care_retriever.model.batch_limits:BatchLimits", "0.3.0"),
}


def removal(old: str) -> str:
    """The release that removes the old module path or name ``old`` (for messages)."""
    return (MOVED_MODULES.get(old) or MOVED_NAMES[old])[1]


def new_path(name: str) -> str | None:
    """The module ``name`` is now, if it is an old path or under one; None otherwise."""
    for old, new in MOVED.items():
        if name == old or name.startswith(old + "."):
            return new + name[len(old) :]
    return None


def _old_root(name: str) -> str:
    return next(old for old in MOVED if name == old or name.startswith(old + "."))


class _Alias(importlib.abc.Loader):
    """Loads an old path as the module at its new path (imported, or already loaded, under that name)."""

    def __init__(self, new: str) -> None:
        self.new = new
        self.spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} moved to {self.new}; the old path goes in release {removal(_old_root(spec.name))}",
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
