"""Haystack components over care-retriever. Requires ``pip install care-retriever[haystack]``.

* :class:`CareTextEmbedder` (query tower) and :class:`CareDocumentEmbedder` (document tower) work
  with any Haystack document store (InMemory, Qdrant, ...).
* :class:`CareFaissDocumentStore` + :class:`CareFaissEmbeddingRetriever` read and write the folder
  format of ``care-retriever index --store faiss:DIR``.
* :class:`CareStoreRetriever` searches any store ``care-retriever index`` writes (``faiss:DIR``,
  ``qdrant:PATH``, ``qdrant:http://host:6333``), e.g. a Qdrant collection qdrant-haystack cannot read.

The components live in Haystack's integrations namespace, where a saved pipeline finds them
(``haystack_integrations.components.embedders.care_retriever``, ``...retrievers.care_retriever``,
``haystack_integrations.document_stores.care_retriever``); this module names them for code.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from haystack_integrations.components.embedders.care_retriever.document_embedder import CareDocumentEmbedder
    from haystack_integrations.components.embedders.care_retriever.text_embedder import CareTextEmbedder
    from haystack_integrations.components.retrievers.care_retriever.retriever import CareFaissEmbeddingRetriever
    from haystack_integrations.components.retrievers.care_retriever.store_retriever import (
        CareStoreBM25Retriever,
        CareStoreRetriever,
    )
    from haystack_integrations.document_stores.care_retriever.document_store import CareFaissDocumentStore

# Each name's module, imported when the name is first read: the components import this package's filters module,
# so a process that imports a component first (as Pipeline.loads does) would meet this package half-initialised.
_MODULES = {
    "CareDocumentEmbedder": "haystack_integrations.components.embedders.care_retriever.document_embedder",
    "CareTextEmbedder": "haystack_integrations.components.embedders.care_retriever.text_embedder",
    "CareFaissEmbeddingRetriever": "haystack_integrations.components.retrievers.care_retriever.retriever",
    "CareStoreBM25Retriever": "haystack_integrations.components.retrievers.care_retriever.store_retriever",
    "CareStoreRetriever": "haystack_integrations.components.retrievers.care_retriever.store_retriever",
    "CareFaissDocumentStore": "haystack_integrations.document_stores.care_retriever.document_store",
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
    if name in _MODULES:
        return getattr(import_module(_MODULES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
