"""Haystack components over care-retriever. Requires ``pip install care-retriever[haystack]``.

The components are defined in the ``haystack_integrations`` namespace, where Haystack's own integrations live
and which ``Pipeline.loads`` trusts; this package names them too:

* :class:`CareTextEmbedder` (query tower) and :class:`CareDocumentEmbedder` (document tower)
  (``haystack_integrations.components.embedders.care_retriever``) work with any Haystack document store.
* :class:`CareFaissDocumentStore` (``haystack_integrations.document_stores.care_retriever``) +
  :class:`CareFaissEmbeddingRetriever` read and write the folder format of ``care-retriever index --store faiss:DIR``.
* :class:`CareStoreRetriever` and :class:`CareStoreBM25Retriever`
  (``haystack_integrations.components.retrievers.care_retriever``) search any store ``care-retriever index``
  writes (``faiss:DIR``, ``qdrant:PATH``, ``qdrant:http://host:6333``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from haystack_integrations.components.embedders.care_retriever import CareDocumentEmbedder, CareTextEmbedder
    from haystack_integrations.components.retrievers.care_retriever import (
        CareFaissEmbeddingRetriever,
        CareStoreBM25Retriever,
        CareStoreRetriever,
    )
    from haystack_integrations.document_stores.care_retriever import CareFaissDocumentStore

# Resolved on first use: the components import this package's filters module, so importing them here at import
# time would be a cycle whenever a pipeline loader imports `haystack_integrations.*` first.
_HOMES = {
    "CareDocumentEmbedder": "haystack_integrations.components.embedders.care_retriever",
    "CareTextEmbedder": "haystack_integrations.components.embedders.care_retriever",
    "CareFaissEmbeddingRetriever": "haystack_integrations.components.retrievers.care_retriever",
    "CareStoreBM25Retriever": "haystack_integrations.components.retrievers.care_retriever",
    "CareStoreRetriever": "haystack_integrations.components.retrievers.care_retriever",
    "CareFaissDocumentStore": "haystack_integrations.document_stores.care_retriever",
}

__all__ = [
    "CareDocumentEmbedder",
    "CareFaissDocumentStore",
    "CareFaissEmbeddingRetriever",
    "CareStoreBM25Retriever",
    "CareStoreRetriever",
    "CareTextEmbedder",
]


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
