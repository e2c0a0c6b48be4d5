"""Hybrid search over a store: its dense and BM25 rankings for the same query, fused.

One definition, used by ``CareRetriever.search(mode="hybrid")`` and the Haystack and LangChain
adapters, so they return the same hits. A store with server-side fusion (Qdrant's Query API:
``search_hybrid``) fuses RRF and DBSF there; ``wsum`` (and every FAISS store) fuses here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from care_retriever.sparse.fusion import FusionConfig, fuse
from care_retriever.stores.base import Filters, Hit


def hybrid_search(
    store: Any,
    vectors: np.ndarray,
    queries: Sequence[str],
    top_k: int,
    filters: Filters | None = None,
    fusion: FusionConfig | None = None,
) -> list[list[Hit]]:
    """Top-``k`` fused hits per query; a query with no indexed token (punctuation, stop words) gets its dense hits."""
    fusion = fusion or FusionConfig()
    server_side = getattr(store, "search_hybrid", None)
    if server_side is not None and fusion.method in ("rrf", "dbsf"):
        return server_side(vectors, list(queries), top_k, filters, fusion=fusion)
    depth = max(fusion.candidates, top_k)
    dense = store.search(vectors, depth, filters)
    sparse = store.search_sparse(list(queries), depth, filters)
    out = []
    for dense_hits, sparse_hits in zip(dense, sparse, strict=True):
        if not sparse_hits:
            out.append(dense_hits[:top_k])
            continue
        by_id = {h.id: h for h in (*sparse_hits, *dense_hits)}
        fused = fuse([(h.id, h.score) for h in dense_hits], [(h.id, h.score) for h in sparse_hits], fusion)
        out.append(
            [
                Hit(id=d, score=s, text=by_id[d].text, title=by_id[d].title, metadata=by_id[d].metadata)
                for d, s in fused[:top_k]
            ]
        )
    return out
