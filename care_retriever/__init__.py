"""care-retriever: CARE, the Chinese medical Asymmetric REtriever.

Data path: corpus -> document tower -> store <- query tower <- query; in the folders: ``indexing/`` (corpus,
writer) -> ``model/`` (towers, embedder) -> ``stores/`` <- ``search/`` (retriever, server, exported query towers)
(docs/architecture.md).
Heavy submodules load on first use so ``import care_retriever`` stays cheap and never imports a
framework (haystack, langchain, qdrant).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from care_retriever.version import __version__

_LAZY = {
    "AsymmetricEmbedder": "care_retriever.model.embedder",
    "CareConfig": "care_retriever.model.config",
    "TowerPairing": "care_retriever.model.pairing",  # torch-free: read by search hosts that never import torch
    "QueryEncoder": "care_retriever.model.protocols",
    "DocumentEncoder": "care_retriever.model.protocols",
    "DocumentStoreWriter": "care_retriever.indexing.writer",
    "CareRetriever": "care_retriever.search.retriever",
    "Hit": "care_retriever.stores.base",
    "Document": "care_retriever.documents",
    "read_corpus": "care_retriever.indexing.corpus",
    "open_store": "care_retriever.stores",
    "CareError": "care_retriever.errors",
}

__all__ = [
    "AsymmetricEmbedder",
    "CareConfig",
    "CareError",
    "CareRetriever",
    "Document",
    "DocumentEncoder",
    "DocumentStoreWriter",
    "Hit",
    "QueryEncoder",
    "TowerPairing",
    "__version__",
    "open_store",
    "read_corpus",
]

if TYPE_CHECKING:
    from care_retriever.documents import Document
    from care_retriever.errors import CareError
    from care_retriever.indexing.corpus import read_corpus
    from care_retriever.indexing.writer import DocumentStoreWriter
    from care_retriever.model.config import CareConfig
    from care_retriever.model.embedder import AsymmetricEmbedder
    from care_retriever.model.pairing import TowerPairing
    from care_retriever.model.protocols import DocumentEncoder, QueryEncoder
    from care_retriever.search.retriever import CareRetriever
    from care_retriever.stores import open_store
    from care_retriever.stores.base import Hit


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'care_retriever' has no attribute {name!r}")
