"""``CareFaissDocumentStore``: a Haystack document store in the core FAISS folder format.

Haystack has no maintained FAISS store; this one persists to exactly the folder that
``care-retriever index --store faiss:DIR`` writes (``manifest.json``, ``index.faiss``,
``docstore.sqlite``), so an index built by the CLI opens here without re-encoding, and a store
written from Haystack (with ``model=`` set) is searchable by ``care-retriever search``.

Mapping: ``Document.content`` is the stored text, a non-empty string ``meta["title"]`` the title
column, the rest of ``meta`` the metadata JSON. Vectors are stored as the store's model defines them
(:mod:`care_retriever.vectors`): L2-normalised for a cosine model (inner product is cosine), unchanged for a
dot-product model (the authors' released models: cut without renormalising), exactly as ``care-retriever index``
stores them, so a document scores the same whichever door wrote it. A document written without an embedding
is kept with a zero vector and a hidden marker; retrieval skips it. Every write is all-or-nothing: validated
first, then one store transaction that is either published whole or discarded.

Async: each method has an ``*_async`` twin (Haystack's ``DocumentWriter.run_async`` and ``Pipeline.run_async``
look for them). The twin runs the sync method off the event loop: writes and deletes in this store's one writer
thread, in the order they were awaited (one transaction at a time, as the sync calls make them), reads in worker
threads. Same documents, same scores: the sync code is the one definition of both.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, TypeVar

import numpy as np
from haystack import Document, default_from_dict, default_to_dict
from haystack.document_stores.errors import DuplicateDocumentError
from haystack.document_stores.types import DuplicatePolicy
from haystack_integrations.document_stores.care_retriever.filters import (
    core_filters,
    parse_haystack_filters,
    validate_filters,
)

from care_retriever.documents import Document as CoreDocument
from care_retriever.errors import InputError
from care_retriever.integrations.common import (
    UNKNOWN_FINGERPRINT,
    as_matrix,
    check_index_options,
    cosine_to_unit,
    faiss_folder,
    from_core_metadata,
    model_metric,
    model_space,
    prepare_vectors,
    to_core_document,
)
from care_retriever.stores.base import Hit
from care_retriever.stores.faiss import FaissStore
from care_retriever.stores.filter_matching import matches

logger = logging.getLogger(__name__)

# Metadata key marking a document written without an embedding (stored with a zero vector).
NO_EMBEDDING = "_care_no_embedding"
_T = TypeVar("_T")


class CareFaissDocumentStore:
    """Haystack ``DocumentStore`` over a care-retriever FAISS folder (``faiss:DIR``).

    Usage example:
    ```python
    from haystack_integrations.document_stores.care_retriever import CareFaissDocumentStore

    store = CareFaissDocumentStore("stores/care", model="models/care")  # built by `care-retriever index`
    assert store.count_documents() > 0
    ```

    :param path: the store: ``faiss:DIR`` (the spec the CLI takes) or the folder; created on the first write if
        missing. A Qdrant spec is refused in one line (search Qdrant with ``CareStoreRetriever``).
    :param model: the CARE model whose document space the embeddings are in. Recorded in a new
        store's manifest (so ``care-retriever search --model`` accepts the store) and checked
        against an existing one. Without it a new store is marked as built by an unknown model.
    :param embedding_dim: width of a new store when neither ``model`` nor an embedded document
        gives it (needed only if the first write has no embeddings).
    :param index_options: FAISS settings of a new store, checked here (one-line error), recorded in its
        manifest and serialised by ``to_dict``: ``type`` (flat | hnsw | ivf | ivfpq, default flat), ``quantize``
        (none | sq8 | binary | pq: compressed codes in RAM, the full vectors on disk, every search rescored),
        ``oversample`` (candidates per wanted hit rescored), ``m``, ``ef_construction``, ``ef_search``,
        ``nlist``, ``nprobe``, ``pq_m``; e.g. ``{"quantize": "sq8", "oversample": 2}`` (benchmarks/results). Qdrant
        collections (with ``on_disk``, ``shards``, ``replicas``) are written by ``care-retriever index`` or
        LangChain's ``CareVectorStore`` and searched from Haystack with ``CareStoreRetriever``.
    :param return_embedding: whether ``filter_documents`` returns embeddings (read back from FAISS).
    """

    def __init__(
        self,
        path: str,
        model: str | None = None,
        embedding_dim: int | None = None,
        index_options: dict[str, Any] | None = None,
        return_embedding: bool = True,
    ) -> None:
        self.path = str(path)
        self.model = model
        self.embedding_dim = embedding_dim
        self.index_options = index_options  # read once, through FaissIndexConfig (the setter)
        self.return_embedding = return_embedding
        self._space: tuple[int, str, str] | None = model_space(model) if model else None
        # What a new store's scores are: the model's similarity (dot for the authors' released models).
        self._metric = model_metric(model) if model else None
        self._store = FaissStore(faiss_folder(path))
        if self._space is not None and self._store.manifest is not None:
            self._store.check_compatible(self._space[1], self._space[0])
        if self._space is not None and embedding_dim is not None and embedding_dim != self._space[0]:
            raise InputError(f"embedding_dim={embedding_dim} but the model {model} embeds into {self._space[0]} dims")

    @property
    def index_options(self) -> dict[str, Any] | None:
        """The settings as given (what ``to_dict`` serialises); the store gets their config."""
        return self._index_options

    @index_options.setter
    def index_options(self, options: dict[str, Any] | None) -> None:
        self._index_config = check_index_options("faiss", options)
        self._index_options = None if options is None else dict(options)

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(
            self,
            path=self.path,
            model=self.model,
            embedding_dim=self.embedding_dim,
            index_options=self.index_options,
            return_embedding=self.return_embedding,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CareFaissDocumentStore:
        return default_from_dict(cls, data)

    # ------------------------------------------------------------------ reading
    @property
    def dim(self) -> int | None:
        """Width of the stored vectors (None until the first write)."""
        manifest = self._store.manifest
        if manifest is not None:
            return manifest.dim
        return self._space[0] if self._space else self.embedding_dim

    @property
    def similarity(self) -> str:
        """What this store's scores are: ``cosine`` or ``dot`` (its manifest's metric, else its model's)."""
        manifest = self._store.manifest
        return manifest.metric if manifest is not None else (self._metric or "cosine")

    def count_documents(self) -> int:
        return self._store.count()

    def _to_haystack(self, doc: CoreDocument | Hit, score: float | None = None) -> Document:
        meta = from_core_metadata(doc.title, doc.metadata, hidden=(NO_EMBEDDING,))
        return Document(id=doc.id, content=doc.text, meta=meta, score=score)

    def _with_embeddings(self, docs: list[Document]) -> list[Document]:
        """Attach stored vectors (read back from FAISS) to documents that were written with one."""
        vectors = self._store.vectors([d.id for d in docs])
        return [d if v is None else replace(d, embedding=v.tolist()) for d, v in zip(docs, vectors, strict=True)]

    def _matching(self, filters: dict[str, Any] | None) -> list[tuple[CoreDocument, Document]]:
        node = parse_haystack_filters(filters)  # the core language, evaluated on the listing it reads anyway
        stored = self._store.iter_documents() if self._store.manifest is not None else ()
        pairs = [(core, self._to_haystack(core)) for core in stored]
        return [(c, d) for c, d in pairs if matches(node, d.meta)]

    def filter_documents(self, filters: dict[str, Any] | None = None) -> list[Document]:
        """Documents matching Haystack ``filters`` (all documents without), in insertion order."""
        pairs = self._matching(filters)
        if not self.return_embedding:
            return [d for _, d in pairs]
        embedded = self._with_embeddings([d for c, d in pairs if NO_EMBEDDING not in c.metadata])
        by_id = {d.id: d for d in embedded}
        return [by_id.get(d.id, d) for _, d in pairs]

    def count_documents_by_filter(self, filters: dict[str, Any]) -> int:
        return len(self._matching(filters))

    # ------------------------------------------------------------------ writing
    def _resolve_dim(self, embedded: list[Document]) -> int:
        dim = self.dim
        if dim is None and embedded:
            dim = len(embedded[0].embedding or [])
        if dim is None:
            raise InputError(
                f"{self.path}: the store has no dimension yet and no document has an embedding; "
                "pass model=... or embedding_dim=... to CareFaissDocumentStore"
            )
        return dim

    def _space_for_write(self, dim: int) -> tuple[str, str]:
        manifest = self._store.manifest
        if manifest is not None:
            return manifest.space_fingerprint, manifest.model_name
        if self._space is not None:
            return self._space[1], self._space[2]
        logger.warning("%s: no model given; the new store is marked as built by an unknown model", self.path)
        return UNKNOWN_FINGERPRINT, ""

    def write_documents(self, documents: list[Document], policy: DuplicatePolicy = DuplicatePolicy.NONE) -> int:
        """Write documents; ``DuplicatePolicy.NONE`` means FAIL. All-or-nothing: an error writes nothing."""
        if not isinstance(documents, list) or any(not isinstance(d, Document) for d in documents):
            raise ValueError("Please provide a list of Documents.")
        policy = DuplicatePolicy.FAIL if policy == DuplicatePolicy.NONE else policy
        unique: dict[str, Document] = {}
        for doc in documents:
            if doc.id in unique:
                if policy == DuplicatePolicy.FAIL:
                    raise DuplicateDocumentError(f"ID '{doc.id}' appears twice in the documents to write.")
                if policy == DuplicatePolicy.SKIP:
                    continue
            unique[doc.id] = doc
        docs = list(unique.values())
        for doc in docs:
            if doc.content is None:
                raise InputError(f"document {doc.id!r} has content=None; CareFaissDocumentStore stores text documents")
            if doc.blob is not None or doc.sparse_embedding is not None:
                raise InputError(f"document {doc.id!r}: blob and sparse_embedding are not supported by this store")
        existing = set(self._store.content_hashes([d.id for d in docs])) if self._store.manifest else set()
        if existing and policy == DuplicatePolicy.FAIL:
            raise DuplicateDocumentError(f"ID '{sorted(existing)[0]}' already exists.")
        if policy == DuplicatePolicy.SKIP:
            docs = [d for d in docs if d.id not in existing]
        if not docs:
            return 0
        embedded = [d for d in docs if d.embedding is not None]
        dim = self._resolve_dim(embedded)
        matrix = as_matrix([d.embedding for d in docs if d.embedding is not None], dim, "write_documents")
        vectors = np.zeros((len(docs), dim), dtype=np.float32)
        rows = [i for i, d in enumerate(docs) if d.embedding is not None]
        if rows:
            vectors[rows] = prepare_vectors(self._store.manifest, matrix, self._metric)
        core_docs = []
        for doc in docs:
            core = to_core_document(doc.id, doc.content or "", doc.meta)
            if doc.embedding is None:
                core.metadata[NO_EMBEDDING] = True
            core_docs.append(core)
        fingerprint, model_name = self._space_for_write(dim)
        metric = None if self._store.manifest is not None else self._metric
        with self._store.transaction(dim, fingerprint, model_name, self._index_config, metric=metric) as store:
            store.upsert(core_docs, vectors)
        return len(docs)

    def delete_documents(self, document_ids: list[str]) -> None:
        """Delete by id; ids that do not exist are ignored."""
        manifest = self._store.manifest
        if manifest is None or not document_ids:
            return
        if not self._store.content_hashes(list(document_ids)):
            return
        with self._store.transaction(manifest.dim, manifest.space_fingerprint, manifest.model_name) as store:
            store.delete(list(document_ids))

    def delete_all_documents(self) -> None:
        self.delete_documents([d.id for _, d in self._matching(None)])

    def delete_by_filter(self, filters: dict[str, Any]) -> int:
        ids = [d.id for _, d in self._matching(filters)]
        self.delete_documents(ids)
        return len(ids)

    def update_by_filter(self, filters: dict[str, Any], meta: dict[str, Any]) -> int:
        """Merge ``meta`` into the metadata of matching documents (their vectors are kept, not re-encoded)."""
        matched = self._matching(filters)
        manifest = self._store.manifest
        if not matched or manifest is None:
            return 0
        vectors = self._store.vectors([d.id for _, d in matched])
        core_docs = []
        for core, doc in matched:
            updated = to_core_document(doc.id, core.text, {**doc.meta, **meta})
            if NO_EMBEDDING in core.metadata:
                updated.metadata[NO_EMBEDDING] = True
            core_docs.append(updated)
        matrix = np.stack([v if v is not None else np.zeros(manifest.dim, np.float32) for v in vectors])
        with self._store.transaction(manifest.dim, manifest.space_fingerprint, manifest.model_name) as store:
            store.upsert(core_docs, matrix)
        return len(core_docs)

    # ------------------------------------------------------------------ retrieval
    def embedding_retrieval(
        self,
        query_embedding: list[float],
        filters: dict[str, Any] | None = None,
        top_k: int = 10,
        scale_score: bool = False,
        return_embedding: bool = False,
    ) -> list[Document]:
        """Top-``k`` documents by the store's similarity (cosine, or dot product for a dot-product model) to
        ``query_embedding``, Haystack ``filters`` applied."""
        if not isinstance(query_embedding, list) or not query_embedding:
            raise InputError("query_embedding should be a non-empty list of floats.")
        if top_k < 1:
            raise InputError(f"top_k must be >= 1, got {top_k}")
        validate_filters(filters)
        manifest = self._store.manifest
        if manifest is None:
            return []
        query = prepare_vectors(manifest, as_matrix([query_embedding], manifest.dim, "query_embedding"))

        hits = self._store.search(query, top_k, core_filters(filters, hidden=NO_EMBEDDING))[0]  # run in the store
        docs = [self._to_haystack(h, score=h.score) for h in hits]
        if scale_score:
            docs = [replace(d, score=cosine_to_unit(d.score or 0.0)) for d in docs]
        return self._with_embeddings(docs) if return_embedding else docs

    def close(self) -> None:
        self._store.close()

    # ------------------------------------------------------------------ async twins
    # The writer thread is made on the first async write (a store used only synchronously has none).
    _writer: ThreadPoolExecutor | None = None

    async def _in_writer(self, call: Callable[[], _T]) -> _T:
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="care-faiss-writer")
        return await asyncio.get_running_loop().run_in_executor(self._writer, call)

    async def count_documents_async(self) -> int:
        return await asyncio.to_thread(self.count_documents)

    async def filter_documents_async(self, filters: dict[str, Any] | None = None) -> list[Document]:
        """:meth:`filter_documents` in a worker thread."""
        return await asyncio.to_thread(self.filter_documents, filters)

    async def count_documents_by_filter_async(self, filters: dict[str, Any]) -> int:
        return await asyncio.to_thread(self.count_documents_by_filter, filters)

    async def write_documents_async(
        self, documents: list[Document], policy: DuplicatePolicy = DuplicatePolicy.NONE
    ) -> int:
        """:meth:`write_documents` in the writer thread: all-or-nothing, in the order the writes were awaited."""
        return await self._in_writer(lambda: self.write_documents(documents, policy))

    async def delete_documents_async(self, document_ids: list[str]) -> None:
        await self._in_writer(lambda: self.delete_documents(document_ids))

    async def delete_all_documents_async(self) -> None:
        await self._in_writer(self.delete_all_documents)

    async def delete_by_filter_async(self, filters: dict[str, Any]) -> int:
        return await self._in_writer(lambda: self.delete_by_filter(filters))

    async def update_by_filter_async(self, filters: dict[str, Any], meta: dict[str, Any]) -> int:
        return await self._in_writer(lambda: self.update_by_filter(filters, meta))

    async def embedding_retrieval_async(
        self,
        query_embedding: list[float],
        filters: dict[str, Any] | None = None,
        top_k: int = 10,
        scale_score: bool = False,
        return_embedding: bool = False,
    ) -> list[Document]:
        """:meth:`embedding_retrieval` in a worker thread (FAISS searches a local index)."""
        return await asyncio.to_thread(
            self.embedding_retrieval, query_embedding, filters, top_k, scale_score, return_embedding
        )

    async def close_async(self) -> None:
        """Finish the awaited writes, then :meth:`close` (``DocumentWriter.close_async`` calls this)."""
        if self._writer is not None:
            writer, self._writer = self._writer, None
            await asyncio.to_thread(writer.shutdown, wait=True)
        await asyncio.to_thread(self.close)
