"""Hybrid models for the evaluation harness: a dense model and the ``bm25`` baseline, fused per query.

Retrieval fuses each query's top-``depth`` dense ranking with its top-``depth`` BM25 ranking with
:func:`care_retriever.sparse.fusion.fuse`, the code ``CareRetriever.search(mode="hybrid")`` runs, so
``eval --mode hybrid`` measures what ``search --mode hybrid`` returns. A query without any indexed
token keeps its dense ranking (as search does). Rerank and STS have no sparse side: they use the
dense model alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from care_retriever.evaluation.tasks import instruction_for
from care_retriever.sparse.bm25 import BM25Model
from care_retriever.sparse.fusion import FusionConfig, fuse


def mode_label(name: str, mode: str, fusion: FusionConfig) -> str:
    """``M`` (dense), ``M+bm25 (rrf k=10)`` (hybrid): the row label in tables."""
    if mode == "dense":
        return name
    detail = {"rrf": f"rrf k={fusion.k}", "dbsf": "dbsf", "wsum": f"wsum {fusion.dense_weight:g}"}[fusion.method]
    return f"{name}+bm25 ({detail})"


class HybridModel:
    """``dense`` (any embedder of the harness) + :class:`BM25Model`, fused by ``fusion``."""

    kind = "hybrid"

    def __init__(self, dense: Any, fusion: FusionConfig | None = None) -> None:
        self.dense = dense
        self.fusion = fusion or FusionConfig()
        self.bm25 = BM25Model()

    def __getattr__(self, name: str) -> Any:  # embed_queries / embed_documents / dim for rerank and STS
        return getattr(self.dense, name)

    def retrieve(
        self,
        corpus_texts: list[str],
        queries: list[str],
        *,
        instruction: str | None,
        top_k: int,
        doc_batch_size: int,
        query_batch_size: int,
        show_progress: bool,
        search: Any,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(scores, indices)`` of the fused rankings (``-1`` pads rows shorter than ``top_k``)."""
        depth = max(self.fusion.candidates, top_k)
        docs = self.dense.embed_documents(corpus_texts, batch_size=doc_batch_size, show_progress=show_progress)
        vectors = self.dense.embed_queries(
            queries,
            instruction=instruction_for(self.dense, instruction),
            batch_size=query_batch_size,
            show_progress=show_progress,
        )
        dense_scores, dense_idx = search(docs, vectors, depth)
        self.bm25.index(corpus_texts, show_progress=show_progress)
        sparse_idx, sparse_scores = self.bm25.search(queries, depth)
        k = min(top_k, len(corpus_texts))
        scores = np.zeros((len(queries), k), dtype=np.float32)
        indices = np.full((len(queries), k), -1, dtype=np.int64)
        for row in range(len(queries)):
            dense = [(int(i), float(s)) for i, s in zip(dense_idx[row], dense_scores[row], strict=True) if i >= 0]
            # bm25s pads with zero-score documents: a zero BM25 score means no shared token, not a match
            sparse = [(int(i), float(s)) for i, s in zip(sparse_idx[row], sparse_scores[row], strict=True) if s > 0]
            fused = fuse(dense, sparse, self.fusion)[:k] if sparse else dense[:k]
            for col, (doc, score) in enumerate(fused):
                indices[row, col], scores[row, col] = doc, score
        return scores, indices
