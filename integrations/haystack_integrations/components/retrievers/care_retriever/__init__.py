"""care-retriever's Haystack retrievers: over :class:`CareFaissDocumentStore`
(:class:`CareFaissEmbeddingRetriever`) and over any store ``care-retriever index`` writes
(:class:`CareStoreRetriever`, :class:`CareStoreBM25Retriever`)."""

from haystack_integrations.components.retrievers.care_retriever.embedding_retriever import CareFaissEmbeddingRetriever
from haystack_integrations.components.retrievers.care_retriever.store_retriever import (
    CareStoreBM25Retriever,
    CareStoreRetriever,
)

__all__ = ["CareFaissEmbeddingRetriever", "CareStoreBM25Retriever", "CareStoreRetriever"]
