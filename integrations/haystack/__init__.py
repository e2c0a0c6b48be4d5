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

from haystack_integrations.components.embedders.care_retriever.document_embedder import CareDocumentEmbedder
from haystack_integrations.components.embedders.care_retriever.text_embedder import CareTextEmbedder
from haystack_integrations.components.retrievers.care_retriever.retriever import CareFaissEmbeddingRetriever
from haystack_integrations.components.retrievers.care_retriever.store_retriever import (
    CareStoreBM25Retriever,
    CareStoreRetriever,
)
from haystack_integrations.document_stores.care_retriever.document_store import CareFaissDocumentStore

__all__ = [
    "CareDocumentEmbedder",
    "CareFaissDocumentStore",
    "CareFaissEmbeddingRetriever",
    "CareStoreBM25Retriever",
    "CareStoreRetriever",
    "CareTextEmbedder",
]
