"""Haystack components over care-retriever. Requires ``pip install care-retriever[haystack]``.

* :class:`CareTextEmbedder` (query tower) and :class:`CareDocumentEmbedder` (document tower) work
  with any Haystack document store (InMemory, Qdrant, ...).
* :class:`CareFaissDocumentStore` + :class:`CareFaissEmbeddingRetriever` read and write the folder
  format of ``care-retriever index --store faiss:DIR``.
* :class:`CareStoreRetriever` searches any store ``care-retriever index`` writes (``faiss:DIR``,
  ``qdrant:PATH``, ``qdrant:http://host:6333``), e.g. a Qdrant collection qdrant-haystack cannot read.
"""

from care_retriever.integrations.haystack.document_embedder import CareDocumentEmbedder
from care_retriever.integrations.haystack.document_store import CareFaissDocumentStore
from care_retriever.integrations.haystack.retriever import CareFaissEmbeddingRetriever
from care_retriever.integrations.haystack.store_retriever import CareStoreBM25Retriever, CareStoreRetriever
from care_retriever.integrations.haystack.text_embedder import CareTextEmbedder

__all__ = [
    "CareDocumentEmbedder",
    "CareFaissDocumentStore",
    "CareFaissEmbeddingRetriever",
    "CareStoreBM25Retriever",
    "CareStoreRetriever",
    "CareTextEmbedder",
]
