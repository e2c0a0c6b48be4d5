"""care-retriever's Haystack document store over the folder ``care-retriever index --store faiss:DIR`` writes."""

from haystack_integrations.document_stores.care_retriever.document_store import CareFaissDocumentStore

__all__ = ["CareFaissDocumentStore"]
