"""Qdrant store: embedded local mode (``:memory:`` or a folder) by default, a server URL in production.

Each point's id is a UUIDv5 of the document id, so writing a document again upserts it. The payload
carries ``doc_id``, ``text``, ``title``, ``metadata`` and ``content_hash``; the manifest lives in the
collection's metadata. The API key of a server comes from ``QDRANT_API_KEY`` and is never logged:
messages name the server by its URL with any ``user:password@`` part removed.

Local mode is a single-process, pure-Python engine (one file lock per folder); calls into it are
serialised by a lock so that searches from many threads are safe. A server client is thread-safe.

Async reads (``search_async``, ``get_async``, ``count_async``) of a server store await an ``AsyncQdrantClient``
(opened on first use, with the sync client's URL and key); in local mode they run the sync calls in a worker
thread (the folder's one client is the sync one), unless an ``AsyncQdrantClient`` is given as ``async_client``.

Compressed vectors (:func:`collection_options`): ``quantize`` sq8 / binary codes searched in RAM, the
originals (``on_disk`` or not) rescoring ``oversample`` x ``top_k`` candidates on a server. Local mode
keeps those settings in the collection config but searches the full vectors exactly, and has one shard:
creating a collection there says so in one line. See docs/scale.md.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from care_retriever import faults
from care_retriever.documents import Document
from care_retriever.errors import InputError, StoreError, WriteError
from care_retriever.stores.base import (
    Filters,
    Hit,
    LocalFootprint,
    Manifest,
    VectorStore,
    check_metric,
    default_versions,
    validate_filters,
)
from care_retriever.stores.config import QdrantCollectionConfig, QdrantQuantize, StoreConfig, as_qdrant_config
from care_retriever.vectors import VectorContract

logger = logging.getLogger("care_retriever")

ID_NAMESPACE = uuid.UUID("6f1c2b1e-7d3a-5c43-9a53-2f5b0c6e8a11")
DEFAULT_COLLECTION = "care"
MANIFEST_KEY = "care_manifest"


def point_id(doc_id: str) -> str:
    return str(uuid.uuid5(ID_NAMESPACE, doc_id))


def is_server(location: str) -> bool:
    return location.startswith(("http://", "https://"))


def redact(location: str) -> str:
    """``https://user:key@host:6333`` -> ``https://host:6333``: credentials never reach a message or log."""
    if not is_server(location):
        return location
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(location)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


def _first_line(exc: BaseException) -> str:
    """The first line of an error, with the API key masked should a library ever echo it."""
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    key = os.environ.get("QDRANT_API_KEY")
    return line.replace(key, "***") if key else line


def _async_client(location: str, api_key: str | None = None):
    """An ``AsyncQdrantClient`` for a server URL (local mode has one client per folder: the sync one)."""
    from qdrant_client import AsyncQdrantClient

    return AsyncQdrantClient(url=location, api_key=api_key or os.environ.get("QDRANT_API_KEY") or None, timeout=60)


def local_store_exists(location: str) -> bool:
    """False only for a local folder where no Qdrant store was written (no ``meta.json``): opening it would create
    the folder, its lock and ``meta.json``, so reads check this first. A server or ``:memory:`` is never ruled out."""
    if location == ":memory:" or is_server(location):
        return True
    from pathlib import Path

    folder = Path(location)
    if folder.exists() and not folder.is_dir():
        return True  # a file: opening it says so in one line, touching nothing
    return (folder / "meta.json").is_file()


def _client(location: str, api_key: str | None = None):
    try:
        from qdrant_client import QdrantClient
    except ImportError as exc:
        raise StoreError("Qdrant stores need qdrant-client: pip install 'care-retriever[qdrant]'") from exc
    if location == ":memory:":
        return QdrantClient(location=":memory:")
    if is_server(location):
        return QdrantClient(url=location, api_key=api_key or os.environ.get("QDRANT_API_KEY") or None, timeout=60)
    from pathlib import Path

    faults.require_folder(Path(location), f"the local Qdrant store qdrant:{location}")  # a file there stays untouched
    try:
        return QdrantClient(path=location)
    except RuntimeError as exc:  # the local mode holds a file lock
        raise StoreError(f"qdrant:{location}: {_first_line(exc)}") from exc
    except Exception as exc:  # a damaged meta.json or storage.sqlite fails in json, sqlite3, pickle or pydantic
        reason = faults.reason_of(exc)  # opening writes too (its lock file, its tables): a full disk is not damage
        if reason is not None:
            raise faults.write_error(f"qdrant:{location}", "the local Qdrant storage", exc, reason) from exc
        raise StoreError(
            f"qdrant:{location}: corrupted local Qdrant storage ({type(exc).__name__}: {_first_line(exc)})"
        ) from exc


# Settings that exist only on a server: local mode drops them (one shard, no replicas).
SERVER_ONLY = ("shards", "replicas")
# Settings local mode keeps in the collection config but does not act on (it searches the full vectors exactly).
LOCAL_UNUSED = ("quantize", "always_ram", "oversample", "on_disk", "on_disk_payload", "m", "ef_construct")
# a collection's settings as a Qdrant store is handed them: its config or None (a user's dict is read at the door)
QdrantOptions = StoreConfig


def collection_options(dim: int, options: QdrantCollectionConfig, *, metric: str = "cosine") -> dict[str, Any]:
    """``create_collection`` arguments for a collection sized for millions of documents.

    ``m`` / ``ef_construct``: the HNSW graph; ``on_disk``: the original vectors memory-mapped from disk;
    ``quantize``: ``sq8`` (int8 scalar codes, 4x smaller) or ``binary`` (one bit a dimension, 32x smaller),
    kept in RAM with ``always_ram`` (default) and rescored from the originals at search time, ``oversample``
    times ``top_k`` candidates; ``shards`` / ``replicas``: distribution over a cluster. See docs/scale.md.
    """
    from qdrant_client import models

    resolved = options.resolved().given()
    hnsw = {k: resolved[k] for k in ("m", "ef_construct") if k in resolved}
    quantization: Any = None
    if resolved["quantize"] == "sq8":
        quantization = models.ScalarQuantization(
            scalar=models.ScalarQuantizationConfig(type=models.ScalarType.INT8, always_ram=resolved["always_ram"])
        )
    elif resolved["quantize"] == "binary":
        quantization = models.BinaryQuantization(
            binary=models.BinaryQuantizationConfig(always_ram=resolved["always_ram"])
        )
    kwargs: dict[str, Any] = {
        # The quantization sits on the (unnamed) dense vector rather than the collection: the same on a
        # server, and local mode keeps a vector's config, so the collection's info reports it either way.
        "vectors_config": models.VectorParams(
            size=dim,
            # cosine would renormalise the stored vectors: a model that scores by dot product gets DOT
            distance=models.Distance.DOT if metric == "dot" else models.Distance.COSINE,
            on_disk=resolved.get("on_disk"),
            hnsw_config=models.HnswConfigDiff(**hnsw) if hnsw else None,
            quantization_config=quantization,
        ),
    }
    for key, arg in (
        ("on_disk_payload", "on_disk_payload"),
        ("shards", "shard_number"),
        ("replicas", "replication_factor"),
    ):
        if key in resolved:
            kwargs[arg] = resolved[key]
    return kwargs


def collection_settings(info: Any) -> dict[str, Any]:
    """The settings a collection holds, read from Qdrant's own collection info (not from the manifest)."""
    from qdrant_client import models

    params = info.config.params
    vector = params.vectors[""] if isinstance(params.vectors, dict) else params.vectors
    quantization = getattr(vector, "quantization_config", None) or info.config.quantization_config
    if isinstance(quantization, models.ScalarQuantization):
        quantize, always_ram = "sq8", quantization.scalar.always_ram
    elif isinstance(quantization, models.BinaryQuantization):
        quantize, always_ram = "binary", quantization.binary.always_ram
    elif quantization is None:
        quantize, always_ram = "none", None
    else:
        quantize, always_ram = type(quantization).__name__, None
    return {
        "quantize": quantize,
        "always_ram": always_ram,
        "on_disk": getattr(vector, "on_disk", None),
        "shards": params.shard_number,
        "replicas": params.replication_factor,
    }


def dense_vector(vector: Any) -> np.ndarray:
    """A point's dense vector: the whole vector, or its unnamed one beside the named BM25 side."""
    return np.asarray(vector[""] if isinstance(vector, dict) else vector, dtype=np.float32)


class QdrantStore(VectorStore):
    backend = "qdrant"

    def __init__(
        self, location: str, collection: str = DEFAULT_COLLECTION, client: Any = None, *, api_key: str | None = None
    ) -> None:
        """``client``: a ``QdrantClient`` the caller already holds (it stays the caller's: close() leaves it open);
        ``api_key``: a server key other than ``QDRANT_API_KEY``'s."""
        self.location = location
        self.collection = collection
        self._owns_client = client is None
        self._api_key = api_key  # for the async client of a server store, opened on first async read
        self.client = client if client is not None else _client(location, api_key)
        self.manifest: Manifest | None = None
        # Local mode is not thread-safe; a server client is, and needs no lock.
        self._lock: threading.Lock | contextlib.nullcontext = (
            contextlib.nullcontext() if is_server(location) else threading.Lock()
        )
        try:
            exists = self.client.collection_exists(collection)
            info = self.client.get_collection(collection) if exists else None
        except Exception as exc:  # connection refused, TLS, auth: the client raises many types
            raise StoreError(
                f"{self.describe()}: cannot reach Qdrant ({type(exc).__name__}: {_first_line(exc)})"
            ) from exc
        if info is not None:
            raw = (info.config.metadata or {}).get(MANIFEST_KEY)
            if raw is None:
                raise StoreError(f"{self.describe()}: collection exists but was not written by care-retriever")
            self.manifest = Manifest.from_dict(raw, self.describe())

    def describe(self) -> str:
        return f"qdrant:{redact(self.location)} (collection {self.collection})"

    def trains_on_first_vectors(self, index: QdrantOptions = None) -> bool:
        as_qdrant_config(index)  # its config or None, as prepare takes it
        return False  # Qdrant builds and quantizes its segments itself: the order points arrive in trains nothing

    def local_footprint(self, index: QdrantOptions = None) -> LocalFootprint | None:
        """Local mode's folder (it persists point by point: no staging copy); None in memory or on a server."""
        as_qdrant_config(index)
        if self.location == ":memory:" or is_server(self.location):
            return None
        return LocalFootprint(Path(self.location))

    def prepare(
        self,
        dim: int,
        space_fingerprint: str,
        model_name: str,
        index: QdrantOptions = None,
        *,
        metric: str = "cosine",
    ) -> None:
        """Create the collection (with ``index`` options, see :func:`collection_options`) or check the existing one.

        Several indexing jobs may start at once against one server (shards of a corpus on many nodes):
        if another job created the collection first, this one checks compatibility and joins it.
        """
        given = as_qdrant_config(index)  # its config or None, else one line: nothing created
        local = not is_server(self.location)
        requested = given.local_mode() if local else given
        if self.manifest is not None:
            self.check_compatible(space_fingerprint, dim)
            self._check_settings(requested)
            return
        import qdrant_client

        options = requested.resolved()
        kwargs = collection_options(dim, options, metric=check_metric(metric))
        if local:
            self._warn_local_mode(given)
        from care_retriever.sparse.qdrant_sparse import vectors_config

        kwargs["sparse_vectors_config"] = vectors_config()  # declared always: filled by enable_sparse()
        manifest = Manifest(
            backend="qdrant",
            dim=dim,
            space_fingerprint=space_fingerprint,
            model_name=model_name,
            metric=metric,
            index=options.to_manifest(),
            versions=default_versions(qdrant_client=getattr(qdrant_client, "__version__", "unknown")),
        )
        try:
            with self._lock:
                self.client.create_collection(self.collection, metadata={MANIFEST_KEY: manifest.to_dict()}, **kwargs)
        except Exception as exc:  # lost a creation race (409 on a server, ValueError locally), or a real error
            with self._lock:
                exists = self.client.collection_exists(self.collection)
            if not exists:
                raise StoreError(f"{self.describe()}: cannot create the collection ({_first_line(exc)})") from exc
            joined = QdrantStore(self.location, self.collection, client=self.client)
            joined.check_compatible(space_fingerprint, dim)
            joined._check_settings(requested)
            self.manifest = joined.manifest
            return
        self.manifest = manifest
        if is_server(self.location):  # local mode has no payload indexes
            from qdrant_client import models

            self.client.create_payload_index(self.collection, "doc_id", models.PayloadSchemaType.KEYWORD)

    def _warn_local_mode(self, config: QdrantCollectionConfig) -> None:
        """Creating a local collection: say in one line which settings it drops or records without acting on."""
        requested = config.given()
        dropped = [k for k in SERVER_ONLY if k in requested]
        unused = [k for k in LOCAL_UNUSED if k in requested]
        if dropped or unused:
            logger.warning(
                "%s: Qdrant local mode %s%s%s; a Qdrant server applies them (docs/scale.md)",
                self.describe(),
                f"has one shard and no replicas (ignoring {', '.join(dropped)})" if dropped else "",
                "; it " if dropped and unused else "",
                f"records {', '.join(unused)} but searches the full vectors exactly in RAM" if unused else "",
            )

    def _check_settings(self, config: QdrantCollectionConfig) -> None:
        """Refuse settings that differ from the existing collection's: they are fixed when it is created.

        ``oversample`` is a search-time setting: a new value replaces the recorded one (saved by ``commit``).
        """
        manifest = self.require_manifest()
        resolved = QdrantCollectionConfig.from_manifest(manifest.index).resolved()
        recorded, requested = resolved.given(), config.given()
        differ = [
            f"{k} {recorded.get(k)!r} (asked {v!r})"
            for k, v in requested.items()
            if k != "oversample" and recorded.get(k) != v
        ]
        if differ:
            raise StoreError(
                f"{self.describe()}: the collection was created with {', '.join(differ)}; these are fixed at "
                "creation: index into a new collection (--collection NAME) to change them"
            )
        config.require_quantized(resolved.quantize)
        if config.oversample is not None:
            manifest.index = {**manifest.index, "oversample": config.oversample}

    def collection_settings(self) -> dict[str, Any]:
        """Quantization, on-disk vectors, shards and replicas as Qdrant reports them for this collection."""
        self.require_manifest()
        with self._lock:
            info = self.client.get_collection(self.collection)
        return collection_settings(info)

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

    def verify(self) -> int:
        """Check the collection's own settings against the manifest, then every point's payload and dense vector."""
        manifest = self.require_manifest()
        actual = self.collection_settings()
        recorded = QdrantCollectionConfig.from_manifest(manifest.index).resolved().given()
        for key in ("quantize", "always_ram", "on_disk", "shards", "replicas"):
            if key in recorded and actual[key] != recorded[key]:
                raise StoreError(
                    f"{self.describe()}: the collection holds {key}={actual[key]!r}; its manifest says "
                    f"{recorded[key]!r}"
                )
        contract = VectorContract.for_metric(manifest.metric)  # the norms the store's model promises
        count, offset = 0, None
        while True:
            with self._lock:
                points, offset = self.client.scroll(
                    self.collection,
                    limit=256,
                    offset=offset,
                    with_payload=["doc_id", "content_hash"],
                    with_vectors=True,
                )
            for p in points:
                payload = p.payload or {}
                if not payload.get("doc_id") or not payload.get("content_hash"):
                    raise StoreError(f"{self.describe()}: point {p.id} has no doc_id or content_hash")
                if p.id != point_id(payload["doc_id"]):
                    raise StoreError(f"{self.describe()}: point {p.id} does not carry the id of {payload['doc_id']!r}")
                vector = dense_vector(p.vector) if p.vector is not None else np.empty(0, np.float32)
                if vector.shape != (manifest.dim,) or not np.isfinite(vector).all():
                    raise StoreError(
                        f"{self.describe()}: {payload['doc_id']!r} has no finite {manifest.dim}-dim dense vector"
                    )
                if contract.bad_norms(np.asarray([np.linalg.norm(vector)])).any():
                    raise StoreError(
                        f"{self.describe()}: {payload['doc_id']!r} has a vector not {contract.describe_norms()} as "
                        f"its {manifest.metric} model's are"
                    )
            count += len(points)
            if offset is None:
                break
        return count

    def content_hashes(self, ids: Sequence[str]) -> dict[str, str]:
        if self.manifest is None or not ids:
            return {}
        out: dict[str, str] = {}
        for start in range(0, len(ids), 256):
            with self._lock:
                points = self.client.retrieve(
                    self.collection,
                    [point_id(i) for i in ids[start : start + 256]],
                    with_payload=["doc_id", "content_hash"],
                    with_vectors=False,
                )
            out.update({p.payload["doc_id"]: p.payload["content_hash"] for p in points})
        return out

    def upsert(
        self, documents: Sequence[Document], vectors: np.ndarray, *, sparse_tokens: Sequence[list[str]] | None = None
    ) -> None:
        from qdrant_client import models

        manifest = self.require_manifest()
        if len(documents) != len(vectors):
            raise InputError(f"{len(documents)} documents but {len(vectors)} vectors")
        vectors = np.asarray(vectors, dtype=np.float32)
        if len(documents) and (vectors.ndim != 2 or vectors.shape[1] != manifest.dim):
            raise InputError(
                f"{self.describe()}: vectors have shape {vectors.shape}; the store holds {manifest.dim}-dim"
            )
        sparse = self._sparse_vectors(documents, sparse_tokens)
        points = [
            models.PointStruct(
                id=point_id(d.id),
                vector=v.tolist() if sparse is None else {"": v.tolist(), **sparse[i]},
                payload={
                    "doc_id": d.id,
                    "text": d.text,
                    "title": d.title,
                    "metadata": d.metadata,
                    "content_hash": d.content_hash(),
                },
            )
            for i, (d, v) in enumerate(zip(documents, vectors, strict=True))
        ]
        for start in range(0, len(points), 256):
            with self._lock, self._write_faults("the points"):
                self.client.upsert(self.collection, points[start : start + 256], wait=True)

    def delete(self, ids: Sequence[str]) -> int:
        from qdrant_client import models

        existing = list(self.content_hashes(list(ids)))
        if existing:
            with self._lock, self._write_faults("the deletion"):
                self.client.delete(
                    self.collection, models.PointIdsList(points=[point_id(i) for i in existing]), wait=True
                )
        return len(existing)

    def commit(self) -> None:
        manifest = self.require_manifest()
        manifest.count = self.count()
        manifest.updated_at = time.time()
        with self._lock, self._write_faults("the manifest"):
            self.client.update_collection(self.collection, metadata={MANIFEST_KEY: manifest.to_dict()})

    def finalize(self) -> None:
        self.commit()

    def count(self, filters: Filters | None = None) -> int:
        if self.manifest is None:
            return 0
        flt = self._filter(filters)
        with self._lock:
            return self.client.count(self.collection, count_filter=flt, exact=True).count

    def iter_documents(self, batch: int = 256) -> Iterator[Document]:
        if self.manifest is None:
            return
        offset = None
        while True:
            with self._lock:
                points, offset = self.client.scroll(
                    self.collection, limit=batch, offset=offset, with_payload=True, with_vectors=False
                )
            for p in points:
                yield self._document(p.payload)
            if offset is None:
                return

    def vectors(self, ids: Sequence[str]) -> list[np.ndarray | None]:
        if self.manifest is None:
            return [None] * len(ids)
        ids = list(ids)
        found: dict[str, np.ndarray] = {}
        for start in range(0, len(ids), 256):
            with self._lock:
                points = self.client.retrieve(
                    self.collection,
                    [point_id(i) for i in ids[start : start + 256]],
                    with_payload=["doc_id"],
                    with_vectors=True,
                )
            found.update({p.payload["doc_id"]: dense_vector(p.vector) for p in points})
        return [found.get(i) for i in ids]

    @staticmethod
    def _document(payload: dict[str, Any]) -> Document:
        return Document(
            id=payload["doc_id"],
            text=payload["text"],
            title=payload.get("title", ""),
            metadata=payload.get("metadata") or {},
        )

    def _filter(self, filters: Filters | None):
        from qdrant_client import models

        filters = validate_filters(filters)
        if not filters:
            return None

        def condition(key: str, value: Any) -> Any:
            if isinstance(value, float):  # Qdrant matches only str/int/bool exactly; a float is a point range
                return models.FieldCondition(key=key, range=models.Range(gte=value, lte=value))
            return models.FieldCondition(key=key, match=models.MatchValue(value=value))

        must: list[Any] = []
        for name, value in filters.items():
            key, values = f"metadata.{name}", value if isinstance(value, list) else [value]
            if len(values) == 1:
                must.append(condition(key, values[0]))
            elif all(isinstance(v, str) for v in values) or all(type(v) is int for v in values):
                must.append(models.FieldCondition(key=key, match=models.MatchAny(any=values)))
            else:  # mixed types, floats or bools: any of the single conditions
                must.append(models.Filter(should=[condition(key, v) for v in values]))
        return models.Filter(must=must)

    def search(
        self, vectors: np.ndarray, top_k: int, filters: Filters | None = None, *, payload: bool = True
    ) -> list[list[Hit]]:
        from qdrant_client import models

        manifest = self.require_manifest()
        if top_k < 1:
            raise InputError(f"top_k must be >= 1, got {top_k}")
        vectors = np.atleast_2d(np.asarray(vectors, dtype=np.float32))
        if vectors.shape[1] != manifest.dim:
            raise InputError(f"query vectors have {vectors.shape[1]} dims; the store holds {manifest.dim}")
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

    # ------------------------------------------------------------------ the sparse (BM25) side
    def _sparse_vectors(
        self, documents: Sequence[Document], tokens: Sequence[list[str]] | None = None
    ) -> list[dict[str, Any]] | None:
        from care_retriever.sparse.qdrant_sparse import VECTOR, document_vector
        from care_retriever.sparse.tokenizer import tokenize

        entry = self.require_manifest().sparse
        if not entry or not documents:
            return None
        if tokens is None:
            tokens = tokenize([d.embedding_text() for d in documents])
        elif len(tokens) != len(documents):
            raise InputError(f"{len(documents)} documents but {len(tokens)} token lists")
        if not entry.get("avgdl"):  # fixed by the first documents written, then kept (see qdrant_sparse)
            entry["avgdl"] = max(sum(map(len, tokens)) / len(tokens), 1.0)
        return [{VECTOR: document_vector(t, entry["avgdl"], entry["k1"], entry["b"])} for t in tokens]

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

    def _hits(self, points: Sequence[Any]) -> list[Hit]:
        """Points as hits; a point read with its ``doc_id`` alone gives an id-and-score hit."""
        return [
            Hit(
                id=p.payload["doc_id"],
                score=float(p.score),
                text=p.payload.get("text", ""),
                title=p.payload.get("title", ""),
                metadata=p.payload.get("metadata") or {},
            )
            for p in points
        ]

    def search_sparse(
        self, queries: Sequence[str], top_k: int, filters: Filters | None = None, *, payload: bool = True
    ) -> list[list[Hit]]:
        """BM25 top-``k`` for each query text, scored by Qdrant (IDF modifier)."""
        return self.search_hybrid(None, queries, top_k, filters, fusion=None, payload=payload)

    hybrid_fusions = ("rrf", "dbsf")  # fused server-side by the Query API; wsum fuses in care_retriever.search.hybrid

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

    def get(self, ids: Sequence[str]) -> list[Document | None]:
        if self.manifest is None:
            return [None] * len(ids)
        found: dict[str, Document] = {}
        for start in range(0, len(ids), 256):
            with self._lock:
                points = self.client.retrieve(
                    self.collection,
                    [point_id(i) for i in ids[start : start + 256]],
                    with_payload=True,
                    with_vectors=False,
                )
            for p in points:
                found[p.payload["doc_id"]] = self._document(p.payload)
        return [found.get(i) for i in ids]

    @contextlib.contextmanager
    def _write_faults(self, what: str) -> Iterator[None]:
        """A file-system fault in local mode's persistence (disk full, I/O error) ends the write in one line.

        Local mode applies a write in memory, then persists it point by point (one SQLite commit each): after a
        fault its memory holds points its disk lacks. The client is reopened from disk, so that what this object
        counts and searches is what ``verify`` and the next process read; every point on disk is whole.
        """
        try:
            yield
        except WriteError:
            raise
        except Exception as exc:
            reason = faults.reason_of(exc)
            if reason is None or is_server(self.location) or self.location == ":memory:":
                raise
            if self._owns_client:
                with contextlib.suppress(Exception):
                    self.client.close()
                self.client = _client(self.location)
            raise faults.write_error(
                f"qdrant:{self.location}",
                f"{what} into collection {self.collection}",
                exc,
                reason,
                "the points written before the failure are kept whole and the rest are not stored; "
                "run the same command again once there is space",
            ) from exc

    def close(self) -> None:
        if self._owns_client and self.location != ":memory:":
            self.client.close()

    # ------------------------------------------------------------------ async reads
    # An AsyncQdrantClient serving this store's async reads: opened for a server on first use; in local mode
    # None (the sync client runs in a thread) unless one is assigned (e.g. on a folder no sync client holds).
    async_client: Any = None

    def _async(self) -> Any:
        if self.async_client is None and is_server(self.location):
            self.async_client = _async_client(self.location, self._api_key)
        return self.async_client

    def _search_requests(self, vectors: np.ndarray, top_k: int, filters: Filters | None, payload: bool) -> list[Any]:
        """The Query API requests :meth:`search` sends, one per row of ``vectors``."""
        from qdrant_client import models

        manifest = self.require_manifest()
        if top_k < 1:
            raise InputError(f"top_k must be >= 1, got {top_k}")
        vectors = np.atleast_2d(np.asarray(vectors, dtype=np.float32))
        if vectors.shape[1] != manifest.dim:
            raise InputError(f"query vectors have {vectors.shape[1]} dims; the store holds {manifest.dim}")
        flt = self._filter(filters)
        fields = True if payload else ["doc_id"]
        params = self.search_params()
        return [
            models.QueryRequest(query=v.tolist(), limit=top_k, filter=flt, with_payload=fields, params=params)
            for v in vectors
        ]

    async def search_async(
        self, vectors: np.ndarray, top_k: int, filters: Filters | None = None, *, payload: bool = True
    ) -> list[list[Hit]]:
        """:meth:`search` awaiting the async client (a server), else in a worker thread."""
        client = self._async()
        if client is None:
            return await super().search_async(vectors, top_k, filters, payload=payload)
        requests = self._search_requests(vectors, top_k, filters, payload)
        if not requests:
            return []
        responses = await client.query_batch_points(self.collection, requests)
        return [self._hits(response.points) for response in responses]

    async def get_async(self, ids: Sequence[str]) -> list[Document | None]:
        """:meth:`get` awaiting the async client (a server), else in a worker thread."""
        client = self._async()
        if client is None or self.manifest is None:
            return await super().get_async(ids)
        found: dict[str, Document] = {}
        for start in range(0, len(ids), 256):
            points = await client.retrieve(
                self.collection, [point_id(i) for i in ids[start : start + 256]], with_payload=True, with_vectors=False
            )
            found.update({p.payload["doc_id"]: self._document(p.payload) for p in points})
        return [found.get(i) for i in ids]

    async def count_async(self, filters: Filters | None = None) -> int:
        """:meth:`count` awaiting the async client (a server), else in a worker thread."""
        client = self._async()
        if client is None or self.manifest is None:
            return await super().count_async(filters)
        return (await client.count(self.collection, count_filter=self._filter(filters), exact=True)).count

    async def aclose(self) -> None:
        """Close the async client, then the sync one (:meth:`close`)."""
        if self.async_client is not None:
            client, self.async_client = self.async_client, None
            await client.close()
        await super().aclose()
