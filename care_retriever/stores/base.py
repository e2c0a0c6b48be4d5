"""What every vector store provides (the manifest tying a store to a model: :mod:`care_retriever.stores.manifest`)."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from care_retriever.documents import Document
from care_retriever.errors import InputError, StoreError
from care_retriever.stores.config import StoreConfig
from care_retriever.stores.filters import Filters
from care_retriever.stores.manifest import READABLE_FORMAT_VERSION as READABLE_FORMAT_VERSION
from care_retriever.stores.manifest import STORE_FORMAT_VERSION as STORE_FORMAT_VERSION
from care_retriever.stores.manifest import Manifest as Manifest
from care_retriever.stores.manifest import check_metric as check_metric
from care_retriever.stores.manifest import default_versions as default_versions
from care_retriever.stores.runs import RunTag

if TYPE_CHECKING:
    from care_retriever.sparse.fusion import FusionConfig


@dataclass
class Hit:
    """One search result. ``score`` is the model's similarity of query and document (cosine, or dot product)."""

    id: str
    score: float
    text: str
    title: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LocalFootprint:
    """Where a store's data lives on this machine and what a bulk write into it adds there beside each document's
    own bytes: what the ``index`` command checks the free space against before it encodes
    (:mod:`care_retriever.indexing.space`)."""

    path: Path  # the store's folder or local file (its file system's free space is checked)
    published_bytes: int = 0  # a bulk write's copy of the published store (FAISS stages one beside it)
    quantized: bool = False  # each vector written twice: compressed codes and the full vector that rescores them


@dataclass(frozen=True)
class StoredBatch:
    """A batch of what a store holds, as :meth:`VectorStore.iter_stored` reads it: the documents, their stored
    vectors (one float32 row each, as the store's model gave them) and their stored content hashes, in one order."""

    documents: list[Document]
    vectors: np.ndarray
    content_hashes: list[str]

    def __len__(self) -> int:
        return len(self.documents)


class VectorStore(ABC):
    """A store of document vectors plus their text, title and metadata, keyed by document id."""

    backend: str
    manifest: Manifest | None
    # The fusion methods search_hybrid runs itself (Qdrant: rrf and dbsf on the server); every other method
    # fuses the two rankings in care_retriever.search.hybrid, which calls search and search_sparse.
    hybrid_fusions: ClassVar[tuple[str, ...]] = ()

    @property
    def dim(self) -> int:
        return self.require_manifest().dim

    def require_manifest(self) -> Manifest:
        if self.manifest is None:
            # a first run stopped before it published: say what it left and how to end it, not "run index first"
            staged = self.pending_run()
            if staged is not None:
                raise StoreError(staged)
            raise StoreError(f"{self.describe()}: store is empty or does not exist (run `care-retriever index` first)")
        return self.manifest

    def check_compatible(self, space_fingerprint: str, dim: int) -> None:
        """Refuse a model whose document space is not the one this store was built with."""
        manifest = self.require_manifest()
        if manifest.dim != dim:
            raise StoreError(
                f"{self.describe()}: dimension mismatch: the store holds {manifest.dim}-dim vectors, "
                f"the model gives {dim}"
            )
        if manifest.space_fingerprint != space_fingerprint:
            raise StoreError(
                f"{self.describe()}: built with another model (fingerprint {manifest.space_fingerprint[:12]}, "
                f"model {manifest.model_name or '?'}); this model's is {space_fingerprint[:12]}. "
                "Re-index with this model"
            )

    @abstractmethod
    def describe(self) -> str:
        """The store spec, for messages."""

    @abstractmethod
    def prepare(
        self,
        dim: int,
        space_fingerprint: str,
        model_name: str,
        index: StoreConfig = None,
        *,
        metric: str = "cosine",
    ) -> None:
        """Create the store, or check that an existing one matches; then accept writes.

        ``index``: the config of the store's kind (:class:`~care_retriever.stores.config.FaissIndexConfig`,
        :class:`~care_retriever.stores.config.QdrantCollectionConfig`), None for an existing store's own settings or
        a new one's defaults; a dict or the other kind's config is one line (a user's dict is read once where it is
        handed in: :func:`~care_retriever.stores.config.store_config`).
        ``metric``: what the model's scores are (:data:`METRICS`): ``cosine`` for unit vectors, ``dot`` for a
        model whose document vectors are normalised before a Matryoshka cut (norms below 1; the authors'
        released models). Recorded in the manifest; Qdrant compares vectors with it.
        """

    @abstractmethod
    def trains_on_first_vectors(self, index: StoreConfig = None) -> bool:
        """Whether a write prepared with ``index`` trains the store's index on the first vectors it is given (a
        new FAISS store with IVF lists or compressed codes): the index writer then writes the corpus's first
        documents first, as read, rather than its longest."""

    def vectors_to_train(self, dim: int, index: StoreConfig = None) -> int:
        """How many vectors the first batch of a write prepared with ``index`` must hold to train the store's index
        (0: it trains nothing); a source or corpus with fewer cannot fill it, whatever the batch size."""
        return 0

    @abstractmethod
    def local_footprint(self, index: StoreConfig = None) -> LocalFootprint | None:
        """Where a bulk write with ``index`` writes on this machine, and what it adds there (:class:`LocalFootprint`);
        None for a store held in memory or on a server (no local disk to check)."""

    @abstractmethod
    def content_hashes(self, ids: Sequence[str]) -> dict[str, str]:
        """Stored content hash for each of ``ids`` that exists."""

    @abstractmethod
    def upsert(
        self, documents: Sequence[Document], vectors: np.ndarray, *, sparse_tokens: Sequence[list[str]] | None = None
    ) -> None:
        """Insert documents, replacing any stored under the same id.

        ``sparse_tokens``: the BM25 tokens of each document's ``embedding_text()``
        (:func:`care_retriever.sparse.tokenizer.tokenize`), when the caller has them already (the index
        writer tokenises while the tower encodes); None: the store tokenises, if it has a sparse side.
        """

    @abstractmethod
    def delete(self, ids: Sequence[str]) -> int:
        """Remove documents by id; return how many existed."""

    @abstractmethod
    def commit(self) -> None:
        """Make everything written so far durable (a checkpoint a crashed run resumes from)."""

    @abstractmethod
    def finalize(self) -> None:
        """Publish the writes: after this, readers see the new store."""

    @abstractmethod
    def search(
        self, vectors: np.ndarray, top_k: int, filters: Filters | None = None, *, payload: bool = True
    ) -> list[list[Hit]]:
        """Top-``k`` hits for each query vector (rows of ``vectors``).

        ``payload=False`` returns ids and scores only (empty text): hybrid search fuses 100 candidates
        a side and reads the documents of the final top-``k`` alone.
        """

    @abstractmethod
    def get(self, ids: Sequence[str]) -> list[Document | None]:
        """Stored documents by id (None where missing)."""

    @abstractmethod
    def count(self, filters: Filters | None = None) -> int:
        """Number of live documents (matching ``filters`` when given)."""

    @abstractmethod
    def iter_documents(self, batch: int = 1000) -> Iterator[Document]:
        """Every live document, in a stable order."""

    @abstractmethod
    def vectors(self, ids: Sequence[str]) -> list[np.ndarray | None]:
        """Stored vector of each id (None where the id is missing)."""

    def iter_stored(self, batch: int = 1000) -> Iterator[StoredBatch]:
        """Every live document with its stored vector and content hash, ``batch`` at a time, in
        :meth:`iter_documents`' order: what moves a store to another without re-encoding
        (:func:`care_retriever.stores.copying.copy_store`).

        Built from :meth:`iter_documents`, :meth:`vectors` and :meth:`content_hashes`, so every store has it; a
        document without a vector or a content hash is a corrupted store (one line).
        """
        if batch < 1:
            raise InputError(f"batch must be >= 1, got {batch}")
        documents: list[Document] = []
        for document in self.iter_documents(batch):
            documents.append(document)
            if len(documents) == batch:
                yield self._stored_batch(documents)
                documents = []
        if documents:
            yield self._stored_batch(documents)

    def _stored_batch(self, documents: list[Document]) -> StoredBatch:
        ids = [d.id for d in documents]
        vectors = self.vectors(ids)
        hashes = self.content_hashes(ids)
        missing = [i for i, v in zip(ids, vectors, strict=True) if v is None or i not in hashes]
        if missing:
            raise StoreError(
                f"{self.describe()}: {len(missing)} documents have no stored vector or content hash (first: "
                f"{missing[0]!r}); the store is corrupted: run `care-retriever verify`"
            )
        matrix = np.stack([np.asarray(v, dtype=np.float32) for v in vectors]) if ids else np.empty((0, self.dim))
        return StoredBatch(documents, matrix.astype(np.float32, copy=False), [hashes[i] for i in ids])

    # ------------------------------------------------------------------ the sparse (BM25) side
    @abstractmethod
    def enable_sparse(self, *, rebuild: bool = False, show_progress: bool = False) -> int:
        """Give the store a BM25 side (:mod:`care_retriever.sparse`) built from the stored texts, nothing
        re-encoded; return the number of documents tokenized (0 when it exists with this tokenizer and
        ``rebuild`` is off). Published with the store's next commit / finalize."""

    @abstractmethod
    def search_sparse(
        self, queries: Sequence[str], top_k: int, filters: Filters | None = None, *, payload: bool = True
    ) -> list[list[Hit]]:
        """BM25 top-``k`` hits for each query text (an empty list for a query with no indexed token).

        Raises :class:`StoreError` when the store has no sparse side (:func:`care_retriever.sparse.require_sparse`).
        """

    @abstractmethod
    def search_hybrid(
        self,
        vectors: np.ndarray,
        queries: Sequence[str],
        top_k: int,
        filters: Filters | None = None,
        *,
        fusion: FusionConfig | None = None,
        payload: bool = True,
    ) -> list[list[Hit]]:
        """Dense and BM25 rankings of each query (row of ``vectors`` and its text) fused by the store itself,
        for ``fusion.method`` in :attr:`hybrid_fusions`; callers go through
        :func:`care_retriever.search.hybrid.hybrid_search`, which also fuses the other methods."""

    # Whether the store keeps checksums that ``verify --record-checksums`` can record: of its files, which a
    # stopped writer can leave describing the version before its last write (FAISS), or of its manifest, which an
    # earlier release wrote without one (Qdrant Edge); a server checks its own files and keeps none.
    keeps_checksums: ClassVar[bool] = False

    def verify(self, *, record_checksums: bool = False) -> int:
        """Check the whole store (every byte where the backend allows); return the live count.

        Raises :class:`StoreError` naming the first problem found, or the files whose checksums could not be
        checked; ``record_checksums`` (stores that :attr:`keeps_checksums`) records those after every other check.
        """
        manifest = self.require_manifest()
        return self.count() if manifest else 0

    def abort(self) -> None:  # noqa: B027 - stores without rollback keep what was written
        """Drop the writes since :meth:`prepare` (where the backend can) and release the writer lock."""

    # ------------------------------------------------------------------ runs left pending (which run: stores.runs)
    # Whether a bulk write is staged and published at its end (FAISS), or each write is published as it is made
    # (Qdrant: a run that stops leaves what it wrote, and nothing pending).
    stages_bulk_writes: ClassVar[bool] = False

    def claim_run(self, run: RunTag) -> None:  # noqa: B027 - stores that publish each write have nothing pending
        """The run the next :meth:`prepare` belongs to: a staged write resumes only its own run's staging copy."""

    def pending_run(self) -> str | None:
        """One line on a bulk write left staged and unpublished (what run, how many documents, where); None: none."""
        return None

    def discard_pending(self) -> str | None:
        """Remove a pending staged write (nothing published is touched); what was removed, or None: nothing was."""
        return None

    def left_behind(self, written: int, fix: str) -> str:
        """What a run that stopped mid-way leaves here, for its error line: its last checkpoint staged (with how to
        finish or discard it); with none taken, nothing (the staged copy is dropped); in a store that publishes each
        write as it is made (Qdrant), the ``written`` documents. ``fix``: what the user mends before running it again.

        Read from the store's own state alone (:meth:`pending_run`, :attr:`stages_bulk_writes`), so it lives with
        that state: the index writer and ``copy`` both end their error lines with it."""
        staged = self.pending_run()
        if staged is not None:
            return f"the run stopped there; {fix}: {staged}"
        self.abort()
        if self.stages_bulk_writes or not written:
            return "the run stopped there; nothing of it was published"
        return (
            f"the run stopped there; the {written} documents written before it stay in {self.describe()} "
            f"(each write is published as it is made): {fix} and run the same command again "
            "(they are skipped as unchanged)"
        )

    @contextmanager
    def transaction(
        self,
        dim: int | None = None,
        space_fingerprint: str | None = None,
        model_name: str = "",
        index: StoreConfig = None,
        *,
        metric: str | None = None,
    ) -> Iterator[VectorStore]:
        """One all-or-nothing write: ``upsert`` / ``delete`` inside, published on success, aborted on error.

        ``dim`` and ``space_fingerprint`` default to the existing store's (they are needed to create one).
        """
        manifest = self.manifest
        if dim is None or space_fingerprint is None:
            if manifest is None:
                raise StoreError(f"{self.describe()}: a new store needs dim and space_fingerprint for its first write")
            dim, space_fingerprint = manifest.dim, manifest.space_fingerprint
            model_name = model_name or manifest.model_name
        if metric is None:
            metric = manifest.metric if manifest is not None else "cosine"
        self.begin(dim, space_fingerprint, model_name, index, metric=metric)
        try:
            yield self
            self.finalize()
        except BaseException:
            self.abort()
            raise

    def begin(
        self,
        dim: int,
        space_fingerprint: str,
        model_name: str,
        index: StoreConfig = None,
        *,
        metric: str = "cosine",
    ) -> None:
        """Start a :meth:`transaction` (by default a :meth:`prepare`)."""
        self.prepare(dim, space_fingerprint, model_name, index, metric=metric)

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release files and connections."""

    def __enter__(self) -> VectorStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ reads from an event loop
    # Each runs the sync read in a worker thread, so an async caller's loop keeps running while the store
    # works; a store with an async client of its own (a Qdrant server) awaits it instead.
    async def search_async(
        self, vectors: np.ndarray, top_k: int, filters: Filters | None = None, *, payload: bool = True
    ) -> list[list[Hit]]:
        """:meth:`search` without blocking the event loop."""
        return await asyncio.to_thread(self.search, vectors, top_k, filters, payload=payload)

    async def get_async(self, ids: Sequence[str]) -> list[Document | None]:
        """:meth:`get` without blocking the event loop."""
        return await asyncio.to_thread(self.get, ids)

    async def count_async(self, filters: Filters | None = None) -> int:
        """:meth:`count` without blocking the event loop."""
        return await asyncio.to_thread(self.count, filters)

    async def aclose(self) -> None:
        """:meth:`close`, and any async client the store opened."""
        await asyncio.to_thread(self.close)
