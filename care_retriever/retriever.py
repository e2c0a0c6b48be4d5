"""``CareRetriever``: query -> query tower -> store. The search path loads only the query tower."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, overload

from care_retriever.errors import InputError
from care_retriever.stores import Hit, VectorStore, open_store
from care_retriever.stores.base import Filters


class CareRetriever:
    """Search a store built by :class:`~care_retriever.writer.DocumentStoreWriter` with the same model."""

    def __init__(self, store: str | VectorStore, embedder: Any, *, collection: str | None = None,
                 instruction: str | None = None) -> None:
        self.store = open_store(store, collection=collection)
        self.embedder = embedder
        self.instruction = instruction
        self.store.check_compatible(embedder.space_fingerprint, embedder.dim)

    @classmethod
    def from_pretrained(cls, model: str, store: str, *, collection: str | None = None, device: str | None = None,
                        backend: str = "auto", **kwargs: Any) -> CareRetriever:
        """Load the query tower of ``model`` only, and open ``store``.

        ``backend``: ``auto | torch | onnx``; ``auto`` takes the folder's ONNX export
        (``care-retriever export``) when it has one. onnx never imports torch.
        """
        from care_retriever.backends import load_query_embedder

        store_obj = open_store(store, collection=collection)
        store_obj.require_manifest()
        embedder = load_query_embedder(model, backend, device=device)
        return cls(store_obj, embedder, **kwargs)

    @overload
    def search(self, query: str, top_k: int = 10, filters: Filters | None = None) -> list[Hit]: ...
    @overload
    def search(self, query: Sequence[str], top_k: int = 10, filters: Filters | None = None) -> list[list[Hit]]: ...

    def search(self, query: str | Sequence[str], top_k: int = 10, filters: Filters | None = None):
        """Top-``k`` hits for one query (a list of hits) or a batch of queries (a list of lists)."""
        single = isinstance(query, str)
        queries = [query] if single else list(query)
        for i, q in enumerate(queries):
            if not isinstance(q, str) or not q.strip():
                raise InputError(f"query {i}: empty query" if not single else "empty query")
        if top_k < 1:
            raise InputError(f"top_k must be >= 1, got {top_k}")
        if not queries:
            return []
        vectors = self.embedder.embed_queries(queries, instruction=self.instruction)
        hits = self.store.search(vectors, top_k, filters)
        return hits[0] if single else hits

    def close(self) -> None:
        self.store.close()
