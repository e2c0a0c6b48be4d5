"""The core every vector store provides: open, write, delete, search, count, describe.

What a store may do beyond it (sparse and hybrid search, write runs with checkpoints, verification, iteration for
copies, index building) is a capability of its own in :mod:`care_retriever.stores.capabilities`, which callers
check. The manifest tying a store to a model: :mod:`care_retriever.stores.manifest`.

The core, one line a method (each store kind implements the abstract ones):

- ``describe()``: the store spec, for messages.
- ``prepare(dim, space_fingerprint, model_name, index, metric=...)``: open for writes (create, or check a match).
- ``upsert(documents, vectors, sparse_tokens=...)``: write documents, replacing those stored under the same ids.
- ``delete(ids)``: remove documents by id; how many existed.
- ``search(vectors, top_k, filters, payload=...)``: top-``k`` hits per query vector.
- ``get(ids)``: stored documents by id.
- ``count(filters)``: number of live documents.
- ``content_hashes(ids)``: each stored document's content hash (what makes a write skip unchanged documents).
- ``search_async`` / ``get_async`` / ``count_async`` / ``aclose``: the reads from an event loop.
- ``manifest``, ``dim``, ``require_manifest()``, ``check_compatible()``, ``close()``: the store's model and its end.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from care_retriever.documents import Document
from care_retriever.errors import StoreError
from care_retriever.stores.config import StoreConfig
from care_retriever.stores.filters import Filters
from care_retriever.stores.manifest import READABLE_FORMAT_VERSION as READABLE_FORMAT_VERSION
from care_retriever.stores.manifest import STORE_FORMAT_VERSION as STORE_FORMAT_VERSION
from care_retriever.stores.manifest import Manifest as Manifest
from care_retriever.stores.manifest import check_metric as check_metric
from care_retriever.stores.manifest import default_versions as default_versions


@dataclass
class Hit:
    """One search result.

    Usage example:
    ```python
    from care_retriever import CareRetriever

    retriever = CareRetriever.from_pretrained("models/care", "faiss:stores/care")
    hit = retriever.search("发烧怎么办", top_k=1)[0]
    print(hit.id, round(hit.score, 3), hit.to_dict()["text"][:20])
    ```

    :param id: the document id.
    :param score: the model's similarity of query and document (cosine, or dot product; hybrid: the fused score).
    :param text: the document's text.
    :param title: its title.
    :param metadata: its metadata.
    """

    id: str
    score: float
    text: str
    title: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The hit as a dict of its fields (as the HTTP service returns it)."""
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
    """A batch of what a store holds, as
    :meth:`~care_retriever.stores.capabilities.StoredIteration.iter_stored` reads it: the documents, their stored
    vectors (one float32 row each, as the store's model gave them) and their stored content hashes, in one order."""

    documents: list[Document]
    vectors: np.ndarray
    content_hashes: list[str]

    def __len__(self) -> int:
        return len(self.documents)


class VectorStore(ABC):
    """A store of document vectors plus their text, title and metadata, keyed by document id: the core.

    A store kind's class implements the abstract methods; :func:`~care_retriever.stores.open_store` opens one from
    a spec.

    Usage example:
    ```python
    from care_retriever import AsymmetricEmbedder, open_store

    embedder = AsymmetricEmbedder.from_pretrained("models/care", load="query")
    with open_store("faiss:stores/care", create=False) as store:
        store.check_compatible(embedder.space_fingerprint, embedder.dim)
        hits = store.search(embedder.embed_queries(["高血压怎么治疗"]), top_k=3)[0]
        assert store.get([hits[0].id])[0].text == hits[0].text
    ```
    """

    backend: str
    manifest: Manifest | None

    @property
    def dim(self) -> int:
        """The width of the stored vectors (the manifest's)."""
        return self.require_manifest().dim

    def require_manifest(self) -> Manifest:
        """The store's manifest; a store with none (empty, or a first run left staged) is one line."""
        if self.manifest is None:
            raise StoreError(f"{self.describe()}: store is empty or does not exist (run `care-retriever index` first)")
        return self.manifest

    def check_compatible(self, space_fingerprint: str, dim: int) -> None:
        """Refuse a model whose document space is not the one this store was built with.

        :param space_fingerprint: the model's document-space fingerprint.
        :param dim: the width of the model's document vectors.
        """
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

        :param dim: the vectors' width.
        :param space_fingerprint: the model's document space (a store refuses searches from another one).
        :param model_name: the document tower's name, for messages.
        :param index: the config of the store's kind (:class:`~care_retriever.stores.config.FaissIndexConfig`,
            :class:`~care_retriever.stores.config.QdrantCollectionConfig`); None: an existing store's own settings or
            a new one's defaults; a dict or the other kind's config is one line.
        :param metric: what the model's scores are: ``cosine`` for unit vectors, ``dot`` for document vectors
            normalised before a Matryoshka cut (the authors' released models); recorded in the manifest.
        :raises StoreError: the store exists and holds another width, space or metric.
        """

    @abstractmethod
    def upsert(
        self, documents: Sequence[Document], vectors: np.ndarray, *, sparse_tokens: Sequence[list[str]] | None = None
    ) -> None:
        """Insert documents, replacing any stored under the same id.

        :param documents: the documents.
        :param vectors: their vectors, one float32 row each, in order.
        :param sparse_tokens: the BM25 tokens of each document's ``embedding_text()``, when the caller has them
            already; None: the store tokenises, if it has a sparse side.
        """

    @abstractmethod
    def delete(self, ids: Sequence[str]) -> int:
        """Remove documents by id; return how many existed.

        :param ids: the document ids.
        """

    @abstractmethod
    def search(
        self, vectors: np.ndarray, top_k: int, filters: Filters | None = None, *, payload: bool = True
    ) -> list[list[Hit]]:
        """Top-``k`` hits for each query vector (rows of ``vectors``), best first.

        :param vectors: query vectors, one row each.
        :param top_k: hits per query.
        :param filters: metadata filters (:mod:`care_retriever.stores.filters`); None: every document.
        :param payload: False: ids and scores only (empty text), for callers that read the documents later.
        """

    @abstractmethod
    def get(self, ids: Sequence[str]) -> list[Document | None]:
        """Stored documents by id (None where missing).

        :param ids: the document ids.
        """

    @abstractmethod
    def count(self, filters: Filters | None = None) -> int:
        """Number of live documents.

        :param filters: count only those matching (None: all).
        """

    @abstractmethod
    def content_hashes(self, ids: Sequence[str]) -> dict[str, str]:
        """Stored content hash for each of ``ids`` that exists (a write skips the documents it holds unchanged).

        :param ids: the document ids.
        """

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
        """:meth:`search` without blocking the event loop.

        :param vectors: query vectors, one row each.
        :param top_k: hits per query.
        :param filters: metadata filters; None: every document.
        :param payload: False: ids and scores only.
        """
        return await asyncio.to_thread(self.search, vectors, top_k, filters, payload=payload)

    async def get_async(self, ids: Sequence[str]) -> list[Document | None]:
        """:meth:`get` without blocking the event loop.

        :param ids: the document ids.
        """
        return await asyncio.to_thread(self.get, ids)

    async def count_async(self, filters: Filters | None = None) -> int:
        """:meth:`count` without blocking the event loop.

        :param filters: count only those matching (None: all).
        """
        return await asyncio.to_thread(self.count, filters)

    async def aclose(self) -> None:
        """:meth:`close`, and any async client the store opened."""
        await asyncio.to_thread(self.close)
