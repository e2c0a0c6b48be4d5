"""care-retriever's Haystack document store: :class:`CareFaissDocumentStore`, a FAISS folder in the format
``care-retriever index --store faiss:DIR`` writes."""

from haystack_integrations.document_stores.care_retriever.document_store import CareFaissDocumentStore

__all__ = ["CareFaissDocumentStore"]
