"""Hybrid search over a store: its dense and BM25 rankings for the same query, fused.

One definition, used by ``CareRetriever.search(mode="hybrid")`` and the Haystack and LangChain
adapters, so they return the same hits. A store that fuses itself declares the fusions it runs in
``hybrid_fusions`` and gets the query through its ``search_hybrid``: Qdrant fuses RRF and DBSF on the
server (Query API), the FAISS store fuses every method on row ids; anything else fuses here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from care_retriever.sparse import require_sparse
from care_retriever.sparse.fusion import FusionConfig, fuse
from care_retriever.stores.base import Filters, Hit, VectorStore
from care_retriever.stores.capabilities import SparseSearch


def sparse_store(store: VectorStore) -> SparseSearch:
    """``store`` as one that searches its BM25 side: one line when its kind has no sparse search
    (:class:`~care_retriever.stores.capabilities.SparseSearch`), or when it has not built the side yet
    (:func:`~care_retriever.sparse.require_sparse`).

    :param store: the store sparse or hybrid search runs on.
    """
    checked = SparseSearch.require(store, "sparse and hybrid search")
    require_sparse(checked)
    return checked


def hybrid_search(
    store: VectorStore,
    vectors: np.ndarray,
    queries: Sequence[str],
    top_k: int,
    filters: Filters | None = None,
    fusion: FusionConfig | None = None,
) -> list[list[Hit]]:
    """Top-``k`` fused hits per query; a query with no indexed token (punctuation, stop words) gets its dense hits."""
    store = sparse_store(store)
    fusion = fusion or FusionConfig()
    if fusion.method in store.hybrid_fusions:
        return store.search_hybrid(vectors, list(queries), top_k, filters, fusion=fusion)
    depth = max(fusion.candidates, top_k)
    # Candidates are ids and scores only: the documents of the fused top-k are read once, at the end
    # (reading 2 x 100 documents a query cost more than the BM25 scoring itself).
    dense = store.search(vectors, depth, filters, payload=False)
    sparse = store.search_sparse(list(queries), depth, filters, payload=False)
    ranked: list[list[tuple[str, float]]] = []
    for dense_hits, sparse_hits in zip(dense, sparse, strict=True):
        candidates = [(h.id, h.score) for h in dense_hits]
        ranked.append(fuse(candidates, [(h.id, h.score) for h in sparse_hits], fusion) if sparse_hits else candidates)
    wanted = list({d for row in ranked for d, _ in row[:top_k]})
    docs = dict(zip(wanted, store.get(wanted), strict=True))
    return [
        [
            Hit(id=d, score=s, text=doc.text, title=doc.title, metadata=doc.metadata)
            for d, s in row[:top_k]
            if (doc := docs[d]) is not None  # deleted between the two reads: left out, as a search would
        ]
        for row in ranked
    ]
