"""Searching a Qdrant server's collection: dense (rescored quantized codes), BM25 as a sparse vector with the
server's IDF, hybrid search fused by the server's Query API (prefetch + rrf / dbsf); the BM25 side added afterwards.

A mixin of :class:`~care_retriever.stores.qdrant.server.ServerStore` (its client, collection and lock).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from care_retriever.documents import Document
from care_retriever.errors import InputError, StoreError
from care_retriever.stores.base import Filters, Hit, Manifest
from care_retriever.stores.config import QdrantCollectionConfig, QdrantQuantize
from care_retriever.stores.qdrant import filter_tree
from care_retriever.stores.qdrant.common import filter_conditions, hit_of, is_server, query_rows


class ClientTerms:
    """:class:`~.filter_tree.QdrantTerms` of qdrant-client's models (a server, or the client's local mode)."""

    def match(self, key: str, value: str | int | bool) -> Any:
        from qdrant_client import models

        return models.FieldCondition(key=key, match=models.MatchValue(value=value))  # JSON keeps a bool a bool

    def match_any(self, key: str, values: list[str]) -> Any:
        from qdrant_client import models

        return models.FieldCondition(key=key, match=models.MatchAny(any=values))

    def number_range(self, key: str, **bounds: float) -> Any:
        from qdrant_client import models

        return models.FieldCondition(key=key, range=models.Range(**bounds))

    def date_range(self, key: str, **bounds: str) -> Any:
        from qdrant_client import models

        dates = {name: datetime.fromisoformat(text.replace("Z", "+00:00")) for name, text in bounds.items()}
        return models.FieldCondition(key=key, range=models.DatetimeRange(**dates))

    def is_empty(self, key: str) -> Any:
        from qdrant_client import models

        return models.IsEmptyCondition(is_empty=models.PayloadField(key=key))

    def nothing(self) -> Any:
        from qdrant_client import models

        return models.HasIdCondition(has_id=[])

    def filter(
        self, must: list[Any] | None = None, should: list[Any] | None = None, must_not: list[Any] | None = None
    ) -> Any:
        from qdrant_client import models

        return models.Filter(must=must, should=should, must_not=must_not)


class ServerSearch:
    client: Any
    collection: str
    location: str
    manifest: Manifest | None
    _lock: threading.Lock | contextlib.nullcontext[None]

    if TYPE_CHECKING:  # provided by the store (declared for the type checker only: a body here would shadow them)

        def require_manifest(self) -> Manifest: ...
        def describe(self) -> str: ...
        def count(self, filters: Filters | None = None) -> int: ...

    def _hits(self, points: Sequence[Any]) -> list[Hit]:
        return [hit_of(p.payload, p.score) for p in points]

    def _filter(self, filters: Filters | None) -> Any:
        """The metadata filters as a qdrant-client filter, built as Edge's is (:mod:`.filter_tree`)."""
        return filter_tree.build(ClientTerms(), filter_conditions(filters))

    def search_params(self) -> Any:
        """Search parameters of a quantized collection on a server: rescore ``oversample`` x ``top_k`` candidates
        from the original vectors. None without quantization, and in local mode (it searches exactly)."""
        options = QdrantCollectionConfig.from_manifest(self.require_manifest().index).resolved()
        if options.quantize is QdrantQuantize.NONE or not is_server(self.location):
            return None
        from qdrant_client import models

        return models.SearchParams(
            quantization=models.QuantizationSearchParams(rescore=True, oversampling=options.oversample)
        )

    def search(
        self, vectors: np.ndarray, top_k: int, filters: Filters | None = None, *, payload: bool = True
    ) -> list[list[Hit]]:
        from qdrant_client import models

        vectors = query_rows(vectors, top_k, self.require_manifest().dim)
        flt = self._filter(filters)
        fields = True if payload else ["doc_id"]
        params = self.search_params()
        requests = [
            models.QueryRequest(query=v.tolist(), limit=top_k, filter=flt, with_payload=fields, params=params)
            for v in vectors
        ]
        if not requests:
            return []
        with self._lock:
            responses = self.client.query_batch_points(self.collection, requests)
        return [self._hits(response.points) for response in responses]

    def enable_sparse(self, *, rebuild: bool = False, show_progress: bool = False) -> int:
        """Write the BM25 sparse vector of every stored point (nothing re-encoded); commit() saves the manifest."""
        from tqdm.auto import tqdm

        from care_retriever.sparse import sparse_entry
        from care_retriever.sparse.qdrant_sparse import VECTOR, document_vector
        from care_retriever.sparse.tokenizer import tokenize, tokenizer_spec

        manifest = self.require_manifest()
        if manifest.sparse and manifest.sparse.get("tokenizer") == tokenizer_spec() and not rebuild:
            return 0
        with self._lock:
            info = self.client.get_collection(self.collection)
        if VECTOR not in (info.config.params.sparse_vectors or {}):
            raise StoreError(
                f"{self.describe()}: the collection was created without a '{VECTOR}' sparse vector "
                "(before care-retriever had hybrid search); index into a new collection"
            )
        from qdrant_client import models

        entry = sparse_entry("qdrant-sparse", vector=VECTOR, avgdl=0.0)
        done, offset = 0, None
        total = self.count()
        with tqdm(total=total, desc="Sparse index", unit="doc", disable=not show_progress or not total) as bar:
            while True:
                with self._lock:
                    points, offset = self.client.scroll(
                        self.collection, limit=512, offset=offset, with_payload=["text", "title"], with_vectors=False
                    )
                if points:
                    texts = [
                        Document(id="", text=p.payload["text"], title=p.payload.get("title", "")).embedding_text()
                        for p in points
                    ]
                    tokens = tokenize(texts)
                    if not entry["avgdl"]:
                        entry["avgdl"] = max(sum(map(len, tokens)) / len(tokens), 1.0)
                    updates = [
                        models.PointVectors(id=p.id, vector={VECTOR: document_vector(t, entry["avgdl"])})
                        for p, t in zip(points, tokens, strict=True)
                    ]
                    with self._lock:
                        self.client.update_vectors(self.collection, updates, wait=True)
                    done += len(points)
                    bar.update(len(points))
                if offset is None:
                    break
        manifest.sparse = entry
        return done

    def search_sparse(
        self, queries: Sequence[str], top_k: int, filters: Filters | None = None, *, payload: bool = True
    ) -> list[list[Hit]]:
        """BM25 top-``k`` for each query text, scored by Qdrant (IDF modifier)."""
        return self.search_hybrid(None, queries, top_k, filters, fusion=None, payload=payload)

    # fused server-side by the Query API; wsum fuses in care_retriever.search.hybrid
    hybrid_fusions: ClassVar[tuple[str, ...]] = ("rrf", "dbsf")

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
        """Dense + BM25 prefetches fused server-side (``fusion.method`` rrf or dbsf) through the Query API.

        ``vectors`` None: BM25 only. A query with no indexed token gets its dense hits alone.
        """
        from qdrant_client import models

        from care_retriever.sparse import require_sparse
        from care_retriever.sparse.qdrant_sparse import VECTOR, query_vector
        from care_retriever.sparse.tokenizer import tokenize

        require_sparse(self)
        if top_k < 1:
            raise InputError(f"top_k must be >= 1, got {top_k}")
        flt = self._filter(filters)
        fields = True if payload else ["doc_id"]
        params = self.search_params() if vectors is not None else None  # rescoring applies to the dense side
        requests = []
        for i, tokens in enumerate(tokenize(list(queries))):
            sparse = (
                models.Prefetch(
                    query=query_vector(tokens), using=VECTOR, limit=fusion.candidates if fusion else top_k, filter=flt
                )
                if tokens
                else None
            )
            if vectors is None:
                request = (
                    models.QueryRequest(query=sparse.query, using=VECTOR, limit=top_k, filter=flt, with_payload=fields)
                    if sparse
                    else None
                )
            elif sparse is None:
                request = models.QueryRequest(
                    query=vectors[i].tolist(), limit=top_k, filter=flt, with_payload=fields, params=params
                )
            else:
                dense = models.Prefetch(query=vectors[i].tolist(), limit=fusion.candidates, filter=flt, params=params)
                # Qdrant's RRF gives rank r (from 1) 1 / (k + r - 1); ours (and ranx's) 1 / (k + r): pass k + 1.
                query = (
                    models.RrfQuery(rrf=models.Rrf(k=fusion.k + 1))
                    if fusion.method == "rrf"
                    else models.FusionQuery(fusion=models.Fusion.DBSF)
                )
                request = models.QueryRequest(prefetch=[dense, sparse], query=query, limit=top_k, with_payload=fields)
            requests.append(request)
        live = [r for r in requests if r is not None]
        with self._lock:
            responses = iter(self.client.query_batch_points(self.collection, live) if live else [])
        return [self._hits(next(responses).points) if r is not None else [] for r in requests]
