"""What a store may do beyond the core (:class:`~care_retriever.stores.base.VectorStore`): one class a capability.

A store kind claims a capability by subclassing it; a caller checks it with ``isinstance``, or with
:meth:`Capability.require`, which refuses a store without it in one line naming the store, its kind and the
capability. They are ABC mixins rather than ``typing.Protocol`` classes: a store claims one by name (a method that
happens to be called ``verify`` does not make a store verifiable), a capability carries methods built from its
others (``iter_stored``, ``transaction``), and a kind that forgets a method fails when it is made.

- :class:`SparseSearch`: a BM25 side and hybrid search.
- :class:`WriteRuns`: writes grouped in runs, with checkpoints, a publish and a rollback.
- :class:`Verification`: integrity checks.
- :class:`StoredIteration`: reading everything back, what a copy between stores needs.
- :class:`IndexBuilding`: how a bulk write builds the store's index on this machine.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from care_retriever.documents import Document
from care_retriever.errors import InputError, StoreError
from care_retriever.stores.base import Hit, LocalFootprint, Manifest, StoredBatch, VectorStore
from care_retriever.stores.config import StoreConfig
from care_retriever.stores.filters import Filters
from care_retriever.stores.runs import RunTag

if TYPE_CHECKING:
    from typing_extensions import Self

    from care_retriever.sparse.fusion import FusionConfig

__all__ = [
    "CAPABILITIES",
    "Capability",
    "IndexBuilding",
    "SparseSearch",
    "StoredIteration",
    "Verification",
    "WriteRuns",
    "capabilities_of",
]


class Capability(VectorStore):
    """What the capabilities below share: their name for messages, and the check a caller makes."""

    capability: ClassVar[str] = "capability"

    @classmethod
    def require(cls, store: VectorStore, needed_by: str) -> Self:
        """``store`` as a store with this capability, or one line naming the store, its kind and what it lacks.

        :param store: the store a caller was handed.
        :param needed_by: what needs the capability, for the message (``"verify"``, ``"copy (its source)"``).
        """
        if isinstance(store, cls):
            return store
        what = f"a {store.backend} store has no {cls.capability}, which {needed_by} needs"
        raise StoreError(f"{store.describe()}: {what}")


class SparseSearch(Capability):
    """A store with a BM25 side (:mod:`care_retriever.sparse`) beside its vectors, and hybrid search over both.

    Usage example:
    ```python
    from care_retriever import open_store
    from care_retriever.stores.capabilities import SparseSearch

    store = SparseSearch.require(open_store("faiss:stores/care", create=False), "BM25 search")
    hits = store.search_sparse(["高血压"], top_k=3)[0]
    assert hits and all(hit.score > 0 for hit in hits)
    ```
    """

    capability: ClassVar[str] = "sparse (BM25) and hybrid search"
    # The fusion methods search_hybrid runs itself; search.hybrid fuses every other one from the two rankings.
    hybrid_fusions: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def enable_sparse(self, *, rebuild: bool = False, show_progress: bool = False) -> int:
        """Give the store a BM25 side built from the stored texts, nothing re-encoded.

        Published with the store's next commit / finalize; returns the number of documents tokenized (0 when it
        exists with this tokenizer and ``rebuild`` is off).

        :param rebuild: tokenize every stored text again even when the BM25 side exists.
        :param show_progress: draw a progress bar while tokenizing.
        """

    @abstractmethod
    def search_sparse(
        self, queries: Sequence[str], top_k: int, filters: Filters | None = None, *, payload: bool = True
    ) -> list[list[Hit]]:
        """BM25 top-``k`` hits for each query text (an empty list for a query with no indexed token).

        :param queries: the query texts.
        :param top_k: hits per query.
        :param filters: metadata filters; None: every document.
        :param payload: False: ids and scores only (empty text).
        :raises StoreError: the store has no sparse side.
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
        """Dense and BM25 rankings of each query fused by the store itself, for a method in :attr:`hybrid_fusions`.

        Callers go through :func:`care_retriever.search.hybrid.hybrid_search`, which also fuses the other methods.

        :param vectors: the query vectors, one row each.
        :param queries: the query texts, one per row.
        :param top_k: hits per query.
        :param filters: metadata filters; None: every document.
        :param fusion: the fusion method and its parameters (None: the defaults).
        :param payload: False: ids and scores only (empty text).
        """


class WriteRuns(Capability):
    """A store whose writes form runs: checkpoints (``commit``), a publish (``finalize``), a rollback (``abort``).

    A store that stages a bulk write (FAISS) also keeps the run it belongs to and can say what a stopped run left
    pending; one that publishes each write as it is made (Qdrant) has nothing pending.

    Usage example:
    ```python
    from care_retriever import AsymmetricEmbedder, Document, open_store
    from care_retriever.stores.capabilities import WriteRuns

    embedder = AsymmetricEmbedder.from_pretrained("models/care", load="document")
    docs = [Document(id="bp-1", text="高血压的一线用药包括利尿剂。")]
    vectors = embedder.embed_documents([doc.embedding_text() for doc in docs])
    store = WriteRuns.require(open_store("faiss:stores/runs"), "a transaction")
    with store.transaction(embedder.dim, embedder.space_fingerprint, metric=embedder.similarity) as writing:
        writing.upsert(docs, vectors)
    assert store.count() == 1
    ```
    """

    capability: ClassVar[str] = "write runs (checkpoints, publish, rollback)"
    # A bulk write staged and published at its end (FAISS), or each write published as it is made (Qdrant).
    stages_bulk_writes: ClassVar[bool] = False

    def require_manifest(self) -> Manifest:
        # a first run stopped before it published: say what it left and how to end it, not "run index first"
        if self.manifest is None and (staged := self.pending_run()) is not None:
            raise StoreError(staged)
        return super().require_manifest()

    @abstractmethod
    def commit(self) -> None:
        """Make everything written so far durable (a checkpoint a crashed run resumes from)."""

    @abstractmethod
    def finalize(self) -> None:
        """Publish the writes: after this, readers see the new store."""

    def abort(self) -> None:  # stores without rollback keep what was written
        """Drop the writes since :meth:`prepare` (where the backend can) and release the writer lock."""

    def claim_run(self, run: RunTag) -> None:  # a store publishing each write: nothing pending
        """The run the next :meth:`prepare` belongs to: a staged write resumes only its own run's staging copy.

        :param run: the run's tag (:mod:`care_retriever.stores.runs`).
        """

    def pending_run(self) -> str | None:
        """One line on a bulk write left staged and unpublished (what run, how many documents, where); None: none."""
        return None

    def discard_pending(self) -> str | None:
        """Remove a pending staged write (nothing published is touched); what was removed, or None: nothing was."""
        return None

    def left_behind(self, written: int, fix: str) -> str:
        """What a run that stopped mid-way leaves here, for the end of its error line.

        Its last checkpoint staged (with how to finish or discard it); with none taken, nothing; in a store that
        publishes each write as it is made (Qdrant), the ``written`` documents.

        :param written: how many documents the run wrote before it stopped.
        :param fix: what the user mends before running it again.
        """
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
    ) -> Iterator[WriteRuns]:
        """One all-or-nothing write: ``upsert`` / ``delete`` inside, published on success, aborted on error.

        :param dim: the vectors' width (None: the existing store's; a new store needs it).
        :param space_fingerprint: the model's document space (None: the existing store's; a new store needs it).
        :param model_name: the document tower's name, for messages (empty: the existing store's).
        :param index: the config of the store's kind (None: an existing store's own, a new one's defaults).
        :param metric: ``cosine`` or ``dot`` (None: the existing store's, else ``cosine``).
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
        """Start a :meth:`transaction` (by default a :meth:`prepare`).

        :param dim: the vectors' width.
        :param space_fingerprint: the model's document space.
        :param model_name: the document tower's name, for messages.
        :param index: the config of the store's kind (None: an existing store's own, a new one's defaults).
        :param metric: ``cosine`` or ``dot``.
        """
        self.prepare(dim, space_fingerprint, model_name, index, metric=metric)


class Verification(Capability):
    """A store that checks its own integrity: ``store.verify()`` reads it whole and returns the live count.

    Usage example:
    ```python
    from care_retriever import open_store
    from care_retriever.stores.capabilities import Verification

    store = open_store("faiss:stores/care", create=False)
    assert Verification.require(store, "verify").verify() == store.count()
    ```
    """

    capability: ClassVar[str] = "integrity checks (verify)"
    # Whether ``verify --record-checksums`` has checksums to record (a server checks its own files, keeps none).
    keeps_checksums: ClassVar[bool] = False

    @abstractmethod
    def verify(self, *, record_checksums: bool = False) -> int:
        """Check the whole store (every byte where the backend allows); return the live count.

        :param record_checksums: record the checksums after every other check (stores that :attr:`keeps_checksums`).
        :raises StoreError: the first problem found.
        """


class StoredIteration(Capability):
    """A store that reads back everything it holds, vectors included, as a copy to another store needs.

    Usage example:
    ```python
    from care_retriever import open_store
    from care_retriever.stores.capabilities import StoredIteration

    store = StoredIteration.require(open_store("faiss:stores/care", create=False), "reading it back")
    batches = list(store.iter_stored(batch=16))
    assert sum(len(batch) for batch in batches) == store.count()
    ```
    """

    capability: ClassVar[str] = "iteration over its documents and vectors"

    @abstractmethod
    def iter_documents(self, batch: int = 1000) -> Iterator[Document]:
        """Every live document, in a stable order.

        :param batch: how many are read at a time.
        """

    @abstractmethod
    def vectors(self, ids: Sequence[str]) -> list[np.ndarray | None]:
        """Stored vector of each id (None where the id is missing).

        :param ids: the document ids.
        """

    def iter_stored(self, batch: int = 1000) -> Iterator[StoredBatch]:
        """Every live document with its stored vector and content hash, ``batch`` at a time.

        In :meth:`iter_documents`' order; a document without a vector or content hash is a corrupted store.

        :param batch: how many documents each :class:`~care_retriever.stores.base.StoredBatch` holds.
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


class IndexBuilding(Capability):
    """A store whose bulk writes build an index on this machine (what ``index`` orders and checks free space by).

    Usage example:
    ```python
    from care_retriever import open_store
    from care_retriever.stores.capabilities import IndexBuilding
    from care_retriever.stores.config import FaissIndexConfig

    store = IndexBuilding.require(open_store("faiss:stores/ivf"), "index building")
    assert store.trains_on_first_vectors(FaissIndexConfig(index_type="ivf", nlist=8))
    print(store.vectors_to_train(64, FaissIndexConfig(index_type="ivf", nlist=8)))
    ```
    """

    capability: ClassVar[str] = "index building on this machine"

    @abstractmethod
    def trains_on_first_vectors(self, index: StoreConfig = None) -> bool:
        """Whether a write prepared with ``index`` trains the store's index on the first vectors it is given.

        A new FAISS store with IVF lists or compressed codes does: the index writer then writes the corpus in order.

        :param index: the config of the store's kind (None: an existing store's own, a new one's defaults).
        """

    def vectors_to_train(self, dim: int, index: StoreConfig = None) -> int:
        """How many vectors the first batch of a write must hold to train the store's index (0: it trains nothing).

        :param dim: the vectors' width.
        :param index: the config of the store's kind (None: an existing store's own, a new one's defaults).
        """
        return 0

    @abstractmethod
    def local_footprint(self, index: StoreConfig = None) -> LocalFootprint | None:
        """Where a bulk write writes on this machine, and what it adds there; None: in memory or on a server.

        :param index: the config of the store's kind (None: an existing store's own, a new one's defaults).
        """


CAPABILITIES: tuple[type[Capability], ...] = (SparseSearch, WriteRuns, Verification, StoredIteration, IndexBuilding)


def capabilities_of(store: VectorStore | type[VectorStore]) -> frozenset[type[Capability]]:
    """The capabilities a store (or a store kind) claims, out of :data:`CAPABILITIES`."""
    kind = store if isinstance(store, type) else type(store)
    return frozenset(c for c in CAPABILITIES if issubclass(kind, c))
