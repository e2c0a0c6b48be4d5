"""care-retriever: CARE, the Chinese medical Asymmetric REtriever.

Data path: corpus -> document tower -> store <- query tower <- query.
Heavy submodules load on first use so ``import care_retriever`` stays cheap and never imports a
framework (haystack, langchain, qdrant).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
    "AsymmetricEmbedder": "care_retriever.embedder",
    "CareConfig": "care_retriever.model_config",  # torch-free: read by search hosts that never import torch
    "QueryEncoder": "care_retriever.embedder_protocol",
    "DocumentEncoder": "care_retriever.embedder_protocol",
    "DocumentStoreWriter": "care_retriever.writer",
    "CareRetriever": "care_retriever.retriever",
    "Hit": "care_retriever.stores.base",
    "Document": "care_retriever.corpus",
    "read_corpus": "care_retriever.corpus",
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
    "__version__",
    "open_store",
    "read_corpus",
]

if TYPE_CHECKING:
    from care_retriever.corpus import Document, read_corpus
    from care_retriever.embedder import AsymmetricEmbedder
    from care_retriever.embedder_protocol import DocumentEncoder, QueryEncoder
    from care_retriever.errors import CareError
    from care_retriever.model_config import CareConfig
    from care_retriever.retriever import CareRetriever
    from care_retriever.stores import open_store
    from care_retriever.stores.base import Hit
    from care_retriever.writer import DocumentStoreWriter


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'care_retriever' has no attribute {name!r}")
