"""``CareVectorStore``: a LangChain ``VectorStore`` over a store built by ``care-retriever index``.

Opens ``faiss:DIR`` or ``qdrant:PATH`` / ``qdrant::memory:`` / ``qdrant:http://host:6333`` as they
are (no re-encoding), so ``.as_retriever()`` works on existing indexes; with :class:`CareEmbeddings`
the store's model fingerprint is checked, so searching with the wrong model is an error, not
garbage. Documents added here are written in the same format (the CLI and :class:`CareRetriever`
can search them): ``page_content`` is the text, a non-empty string ``metadata["title"]`` the title
column; the embedded text is the title above the text, as the CLI's; vectors are stored as the store's model
defines them (:mod:`care_retriever.vectors`: unit rows for a cosine model, unchanged for a dot-product one such as
the authors' released models), exactly as ``care-retriever index`` stores them. FAISS writes are
all-or-nothing (one store transaction); Qdrant has no transactions, so a failed Qdrant write may be partial
(as with ``QdrantVectorStore``).

``filter`` takes the core filter language (docs/filters.md): ``{"field": value}``, ``{"field": [v1, v2]}`` (any of), or
Haystack syntax (ranges, NOT, OR, nested ``meta.a.b`` fields), run inside the store.

Hybrid search (the store's BM25 side fused with the dense ranking, as ``care-retriever search --mode
hybrid``): ``hybrid_search(query)``, ``search(query, "hybrid")`` or
``as_retriever(search_type="hybrid", search_kwargs={"k": 5, "fusion": "rrf", "rrf_k": 10})``;
``"sparse"`` is BM25 alone. How each search runs on the core store, and that retriever, are
:mod:`~care_retriever.integrations.langchain.searching`; this class opens, writes and hands out LangChain documents.

Async: the ``a*`` methods are the class's own. A query is encoded by ``aembed_query`` (concurrent queries from
one loop share a forward pass, in a worker thread, with :class:`CareEmbeddings`) and searched with the core
store's async read (a Qdrant server's ``AsyncQdrantClient``; FAISS and Qdrant local mode in a worker thread).
Writes run the sync method in this object's one writer thread, in the order they were awaited: the same
documents, vectors and transaction as the sync call, and the loop keeps running meanwhile.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.vectorstores import VectorStore

from care_retriever.errors import InputError
from care_retriever.integrations.common import (
    UNKNOWN_FINGERPRINT,
    as_matrix,
    check_index_options,
    cosine_to_unit,
    from_core_metadata,
    prepare_vectors,
    to_core_document,
)
from care_retriever.integrations.langchain.embeddings import CareEmbeddings
from care_retriever.integrations.langchain.searching import (
    CareVectorStoreRetriever,
    dense_hits,
    dense_hits_async,
    fused_hits,
    mmr_hits,
)
from care_retriever.stores import VectorStore as CoreStore
from care_retriever.stores import open_store
from care_retriever.stores.capabilities import StoredIteration, WriteRuns

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor


class CareVectorStore(VectorStore):
    """LangChain view of a care-retriever FAISS or Qdrant store.

    Usage example:
    ```python
    from care_retriever.integrations.langchain import CareEmbeddings, CareVectorStore

    store = CareVectorStore("faiss:stores/care", CareEmbeddings(model="models/care"))
    hits = store.similarity_search("血压高怎么办", k=3)
    assert len(hits) == 3
    ```

    :param store: a store spec (``faiss:DIR``, ``qdrant:PATH``, ...) or an open core store.
    :param embedding: query/document embeddings; :class:`CareEmbeddings` of the model that built the store.
    :param collection: Qdrant collection (default ``care``).
    :param index_options: settings of a new store, the fields of its kind's config
        (:class:`~care_retriever.stores.config.FaissIndexConfig`,
        :class:`~care_retriever.stores.config.QdrantCollectionConfig`), e.g. ``{"quantize": "sq8"}``;
        checked here in one line, recorded in the manifest and required to match on later writes.
    """

    def __init__(
        self,
        store: str | CoreStore,
        embedding: Embeddings,
        *,
        collection: str | None = None,
        index_options: dict[str, Any] | None = None,
    ) -> None:
        # A store handed in stays its caller's (close() leaves it open); one opened from a spec is ours.
        self._owns_store = not isinstance(store, CoreStore)
        self.store = open_store(store, collection=collection)
        self.embedding = embedding
        self.index_options = index_options  # read once, through the store kind's config (the setter)
        self._space = embedding.space if isinstance(embedding, CareEmbeddings) else None
        self._metric = embedding.metric if isinstance(embedding, CareEmbeddings) else None  # a new store's scores
        if self._space is not None and self.store.manifest is not None:
            self.store.check_compatible(self._space[1], self._space[0])

    @property
    def index_options(self) -> dict[str, Any] | None:
        """The settings as given; the store gets their config."""
        return self._index_options

    @index_options.setter
    def index_options(self, options: dict[str, Any] | None) -> None:
        self._index_config = check_index_options(self.store.backend, options)
        self._index_options = None if options is None else dict(options)

    @property
    def embeddings(self) -> Embeddings:
        return self.embedding

    def _write(
        self, upserts: Sequence[Any] = (), vectors: np.ndarray | None = None, deletes: Sequence[str] = ()
    ) -> None:
        manifest = self.store.manifest
        if manifest is not None:
            dim, fingerprint, model_name = manifest.dim, manifest.space_fingerprint, manifest.model_name
        elif self._space is not None:
            dim, fingerprint, model_name = self._space
        elif vectors is not None:
            dim, fingerprint, model_name = int(vectors.shape[1]), UNKNOWN_FINGERPRINT, ""
        else:
            return  # a delete from a store that was never written: nothing to do
        metric = self._metric if not manifest else None
        runs = WriteRuns.require(self.store, "LangChain's add_texts / delete")
        with runs.transaction(dim, fingerprint, model_name, self._index_config, metric=metric) as store:
            if deletes:
                store.delete(list(deletes))
            elif vectors is not None:
                store.upsert(list(upserts), vectors)

    def add_texts(
        self,
        texts: Iterable[str],
        metadatas: list[dict[str, Any]] | None = None,
        *,
        ids: list[str] | None = None,
        **kwargs: Any,
    ) -> list[str]:
        """Embed ``texts`` with the document side and upsert them by id (new ids are UUID4 strings)."""
        texts = list(texts)
        if metadatas is not None and len(metadatas) != len(texts):
            raise InputError(f"{len(metadatas)} metadatas for {len(texts)} texts")
        if ids is not None and len(ids) != len(texts):
            raise InputError(f"{len(ids)} ids for {len(texts)} texts")
        if any(not isinstance(t, str) for t in texts):
            raise InputError("add_texts expects str texts (page_content)")
        given: list[str] | list[None] = ids if ids else [None] * len(texts)
        out_ids = [str(i) if i is not None else str(uuid.uuid4()) for i in given]
        if not texts:
            return []
        metas = metadatas or [{} for _ in texts]
        last = {doc_id: n for n, doc_id in enumerate(out_ids)}  # an id given twice: the last one wins
        keep = sorted(last.values())
        core_docs = [to_core_document(out_ids[n], texts[n], metas[n] or {}) for n in keep]
        manifest_dim = self.store.manifest.dim if self.store.manifest is not None else None
        dim = manifest_dim or (self._space[0] if self._space else None)
        # Embed what `care-retriever index` embeds for the same document: the title (if any) above the text.
        vectors = as_matrix(self.embedding.embed_documents([d.embedding_text() for d in core_docs]), dim, "add_texts")
        self._write(core_docs, prepare_vectors(self.store.manifest, vectors, self._metric))
        return out_ids

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool:
        """Delete documents by id (all documents when ``ids`` is None); missing ids are ignored."""
        if self.store.manifest is None:
            return True
        targets = self._all_ids() if ids is None else [str(i) for i in ids]
        existing = list(self.store.content_hashes(targets)) if targets else []
        if existing:
            self._write(deletes=existing)
        return True

    def _all_ids(self) -> list[str]:
        stored = StoredIteration.require(self.store, "LangChain's delete of every document")
        return [d.id for d in stored.iter_documents()]

    @staticmethod
    def _to_document(doc: Any) -> Document:
        return Document(id=doc.id, page_content=doc.text, metadata=from_core_metadata(doc.title, doc.metadata))

    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        if self.store.manifest is None:
            return []
        return [self._to_document(d) for d in self.store.get([str(i) for i in ids]) if d is not None]

    def similarity_search_with_score_by_vector(
        self, embedding: list[float], k: int = 4, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        """Documents with their score (the store's similarity: cosine, or dot product for a dot-product model) to
        ``embedding``, best first."""
        return [(self._to_document(h), h.score) for h in dense_hits(self.store, embedding, k, filter)]

    def similarity_search_by_vector(
        self, embedding: list[float], k: int = 4, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Document]:
        return [doc for doc, _ in self.similarity_search_with_score_by_vector(embedding, k, filter)]

    def similarity_search_with_score(
        self, query: str, k: int = 4, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        return self.similarity_search_with_score_by_vector(self.embedding.embed_query(query), k, filter)

    def similarity_search(
        self, query: str, k: int = 4, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Document]:
        return [doc for doc, _ in self.similarity_search_with_score(query, k, filter)]

    def hybrid_search_with_score(
        self, query: str, k: int = 4, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        """Dense + BM25, fused (``fusion`` rrf | dbsf | wsum, ``rrf_k``, ``dense_weight``); scores are fused scores."""
        hits = fused_hits(self.store, self.embedding, query, k, filter, "hybrid", **kwargs)
        return [(self._to_document(h), h.score) for h in hits]

    def hybrid_search(
        self, query: str, k: int = 4, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Document]:
        return [doc for doc, _ in self.hybrid_search_with_score(query, k, filter, **kwargs)]

    def sparse_search(
        self, query: str, k: int = 4, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Document]:
        """BM25 alone over the store's sparse side (no embedding)."""
        return [self._to_document(h) for h in fused_hits(self.store, self.embedding, query, k, filter, "sparse")]

    def search(self, query: str, search_type: str, **kwargs: Any) -> list[Document]:
        if search_type == "hybrid":
            return self.hybrid_search(query, **kwargs)
        if search_type == "sparse":
            return self.sparse_search(query, **kwargs)
        return super().search(query, search_type, **kwargs)

    def as_retriever(self, **kwargs: Any) -> CareVectorStoreRetriever:
        tags = kwargs.pop("tags", None) or [*self._get_retriever_tags()]
        return CareVectorStoreRetriever(vectorstore=self, tags=tags, **kwargs)

    def _select_relevance_score_fn(self) -> Callable[[float], float]:
        return cosine_to_unit

    def max_marginal_relevance_search_by_vector(
        self,
        embedding: list[float],
        k: int = 4,
        fetch_k: int = 20,
        lambda_mult: float = 0.5,
        filter: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> list[Document]:
        """Diverse results: ``fetch_k`` nearest candidates re-ranked by maximal marginal relevance."""
        return [self._to_document(h) for h in mmr_hits(self.store, embedding, k, fetch_k, lambda_mult, filter)]

    def max_marginal_relevance_search(
        self, query: str, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5, **kwargs: Any
    ) -> list[Document]:
        return self.max_marginal_relevance_search_by_vector(
            self.embedding.embed_query(query), k, fetch_k, lambda_mult, **kwargs
        )

    @classmethod
    def from_texts(
        cls,
        texts: list[str],
        embedding: Embeddings,
        metadatas: list[dict[str, Any]] | None = None,
        *,
        ids: list[str] | None = None,
        store: str | CoreStore | None = None,
        collection: str | None = None,
        index_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> CareVectorStore:
        """Create (or extend) the store ``store`` with ``texts``; ``store`` is required (``faiss:DIR``, ...)."""
        if store is None:
            raise InputError("CareVectorStore.from_texts needs store='faiss:DIR' or 'qdrant:PATH' (where to write)")
        instance = cls(store, embedding, collection=collection, index_options=index_options)
        instance.add_texts(texts, metadatas, ids=ids)
        return instance

    def close(self) -> None:
        """Close the store if this object opened it (a store passed in is left to its caller)."""
        if self._owns_store:
            self.store.close()

    # One writer thread per object: writes awaited in order run in order, never two transactions at once.
    _writer: ThreadPoolExecutor | None = None

    async def _in_writer(self, call: Callable[[], _T]) -> _T:
        if self._writer is None:
            from concurrent.futures import ThreadPoolExecutor

            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="care-vectorstore-writer")
        return await asyncio.get_running_loop().run_in_executor(self._writer, call)

    async def aadd_texts(
        self,
        texts: Iterable[str],
        metadatas: list[dict[str, Any]] | None = None,
        *,
        ids: list[str] | None = None,
        **kwargs: Any,
    ) -> list[str]:
        """:meth:`add_texts` in the writer thread (the document tower and the store write run there)."""
        texts = list(texts)
        return await self._in_writer(lambda: self.add_texts(texts, metadatas, ids=ids, **kwargs))

    async def adelete(self, ids: list[str] | None = None, **kwargs: Any) -> bool:
        """:meth:`delete` in the writer thread."""
        return await self._in_writer(lambda: self.delete(ids, **kwargs))

    async def aget_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        if self.store.manifest is None:
            return []
        return [self._to_document(d) for d in await self.store.get_async([str(i) for i in ids]) if d is not None]

    async def asimilarity_search_with_score_by_vector(
        self, embedding: list[float], k: int = 4, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        """Documents with their cosine similarity to ``embedding``, best first."""
        return [(self._to_document(h), h.score) for h in await dense_hits_async(self.store, embedding, k, filter)]

    async def asimilarity_search_by_vector(
        self, embedding: list[float], k: int = 4, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Document]:
        return [doc for doc, _ in await self.asimilarity_search_with_score_by_vector(embedding, k, filter)]

    async def asimilarity_search_with_score(
        self, query: str, k: int = 4, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        embedding = await self.embedding.aembed_query(query)
        return await self.asimilarity_search_with_score_by_vector(embedding, k, filter)

    async def asimilarity_search(
        self, query: str, k: int = 4, filter: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Document]:
        return [doc for doc, _ in await self.asimilarity_search_with_score(query, k, filter)]

    async def amax_marginal_relevance_search_by_vector(
        self,
        embedding: list[float],
        k: int = 4,
        fetch_k: int = 20,
        lambda_mult: float = 0.5,
        filter: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> list[Document]:
        """:meth:`max_marginal_relevance_search_by_vector` (candidates and their stored vectors) in a worker thread."""
        return await asyncio.to_thread(
            self.max_marginal_relevance_search_by_vector, embedding, k, fetch_k, lambda_mult, filter, **kwargs
        )

    async def amax_marginal_relevance_search(
        self, query: str, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5, **kwargs: Any
    ) -> list[Document]:
        embedding = await self.embedding.aembed_query(query)
        return await self.amax_marginal_relevance_search_by_vector(embedding, k, fetch_k, lambda_mult, **kwargs)

    async def asearch(self, query: str, search_type: str, **kwargs: Any) -> list[Document]:
        if search_type in ("hybrid", "sparse"):  # BM25 and fusion read the store: in a worker thread
            return await asyncio.to_thread(self.search, query, search_type, **kwargs)
        return await super().asearch(query, search_type, **kwargs)

    @classmethod
    async def afrom_texts(
        cls,
        texts: list[str],
        embedding: Embeddings,
        metadatas: list[dict[str, Any]] | None = None,
        *,
        ids: list[str] | None = None,
        store: str | CoreStore | None = None,
        collection: str | None = None,
        index_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> CareVectorStore:
        """:meth:`from_texts` without blocking the loop (opening the store, encoding and writing off it)."""
        if store is None:
            raise InputError("CareVectorStore.afrom_texts needs store='faiss:DIR' or 'qdrant:PATH' (where to write)")
        instance = await asyncio.to_thread(cls, store, embedding, collection=collection, index_options=index_options)
        await instance.aadd_texts(texts, metadatas, ids=ids)
        return instance

    async def aclose(self) -> None:
        """:meth:`close` (and the store's async client, if this object opened the store), then the writer thread."""
        if self._owns_store:
            await self.store.aclose()
        if self._writer is not None:
            writer, self._writer = self._writer, None
            writer.shutdown(wait=False)


_T = TypeVar("_T")
