"""care-retriever's Haystack retrievers: over a :class:`CareFaissDocumentStore`
(:class:`CareFaissEmbeddingRetriever`), or over any store ``care-retriever index`` writes (:class:`CareStoreRetriever`,
:class:`CareStoreBM25Retriever`)."""

from haystack_integrations.components.retrievers.care_retriever.retriever import CareFaissEmbeddingRetriever
from haystack_integrations.components.retrievers.care_retriever.store_retriever import (
    CareStoreBM25Retriever,
    CareStoreRetriever,
)

__all__ = ["CareFaissEmbeddingRetriever", "CareStoreBM25Retriever", "CareStoreRetriever"]
