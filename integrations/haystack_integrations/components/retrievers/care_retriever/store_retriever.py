"""``CareStoreRetriever``: search any store ``care-retriever index`` writes from a Haystack pipeline.

qdrant-haystack's ``QdrantDocumentStore`` expects its own payload layout, so it cannot read a
collection written by ``care-retriever index --store qdrant:...`` (and Haystack has no FAISS store
at all). This component needs no Haystack document store: it opens the store spec with the core
``open_store`` (``faiss:DIR``, ``qdrant:PATH``, ``qdrant:http(s)://host:6333``) and searches it with
the core ``VectorStore.search``, so "index offline with the CLI, serve with Haystack" works for every
backend and returns the same hits and scores as ``care-retriever search``.

Connect ``CareTextEmbedder.embedding`` to ``query_embedding``. ``mode="hybrid"`` also takes the query
text (``query``) and fuses the store's BM25 ranking with the dense one exactly as
``care-retriever search --mode hybrid`` does (:func:`care_retriever.search.hybrid.hybrid_search`);
``mode="sparse"`` needs only ``query``. Nothing in a bare embedding says
which model made it, so the width is always checked against the store; pass ``model=`` (the same
folder as the text embedder's) to also check the store's space fingerprint, as the CLI does.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit

from haystack import Document, component, default_from_dict, default_to_dict
from haystack.document_stores.types import FilterPolicy
from haystack.document_stores.types.filter_policy import apply_filter_policy
from haystack.utils import Secret, deserialize_secrets_inplace
from haystack_integrations.document_stores.care_retriever.document_store import NO_EMBEDDING
from haystack_integrations.document_stores.care_retriever.filters import core_filters, validate_filters

from care_retriever.errors import InputError
from care_retriever.integrations.common import (
    as_matrix,
    check_model_location,
    cosine_to_unit,
    from_core_metadata,
    model_space,
    prepare_vectors,
)
from care_retriever.sparse.fusion import DEFAULT_FUSION
from care_retriever.stores import VectorStore, open_store, parse_store_spec
from care_retriever.stores.capabilities import SparseSearch
from care_retriever.stores.qdrant import is_server


@component
class CareStoreRetriever:
    """Retrieve the ``top_k`` documents of a care-retriever store most similar to a query embedding (by the store's
    model's similarity: cosine, or dot product for the authors' released models, as ``care-retriever search``).

    Usage example:
    ```python
    from haystack import Pipeline
    from haystack_integrations.components.embedders.care_retriever import CareTextEmbedder
    from haystack_integrations.components.retrievers.care_retriever import CareStoreRetriever

    query = Pipeline()
    query.add_component("embedder", CareTextEmbedder("models/care"))
    query.add_component("retriever", CareStoreRetriever("faiss:stores/care", model="models/care", top_k=3))
    query.connect("embedder.embedding", "retriever.query_embedding")
    hits = query.run({"embedder": {"text": "血压高怎么办"}})["retriever"]["documents"]
    assert len(hits) == 3
    ```

    :param store: store spec as given to ``care-retriever index --store``: ``faiss:DIR``,
        ``qdrant:PATH``, ``qdrant:http(s)://host:6333``. Checked at construction, opened in ``warm_up()``.
    :param collection: Qdrant collection (default: the core's, ``care``); ignored by FAISS.
    :param model: optional CARE model folder; when set, ``warm_up()`` refuses a store built with
        another model (only ``care_config.json`` is read, no weights are loaded).
    :param filters: Haystack filters applied to every run (see ``filter_policy``).
    :param top_k: number of documents to return.
    :param scale_score: map the score (cosine, or the dot product of vectors of norm at most 1) from [-1, 1] to [0, 1].
    :param filter_policy: ``replace`` (run-time filters replace init filters) or ``merge``.
    :param api_key: API key of a Qdrant server; by default the ``QDRANT_API_KEY`` environment
        variable, as the CLI reads it. Serialised as the variable's name, never its value.
    """

    def __init__(
        self,
        store: str,
        collection: str | None = None,
        model: str | None = None,
        filters: dict[str, Any] | None = None,
        top_k: int = 10,
        scale_score: bool = False,
        filter_policy: str | FilterPolicy = FilterPolicy.REPLACE,
        api_key: Secret | None = Secret.from_env_var("QDRANT_API_KEY", strict=False),
        mode: str = "dense",
        fusion: str = DEFAULT_FUSION,
        rrf_k: int | None = None,
        dense_weight: float | None = None,
    ) -> None:
        from care_retriever.sparse import check_mode

        check_mode(mode)
        self.mode, self.fusion, self.rrf_k, self.dense_weight = mode, fusion, rrf_k, dense_weight
        self._fusion = self._fusion_config()
        if not isinstance(store, str):
            raise InputError(f"store must be a store spec string such as faiss:DIR or qdrant:PATH, got {store!r}")
        self._scheme, self._location = parse_store_spec(store)
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        if model is not None:
            check_model_location(model)
        validate_filters(filters)
        self.store = store
        self.collection = collection
        self.model = model
        self.filters = filters
        self.top_k = top_k
        self.scale_score = scale_score
        self.filter_policy = (
            filter_policy if isinstance(filter_policy, FilterPolicy) else FilterPolicy.from_str(filter_policy)
        )
        self.api_key = api_key
        self._store: VectorStore | None = None

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        """Serialise the spec and settings; a key written into a server URL is refused, never serialised."""
        if is_server(self._location):
            parts = urlsplit(self._location)
            if parts.username or parts.password:
                raise ValueError(
                    "CareStoreRetriever: the store URL holds credentials, which would be serialised; "
                    "pass the key as api_key=Secret.from_env_var(...) instead"
                )
        return default_to_dict(
            self,
            store=self.store,
            collection=self.collection,
            model=self.model,
            filters=self.filters,
            top_k=self.top_k,
            scale_score=self.scale_score,
            filter_policy=self.filter_policy.value,
            api_key=self.api_key.to_dict() if self.api_key is not None else None,
            mode=self.mode,
            fusion=self.fusion,
            rrf_k=self.rrf_k,
            dense_weight=self.dense_weight,
        )

    def _fusion_config(self):
        from care_retriever.sparse.fusion import DEFAULT_DENSE_WEIGHT, DEFAULT_RRF_K, FusionConfig

        return FusionConfig(
            self.fusion,
            k=DEFAULT_RRF_K if self.rrf_k is None else self.rrf_k,
            dense_weight=DEFAULT_DENSE_WEIGHT if self.dense_weight is None else self.dense_weight,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CareStoreRetriever:
        params = data.get("init_parameters", {})
        deserialize_secrets_inplace(params, keys=["api_key"])
        if params.get("filter_policy"):
            params["filter_policy"] = FilterPolicy.from_str(params["filter_policy"])
        return default_from_dict(cls, data)

    # ------------------------------------------------------------------ lifecycle
    def _open(self) -> VectorStore:
        key = self.api_key.resolve_value() if self.api_key is not None else None
        if self._scheme != "qdrant" or not is_server(self._location) or not key:
            return open_store(self.store, collection=self.collection)
        # A key from a Secret other than QDRANT_API_KEY: the core store builds its client with it.
        from care_retriever.stores.qdrant import DEFAULT_COLLECTION, open_qdrant

        return open_qdrant(self._location, self.collection or DEFAULT_COLLECTION, api_key=key)

    def warm_up(self) -> None:
        """Open the store (once) and check it holds an index (and, with ``model=``, the model's space)."""
        if self._store is not None:
            return
        store = self._open()
        try:
            store.require_manifest()
            if self.model is not None:
                dim, fingerprint, _ = model_space(self.model)
                store.check_compatible(fingerprint, dim)
        except BaseException:
            store.close()
            raise
        self._store = store

    def close(self) -> None:
        """Release the store (``Pipeline.close()`` calls this); a later run opens it again.

        Qdrant local mode allows one client per folder, so close before another process or
        client (the CLI, say) opens the same folder.
        """
        if self._store is not None:
            self._store.close()
            self._store = None

    # ------------------------------------------------------------------ retrieval
    @component.output_types(documents=list[Document])
    def run(
        self,
        query_embedding: list[float] | None = None,
        filters: dict[str, Any] | None = None,
        top_k: int | None = None,
        scale_score: bool | None = None,
        query: str | None = None,
    ) -> dict[str, list[Document]]:
        """Documents ranked by the store's similarity (cosine, or the dot product of a dot-product model such as the
        authors' released ones) to ``query_embedding``, best first, with ``score`` set.

        ``content`` is the stored text, ``meta`` its metadata plus ``title`` when it has one. Opens
        the store first if ``warm_up()`` has not run.
        """
        top_k = self.top_k if top_k is None else top_k
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        filters = apply_filter_policy(self.filter_policy, self.filters, filters)
        validate_filters(filters)
        if self.mode != "dense":
            return {"documents": self._run_with_sparse(query_embedding, query, filters, top_k)}
        if not isinstance(query_embedding, list) or not query_embedding:
            raise InputError("query_embedding should be a non-empty list of floats.")
        self.warm_up()
        store = self._store
        assert store is not None
        manifest = store.require_manifest()
        dim = manifest.dim
        if len(query_embedding) != dim:
            raise InputError(
                f"query_embedding has {len(query_embedding)} dims but {store.describe()} holds {dim}-dim vectors; "
                "embed the query with the model that built the store"
            )
        vector = as_matrix([query_embedding], dim, "query_embedding")
        if not vector.any():
            raise InputError("query_embedding is all zeros; cosine similarity is undefined")
        vector = prepare_vectors(manifest, vector)  # as the CLI searches: unit for cosine, as given for dot
        scale = self.scale_score if scale_score is None else scale_score

        hits = store.search(vector, top_k, core_filters(filters, hidden=NO_EMBEDDING))[0]
        docs = [
            Document(
                id=h.id,
                content=h.text,
                meta=from_core_metadata(h.title, h.metadata, hidden=(NO_EMBEDDING,)),
                score=cosine_to_unit(h.score) if scale else h.score,
            )
            for h in hits
        ]
        return {"documents": docs}

    def _run_with_sparse(
        self, query_embedding: list[float] | None, query: str | None, filters: dict[str, Any] | None, top_k: int
    ) -> list[Document]:
        """``sparse`` / ``hybrid``: the core's BM25 or hybrid search (the CLI's code), filters run in the store."""
        from care_retriever.search.hybrid import hybrid_search, sparse_store

        if not isinstance(query, str) or not query.strip():
            raise InputError(f"mode={self.mode!r} needs the query text: connect it to the `query` input")
        self.warm_up()
        store = self._store
        assert store is not None
        sparse = sparse_store(store)
        store_filters = core_filters(filters)
        if self.mode == "sparse":
            hits = sparse.search_sparse([query], top_k, store_filters)[0]
        else:
            if not isinstance(query_embedding, list) or not query_embedding:
                raise InputError("mode='hybrid' needs query_embedding as well as query")
            manifest = store.require_manifest()
            vector = prepare_vectors(manifest, as_matrix([query_embedding], manifest.dim, "query_embedding"))
            hits = hybrid_search(store, vector, [query], top_k, store_filters, self._fusion)[0]
        return [
            Document(
                id=h.id,
                content=h.text,
                meta=from_core_metadata(h.title, h.metadata, hidden=(NO_EMBEDDING,)),
                score=h.score,
            )
            for h in hits
        ]

    async def warm_up_async(self) -> None:
        """:meth:`warm_up` (opening the store) in a worker thread."""
        await asyncio.to_thread(self.warm_up)

    async def close_async(self) -> None:
        """:meth:`close` in a worker thread."""
        await asyncio.to_thread(self.close)

    @component.output_types(documents=list[Document])
    async def run_async(
        self,
        query_embedding: list[float] | None = None,
        filters: dict[str, Any] | None = None,
        top_k: int | None = None,
        scale_score: bool | None = None,
        query: str | None = None,
    ) -> dict[str, list[Document]]:
        """:meth:`run` in a worker thread: opening the store and searching it never block the event loop."""
        return await asyncio.to_thread(self.run, query_embedding, filters, top_k, scale_score, query)


@component
class CareStoreBM25Retriever:
    """BM25 over the sparse side of a care-retriever store (``care-retriever index`` writes it): no model.

    Pair it with :class:`CareStoreRetriever` (dense) under Haystack's ``DocumentJoiner`` for a hybrid
    pipeline (examples/haystack_hybrid.py), or use ``CareStoreRetriever(mode="hybrid")``.

    Usage example:
    ```python
    from haystack_integrations.components.retrievers.care_retriever import CareStoreBM25Retriever

    retriever = CareStoreBM25Retriever("faiss:stores/care", top_k=3)
    hits = retriever.run(query="高血压")["documents"]
    assert len(hits) == 3
    ```

    :param store: store spec as given to ``care-retriever index --store`` (``faiss:DIR``, ``qdrant:PATH``, ...).
    :param collection: Qdrant collection (default: the core's, ``care``); ignored by FAISS.
    :param top_k: number of documents to return.
    """

    def __init__(self, store: str, collection: str | None = None, top_k: int = 10) -> None:
        parse_store_spec(store)
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        self.store, self.collection, self.top_k = store, collection, top_k
        self._store: SparseSearch | None = None

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self, store=self.store, collection=self.collection, top_k=self.top_k)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CareStoreBM25Retriever:
        return default_from_dict(cls, data)

    def warm_up(self) -> None:
        from care_retriever.search.hybrid import sparse_store

        if self._store is None:
            opened = open_store(self.store, collection=self.collection)
            try:
                self._store = sparse_store(opened)
            except BaseException:
                opened.close()
                raise

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    @component.output_types(documents=list[Document])
    def run(
        self, query: str, filters: dict[str, Any] | None = None, top_k: int | None = None
    ) -> dict[str, list[Document]]:
        """Documents ranked by BM25 score, best first (a query with no indexed token: none)."""
        validate_filters(filters)
        self.warm_up()
        assert self._store is not None
        store_filters = core_filters(filters, hidden=None)
        hits = self._store.search_sparse([query], self.top_k if top_k is None else top_k, store_filters)[0]
        return {
            "documents": [
                Document(
                    id=h.id,
                    content=h.text,
                    meta=from_core_metadata(h.title, h.metadata, hidden=(NO_EMBEDDING,)),
                    score=h.score,
                )
                for h in hits
            ]
        }

    async def warm_up_async(self) -> None:
        await asyncio.to_thread(self.warm_up)

    async def close_async(self) -> None:
        await asyncio.to_thread(self.close)

    @component.output_types(documents=list[Document])
    async def run_async(
        self, query: str, filters: dict[str, Any] | None = None, top_k: int | None = None
    ) -> dict[str, list[Document]]:
        """:meth:`run` in a worker thread (BM25 reads the store)."""
        return await asyncio.to_thread(self.run, query, filters, top_k)
