"""How :class:`~care_retriever.integrations.langchain.vectorstore.CareVectorStore` searches the core store, as core
hits: dense (and through the core store's async reads), BM25 alone or hybrid (the store's BM25 side fused with the
dense ranking, as ``care-retriever search --mode hybrid``), and maximal marginal relevance over the stored vectors;
and :class:`CareVectorStoreRetriever`, whose ``search_type`` reaches the hybrid and sparse searches.

These know a core store and a LangChain ``Embeddings`` only; the vector store turns their hits into LangChain
documents, so each search is written once for its sync and async doors.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.vectorstores import VectorStoreRetriever
from langchain_core.vectorstores.utils import maximal_marginal_relevance

from care_retriever.errors import InputError
from care_retriever.integrations.common import as_matrix, prepare_vectors
from care_retriever.sparse.fusion import DEFAULT_FUSION
from care_retriever.stores import VectorStore as CoreStore
from care_retriever.stores.base import Hit
from care_retriever.stores.capabilities import StoredIteration


def check_k(k: int) -> None:
    """Every search's ``k`` (one line before the store is asked)."""
    if k < 1:
        raise InputError(f"k must be >= 1, got {k}")


def dense_hits(store: CoreStore, embedding: list[float], k: int, filter: dict[str, Any] | None) -> list[Hit]:
    """The ``k`` nearest documents to ``embedding`` (as the store's model defines its vectors); none from an
    empty store."""
    check_k(k)
    manifest = store.manifest
    if manifest is None or store.count() == 0:
        return []
    query = prepare_vectors(manifest, as_matrix([embedding], manifest.dim, "query embedding"))
    return store.search(query, k, filter)[0]


async def dense_hits_async(
    store: CoreStore, embedding: list[float], k: int, filter: dict[str, Any] | None
) -> list[Hit]:
    """:func:`dense_hits` through the core store's async reads."""
    check_k(k)
    manifest = store.manifest
    if manifest is None or await store.count_async() == 0:
        return []
    query = prepare_vectors(manifest, as_matrix([embedding], manifest.dim, "query embedding"))
    return (await store.search_async(query, k, filter))[0]


def fused_hits(
    store: CoreStore,
    embeddings: Embeddings,
    query: str,
    k: int,
    filter: dict[str, Any] | None,
    mode: str,
    fusion: str = DEFAULT_FUSION,
    rrf_k: int | None = None,
    dense_weight: float | None = None,
) -> list[Hit]:
    """``mode`` ``sparse``: BM25 alone (no embedding); ``hybrid``: dense and BM25 fused by ``fusion`` (rrf | dbsf |
    wsum, with ``rrf_k`` and ``dense_weight``; None: the CLI's defaults); the store must have a BM25 side."""
    from care_retriever.search.hybrid import hybrid_search, sparse_store
    from care_retriever.sparse.fusion import DEFAULT_DENSE_WEIGHT, DEFAULT_RRF_K, FusionConfig

    check_k(k)
    sparse = sparse_store(store)
    if mode == "sparse":
        return sparse.search_sparse([query], k, filter)[0]
    config = FusionConfig(
        fusion,
        k=DEFAULT_RRF_K if rrf_k is None else rrf_k,
        dense_weight=DEFAULT_DENSE_WEIGHT if dense_weight is None else dense_weight,
    )
    manifest = store.require_manifest()
    vector = prepare_vectors(manifest, as_matrix([embeddings.embed_query(query)], manifest.dim, "query embedding"))
    return hybrid_search(store, vector, [query], k, filter, config)[0]


def mmr_hits(
    store: CoreStore,
    embedding: list[float],
    k: int,
    fetch_k: int,
    lambda_mult: float,
    filter: dict[str, Any] | None,
) -> list[Hit]:
    """``fetch_k`` nearest candidates re-ranked by maximal marginal relevance over their stored vectors."""
    stored = StoredIteration.require(store, "maximal marginal relevance search")
    hits = dense_hits(stored, embedding, max(k, fetch_k), filter)
    if not hits:
        return []
    vectors = stored.vectors([h.id for h in hits])
    pairs = [(h, v) for h, v in zip(hits, vectors, strict=True) if v is not None]
    query = prepare_vectors(store.manifest, np.asarray([embedding], dtype=np.float32))[0]
    chosen = maximal_marginal_relevance(query, [v.tolist() for _, v in pairs], lambda_mult=lambda_mult, k=k)
    return [pairs[i][0] for i in chosen]


class CareVectorStoreRetriever(VectorStoreRetriever):
    """LangChain's vector-store retriever plus ``search_type="hybrid"`` and ``"sparse"``.

    Usage example:
    ```python
    from care_retriever.integrations.langchain import CareEmbeddings, CareVectorStore

    store = CareVectorStore("faiss:stores/care", CareEmbeddings(model="models/care"))
    retriever = store.as_retriever(search_type="hybrid", search_kwargs={"k": 3})
    assert len(retriever.invoke("血压高怎么办")) == 3
    ```

    Its parameters are LangChain's ``VectorStoreRetriever``'s, made by ``CareVectorStore.as_retriever``.
    """

    allowed_search_types = (*VectorStoreRetriever.allowed_search_types, "hybrid", "sparse")

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun, **kwargs: Any
    ) -> list[Document]:
        if self.search_type in ("hybrid", "sparse"):
            return self.vectorstore.search(query, self.search_type, **(self.search_kwargs | kwargs))
        return super()._get_relevant_documents(query, run_manager=run_manager, **kwargs)

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun, **kwargs: Any
    ) -> list[Document]:
        if self.search_type in ("hybrid", "sparse"):
            return await self.vectorstore.asearch(query, self.search_type, **(self.search_kwargs | kwargs))
        return await super()._aget_relevant_documents(query, run_manager=run_manager, **kwargs)
