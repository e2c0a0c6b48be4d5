"""What both Qdrant stores share: point ids, payloads, locations, filters, and the class users name.

``QdrantStore(location, collection)`` gives the store for the location: a Qdrant Edge shard for a folder or
``:memory:`` (:class:`~care_retriever.stores.qdrant.edge_store.EdgeStore`), qdrant-client for a server URL or a
client handed in (:class:`~care_retriever.stores.qdrant.server.ServerStore`). Each point's id is a UUIDv5 of the
document id, so writing a document again upserts it; the payload carries ``doc_id``, ``text``, ``title``,
``metadata`` and ``content_hash``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from care_retriever.documents import Document
from care_retriever.errors import InputError, StoreError
from care_retriever.stores.base import Hit
from care_retriever.stores.capabilities import IndexBuilding, SparseSearch, StoredIteration, Verification, WriteRuns
from care_retriever.stores.config import QdrantCollectionConfig, StoreConfig, as_qdrant_config
from care_retriever.stores.filters import FilterNode, Filters, parse_filters

ID_NAMESPACE = uuid.UUID("6f1c2b1e-7d3a-5c43-9a53-2f5b0c6e8a11")
DEFAULT_COLLECTION = "care"
MANIFEST_KEY = "care_manifest"
# a collection's settings as a Qdrant store is handed them: its config or None (a user's dict is read at the door)
QdrantOptions = StoreConfig


def point_id(doc_id: str) -> str:
    return str(uuid.uuid5(ID_NAMESPACE, doc_id))


def is_server(location: str) -> bool:
    return location.startswith(("http://", "https://"))


def collection_folder(name: str) -> str:
    """``name``, the folder a Qdrant Edge collection is inside ``qdrant:PATH``, or one line: a path separator, ``.``
    or ``..`` would put the collection beside the store (``../x`` wrote one outside it) or over it."""
    if not name or name in (".", "..") or any(c in name for c in "/\\\0"):
        raise InputError(
            f"invalid collection name {name!r}: a folder name inside the store (no '/', '\\', '.' or '..')"
        )
    return name


def redact(location: str) -> str:
    """``https://user:key@host:6333`` -> ``https://host:6333``: credentials never reach a message or log."""
    if not is_server(location):
        return location
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(location)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


def first_line(exc: BaseException) -> str:
    """The first line of an error, with the API key masked should a library ever echo it."""
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    key = os.environ.get("QDRANT_API_KEY")
    return line.replace(key, "***") if key else line


def dense_vector(vector: Any) -> np.ndarray:
    """A point's dense vector: the whole vector, or its unnamed one beside the named BM25 side."""
    return np.asarray(vector[""] if isinstance(vector, dict) else vector, dtype=np.float32)


def payload_of(document: Document) -> dict[str, Any]:
    return {
        "doc_id": document.id,
        "text": document.text,
        "title": document.title,
        "metadata": document.metadata,
        "content_hash": document.content_hash(),
    }


def document_of(payload: dict[str, Any]) -> Document:
    return Document(
        id=payload["doc_id"],
        text=payload["text"],
        title=payload.get("title", ""),
        metadata=payload.get("metadata") or {},
    )


def hit_of(payload: dict[str, Any], score: float) -> Hit:
    """A point as a hit; a point read with its ``doc_id`` alone gives an id-and-score hit."""
    return Hit(
        id=payload["doc_id"],
        score=float(score),
        text=payload.get("text", ""),
        title=payload.get("title", ""),
        metadata=payload.get("metadata") or {},
    )


def filter_conditions(filters: Filters | None) -> FilterNode | None:
    """Metadata filters as the typed tree both Qdrant engines build their Filter from (:mod:`.filter_tree`)."""
    return parse_filters(filters)


def query_rows(vectors: np.ndarray, top_k: int, dim: int) -> np.ndarray:
    """``vectors`` as float32 query rows of the store's width ``dim``, and ``top_k`` at least 1, else one line (what
    a dense search takes, on Edge and on a server, sync and async alike)."""
    from care_retriever.errors import InputError

    if top_k < 1:
        raise InputError(f"top_k must be >= 1, got {top_k}")
    vectors = np.atleast_2d(np.asarray(vectors, dtype=np.float32))
    if vectors.shape[1] != dim:
        raise InputError(f"query vectors have {vectors.shape[1]} dims; the store holds {dim}")
    return vectors


class QdrantStore(SparseSearch, WriteRuns, Verification, StoredIteration, IndexBuilding):
    """A Qdrant collection: ``QdrantStore(location, collection)`` opens the store kind the location names.

    Edge and server stores alike have every capability (:mod:`care_retriever.stores.capabilities`); each write is
    published as it is made, so a run leaves nothing pending.
    """

    backend = "qdrant"
    location: str
    collection: str
    _kinds: ClassVar[list[type[QdrantStore]]] = []

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        QdrantStore._kinds.append(cls)

    @classmethod
    def serves(cls, location: str, client: Any) -> bool:
        """Whether this kind of store opens ``location`` (with ``client``, one the caller holds)."""
        return False

    def __new__(cls, location: str, *args: Any, **kwargs: Any) -> QdrantStore:
        if cls is QdrantStore:
            client = kwargs.get("client", args[1] if len(args) > 1 else None)
            kind = next((k for k in QdrantStore._kinds if k.serves(location, client)), None)
            if kind is None:
                raise StoreError(f"qdrant:{redact(location)}: no Qdrant store serves this location")
            return super().__new__(kind)
        return super().__new__(cls)

    def describe(self) -> str:
        return f"qdrant:{redact(self.location)} (collection {self.collection})"

    def trains_on_first_vectors(self, index: QdrantOptions = None) -> bool:
        as_qdrant_config(index)  # its config or None, as prepare takes it
        return False  # Qdrant builds and quantizes its segments itself: the order points arrive in trains nothing

    def check_settings(self, config: QdrantCollectionConfig) -> None:
        """Refuse settings that differ from the existing collection's: they are fixed when it is created.

        ``oversample`` and ``ef_search`` are search-time settings: a new value replaces the recorded one (saved by
        ``commit``).
        """
        manifest = self.require_manifest()
        resolved = QdrantCollectionConfig.from_manifest(manifest.index).resolved()
        recorded, requested = resolved.given(), config.given()
        search_time = ("oversample", "ef_search")
        differ = [
            f"{k} {recorded.get(k)!r} (asked {v!r})"
            for k, v in requested.items()
            if k not in search_time and recorded.get(k) != v
        ]
        if differ:
            raise StoreError(
                f"{self.describe()}: the collection was created with {', '.join(differ)}; these are fixed at "
                "creation: index into a new collection (--collection NAME) to change them"
            )
        config.require_quantized(resolved.quantize)
        for key in search_time:
            if getattr(config, key) is not None:
                manifest.index = {**manifest.index, key: getattr(config, key)}

    def checked_vectors(self, documents: Sequence[Document], vectors: np.ndarray) -> np.ndarray:
        """``vectors`` as float32, one row of the store's width per document, else one line (what an upsert
        takes, on Edge and on a server alike)."""
        from care_retriever.errors import InputError

        dim = self.require_manifest().dim
        if len(documents) != len(vectors):
            raise InputError(f"{len(documents)} documents but {len(vectors)} vectors")
        vectors = np.asarray(vectors, dtype=np.float32)
        if len(documents) and (vectors.ndim != 2 or vectors.shape[1] != dim):
            raise InputError(f"{self.describe()}: vectors have shape {vectors.shape}; the store holds {dim}-dim")
        return vectors

    def sparse_terms(
        self, documents: Sequence[Document], tokens: Sequence[list[str]] | None = None
    ) -> list[tuple[list[int], list[float]]] | None:
        """Each document's BM25 terms when the store has its sparse side (None otherwise); ``avgdl`` is fixed by
        the first documents written, then kept (see care_retriever.sparse.qdrant_sparse)."""
        from care_retriever.errors import InputError
        from care_retriever.sparse.qdrant_sparse import document_terms
        from care_retriever.sparse.tokenizer import tokenize

        entry = self.require_manifest().sparse
        if not entry or not documents:
            return None
        if tokens is None:
            tokens = tokenize([d.embedding_text() for d in documents])
        elif len(tokens) != len(documents):
            raise InputError(f"{len(documents)} documents but {len(tokens)} token lists")
        if not entry.get("avgdl"):
            entry["avgdl"] = max(sum(map(len, tokens)) / len(tokens), 1.0)
        return [document_terms(t, entry["avgdl"], entry["k1"], entry["b"]) for t in tokens]


def open_qdrant(
    location: str, collection: str = DEFAULT_COLLECTION, client: Any = None, *, api_key: str | None = None
) -> QdrantStore:
    """The Qdrant store for ``location``: :class:`QdrantStore` picks the concrete kind (Edge or server)."""
    return QdrantStore(location, collection, client, api_key=api_key)  # type: ignore[abstract]  # __new__ picks
