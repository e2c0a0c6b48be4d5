"""``CareRetriever``: query -> query tower -> store. The search path loads only the query tower.

``mode``: ``dense`` (the query tower), ``sparse`` (the store's BM25 side, no model call) or ``hybrid``
(both, fused: see :mod:`care_retriever.sparse.fusion`; a Qdrant store fuses RRF/DBSF server-side).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, overload

import numpy as np

from care_retriever.errors import InputError
from care_retriever.model.protocols import QueryEncoder
from care_retriever.search.hybrid import hybrid_search, sparse_store
from care_retriever.sparse import FusionConfig, check_mode
from care_retriever.stores import Hit, VectorStore, open_store
from care_retriever.stores.base import Filters


class CareRetriever:
    """Search a store with the query tower of the model that built it.

    Usage example:
    ```python
    from care_retriever import CareRetriever

    retriever = CareRetriever.from_pretrained("models/care", "faiss:stores/care")
    hits = retriever.search("高血压患者的饮食要注意什么", top_k=3)
    assert len(hits) == 3 and hits[0].score >= hits[-1].score
    retriever.close()
    ```

    :param store: the store, as a spec (``faiss:DIR``, ``qdrant:PATH``, ``qdrant:http://host:port``) or opened.
    :param embedder: the query side of the model that built the store (refused if it is another model's).
    :param collection: the Qdrant collection (None: the spec's, else the default).
    :param instruction: the instruction put in each query's prompt (None: the model's default).
    :raises StoreError: the store is empty, or was built by another model.
    """

    def __init__(
        self,
        store: str | VectorStore,
        embedder: QueryEncoder,
        *,
        collection: str | None = None,
        instruction: str | None = None,
    ) -> None:
        self.store = open_store(store, collection=collection)
        self.embedder = embedder
        self.instruction = instruction
        self.store.check_compatible(embedder.space_fingerprint, embedder.dim)

    @classmethod
    def from_pretrained(
        cls,
        model: str,
        store: str,
        *,
        collection: str | None = None,
        device: str | None = None,
        backend: str = "auto",
        threads: int | None = None,
        trust_remote_code: bool = False,
        compile: bool = False,
        **kwargs: Any,
    ) -> CareRetriever:
        """Load the query tower of ``model`` only, and open ``store``.

        :param model: the CARE model folder (or hub id) that built the store.
        :param store: the store spec (``faiss:DIR``, ``qdrant:PATH``, ``qdrant:http://host:port``).
        :param collection: the Qdrant collection (None: the spec's, else the default).
        :param device: where the query tower runs (None: the best device the machine has).
        :param backend: ``auto | torch | onnx | openvino``; ``auto`` runs the folder's export
            (``care-retriever export``) when it has one; onnx and openvino never import torch.
        :param threads: CPU threads of one forward pass (None: the runtime's default).
        :param trust_remote_code: let the query tower run model code shipped with it.
        :param compile: torch backend only: compile the query tower and warm it up now (a long-running process).
        :param kwargs: passed to the constructor (``instruction``).
        """
        from care_retriever.search.backends import load_query_embedder

        store_obj = open_store(store, collection=collection)
        store_obj.require_manifest()
        embedder = load_query_embedder(
            model, backend, device=device, threads=threads, trust_remote_code=trust_remote_code, compile=compile
        )
        return cls(store_obj, embedder, **kwargs)

    @overload
    def search(  # type: ignore[overload-overlap]  # a str is also a Sequence[str]: the str overload comes first
        self,
        query: str,
        top_k: int = 10,
        filters: Filters | None = None,
        *,
        mode: str = "dense",
        fusion: FusionConfig | None = None,
    ) -> list[Hit]: ...
    @overload
    def search(
        self,
        query: Sequence[str],
        top_k: int = 10,
        filters: Filters | None = None,
        *,
        mode: str = "dense",
        fusion: FusionConfig | None = None,
    ) -> list[list[Hit]]: ...

    def search(
        self,
        query: str | Sequence[str],
        top_k: int = 10,
        filters: Filters | None = None,
        *,
        mode: str = "dense",
        fusion: FusionConfig | None = None,
    ):
        """Top-``k`` hits for one query (a list of hits) or a batch of queries (a list of lists).

        :param query: one query, or a list of queries.
        :param top_k: hits per query.
        :param filters: metadata filters (:mod:`care_retriever.stores.filters`); None: every document.
        :param mode: ``dense`` (the query tower), ``sparse`` (the store's BM25 side, no model call) or ``hybrid``
            (both, fused; hybrid scores are fused scores, not cosines).
        :param fusion: hybrid only: ``rrf`` (``k``), ``dbsf`` or ``wsum`` (``dense_weight``); None: the defaults of
            docs/hybrid.md.
        :returns: the hits of one query, best first; for a list of queries, one such list each.
        :raises InputError: an empty query, ``top_k`` below 1, or an unknown mode.
        """
        check_mode(mode)
        single = isinstance(query, str)
        queries: list[str] = [query] if isinstance(query, str) else list(query)
        for i, q in enumerate(queries):
            if not isinstance(q, str) or not q.strip():
                raise InputError(f"query {i}: empty query" if not single else "empty query")
        if top_k < 1:
            raise InputError(f"top_k must be >= 1, got {top_k}")
        if not queries:
            return []
        if mode != "dense":
            sparse = sparse_store(self.store)  # before the query tower runs: a clear error, not a late one
        if mode == "sparse":
            hits = sparse.search_sparse(queries, top_k, filters)
            return hits[0] if single else hits
        vectors = self.embedder.embed_queries(queries, instruction=self.instruction)
        if mode == "dense":
            hits = self.store.search(vectors, top_k, filters)
        else:
            hits = hybrid_search(self.store, vectors, queries, top_k, filters, fusion or FusionConfig())
        return hits[0] if single else hits

    def embed_queries(self, queries: Sequence[str]) -> np.ndarray:
        """The query vectors of ``queries``, one row each in order, from one forward pass.

        With :meth:`search_vectors`, the two halves of :meth:`search`, for callers that batch the
        queries of many requests into one forward pass (the HTTP service).

        :param queries: the query texts.
        """
        for i, q in enumerate(queries):
            if not isinstance(q, str) or not q.strip():
                raise InputError(f"query {i}: empty query")
        return self.embedder.embed_queries(list(queries), instruction=self.instruction)

    def search_vectors(
        self,
        vectors: np.ndarray,
        top_k: int = 10,
        filters: Filters | None = None,
        *,
        mode: str = "dense",
        queries: Sequence[str] | None = None,
        fusion: FusionConfig | None = None,
    ) -> list[list[Hit]]:
        """Top-``k`` hits for each row of ``vectors`` (query vectors from :meth:`embed_queries`).

        :param vectors: query vectors, one row each.
        :param top_k: hits per query.
        :param filters: metadata filters; None: every document.
        :param mode: ``dense``, ``sparse`` or ``hybrid`` (as :meth:`search`).
        :param queries: the query texts, one per row: ``sparse`` and ``hybrid`` need them for the BM25 side.
        :param fusion: hybrid only: how the two rankings are fused (None: the defaults).
        """
        check_mode(mode)
        if top_k < 1:
            raise InputError(f"top_k must be >= 1, got {top_k}")
        if mode == "dense":
            return self.store.search(vectors, top_k, filters)
        if queries is None or len(queries) != len(vectors):
            raise InputError(f"mode {mode!r} needs the query texts beside their vectors")
        sparse = sparse_store(self.store)
        if mode == "sparse":
            return sparse.search_sparse(list(queries), top_k, filters)
        return hybrid_search(self.store, vectors, queries, top_k, filters, fusion or FusionConfig())

    def close(self) -> None:
        """Close the store."""
        self.store.close()
