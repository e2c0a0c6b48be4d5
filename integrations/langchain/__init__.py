"""LangChain adapters over care-retriever. Requires ``pip install care-retriever[langchain]``.

* :class:`CareEmbeddings`: ``embed_query`` -> query tower, ``embed_documents`` -> document tower;
  works with any LangChain vector store (``FAISS``, ``QdrantVectorStore``, ...).
* :class:`CareVectorStore`: a ``VectorStore`` over a store built by ``care-retriever index``
  (FAISS or Qdrant), opened without re-encoding; ``.as_retriever()`` gives a ``VectorStoreRetriever``.
"""

from care_retriever.integrations.langchain.embeddings import CareEmbeddings
from care_retriever.integrations.langchain.vectorstore import CareVectorStore

__all__ = ["CareEmbeddings", "CareVectorStore"]
