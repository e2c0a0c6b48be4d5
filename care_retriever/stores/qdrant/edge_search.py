"""Searching a Qdrant Edge store: dense (HNSW, rescored quantized codes), BM25 as a sparse vector with the
engine's IDF, and hybrid search fused in the engine (prefetch + rrf / dbsf); the BM25 side added afterwards.

A mixin of :class:`~care_retriever.stores.qdrant.edge_store.EdgeStore`: its methods run under the store's lock,
through the engine adapter (:mod:`care_retriever.stores.qdrant.edge`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from care_retriever.documents import Document
from care_retriever.errors import InputError
from care_retriever.stores.base import Filters, Hit, Manifest
from care_retriever.stores.config import QdrantCollectionConfig, QdrantQuantize
from care_retriever.stores.qdrant import edge
from care_retriever.stores.qdrant.common import filter_conditions, hit_of, query_rows

# The search-time HNSW ``ef`` of an Edge store that records none. Edge's own default (its ef_construct, 100) gave
# recall@10 0.80-0.84 against exact search on benchmarks/qdrant_edge_quick.py's 20,000 clustered 768-d vectors;
# 512 gave 0.997-0.998 at about 3-4 ms a query on this 2-core machine. ``--ef-search`` (or ``index_options``)
# overrides it per store.
DEFAULT_EF_SEARCH = 512


class EdgeSearch:
    manifest: Manifest | None
    _lock: threading.RLock

    if TYPE_CHECKING:  # provided by the store (declared for the type checker only: a body here would shadow them)

        def require_manifest(self) -> Manifest: ...
        def require_shard(self) -> edge.EdgeShard: ...
        def count(self, filters: Any = None) -> int: ...
        def scroll(
            self, payload: bool | Sequence[str] = True, vectors: bool = False, batch: int = 256
        ) -> Iterator[list[edge.EdgeRecord]]: ...

    hybrid_fusions: ClassVar[tuple[str, ...]] = (
        "rrf",
        "dbsf",
    )  # fused in the engine; wsum fuses in care_retriever.search.hybrid

    def search_params(self) -> Any:
        """HNSW's ``ef`` (``ef_search`` if given, else :data:`DEFAULT_EF_SEARCH`) and, for quantized codes,
        rescoring ``oversample`` x ``top_k`` candidates from the original vectors."""
        options = QdrantCollectionConfig.from_manifest(self.require_manifest().index).resolved()
        quantized = options.quantize is not QdrantQuantize.NONE
        ef = options.ef_search if options.ef_search is not None else DEFAULT_EF_SEARCH
        return self.require_shard().search_params(ef, options.oversample if quantized else None)

    def search(
        self, vectors: np.ndarray, top_k: int, filters: Filters | None = None, *, payload: bool = True
    ) -> list[list[Hit]]:
        vectors = query_rows(vectors, top_k, self.require_manifest().dim)
        conditions = filter_conditions(filters)
        fields: bool | list[str] = True if payload else ["doc_id"]
        with self._lock:
            shard = self.require_shard()
            params = self.search_params()
            requests = [
                shard.request(
                    shard.dense_query(v.tolist()), top_k, conditions=conditions, payload=fields, params=params
                )
                for v in vectors
            ]
            answers = shard.query_batch(requests)
        return [[hit_of(r.payload, r.score) for r in records] for records in answers]

    def search_sparse(
        self, queries: Sequence[str], top_k: int, filters: Filters | None = None, *, payload: bool = True
    ) -> list[list[Hit]]:
        """BM25 top-``k`` for each query text, scored by the engine (IDF modifier)."""
        return self.search_hybrid(None, queries, top_k, filters, fusion=None, payload=payload)

    def search_hybrid(
        self,
        vectors: np.ndarray | None,
        queries: Sequence[str],
        top_k: int,
        filters: Filters | None = None,
        *,
        fusion: Any = None,
        payload: bool = True,
    ) -> list[list[Hit]]:
        """Dense + BM25 candidates fused in the engine (``fusion.method`` rrf or dbsf). ``vectors`` None: BM25
        only. A query with no indexed token gets its dense hits alone."""
        from care_retriever.sparse import require_sparse
        from care_retriever.sparse.qdrant_sparse import query_terms
        from care_retriever.sparse.tokenizer import tokenize

        require_sparse(self)  # type: ignore[arg-type]  # a mixin of a VectorStore
        if top_k < 1:  # a BM25-only query has no rows to check it with
            raise InputError(f"top_k must be >= 1, got {top_k}")
        dense_vectors = query_rows(vectors, top_k, self.require_manifest().dim) if vectors is not None else None
        conditions = filter_conditions(filters)
        fields: bool | list[str] = True if payload else ["doc_id"]
        with self._lock:
            shard = self.require_shard()
            params = self.search_params() if dense_vectors is not None else None
            requests: list[Any] = []
            for i, tokens in enumerate(tokenize(list(queries))):
                sparse = shard.sparse_query(query_terms(tokens)) if tokens else None
                dense = shard.dense_query(dense_vectors[i].tolist()) if dense_vectors is not None else None
                if dense is None:
                    request = shard.request(sparse, top_k, conditions=conditions, payload=fields) if sparse else None
                elif sparse is None:
                    request = shard.request(dense, top_k, conditions=conditions, payload=fields, params=params)
                else:
                    request = shard.fused_request(
                        dense,
                        sparse,
                        top_k,
                        fusion.candidates,
                        method=fusion.method,
                        rrf_k=fusion.k,
                        conditions=conditions,
                        payload=fields,
                        params=params,
                    )
                requests.append(request)
            answers = iter(shard.query_batch([r for r in requests if r is not None]))
        return [[hit_of(h.payload, h.score) for h in next(answers)] if r is not None else [] for r in requests]

    def enable_sparse(self, *, rebuild: bool = False, show_progress: bool = False) -> int:
        """Write the BM25 sparse vector of every stored point (nothing re-encoded); commit() saves the manifest."""
        from tqdm.auto import tqdm

        from care_retriever.sparse import sparse_entry
        from care_retriever.sparse.qdrant_sparse import VECTOR, document_terms
        from care_retriever.sparse.tokenizer import tokenize, tokenizer_spec

        manifest = self.require_manifest()
        if manifest.sparse and manifest.sparse.get("tokenizer") == tokenizer_spec() and not rebuild:
            return 0
        entry = sparse_entry("qdrant-sparse", vector=VECTOR, avgdl=0.0)
        done, total = 0, self.count()
        with tqdm(total=total, desc="Sparse index", unit="doc", disable=not show_progress or not total) as bar:
            for records in list(self.scroll(["doc_id", "text", "title"], False, 512)):
                texts = [
                    Document(id="", text=r.payload["text"], title=r.payload.get("title", "")).embedding_text()
                    for r in records
                ]
                tokens = tokenize(texts)
                if not entry["avgdl"]:
                    entry["avgdl"] = max(sum(map(len, tokens)) / len(tokens), 1.0)
                terms = {
                    r.id: document_terms(t, entry["avgdl"], entry["k1"], entry["b"])
                    for r, t in zip(records, tokens, strict=True)
                }
                with self._lock:
                    self.require_shard().set_sparse(terms)
                done += len(records)
                bar.update(len(records))
        manifest.sparse = entry
        return done
