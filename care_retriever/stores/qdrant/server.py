"""``qdrant:http(s)://...``: a collection on a Qdrant server (or cluster) through qdrant-client.

The manifest lives in the collection's metadata. A store may also be handed a ``QdrantClient`` the caller holds
(``client=``; it stays the caller's: ``close`` leaves it open), such as qdrant-client's in-memory mode, the
stand-in for a server in tests: that mode keeps quantization settings without acting on them and has one shard, and
creating a collection there says so in one line. A server client is thread-safe; a local one is serialised by a
lock. Searching is :mod:`.server_search`, the async reads :mod:`.server_async`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import care_retriever.faults as faults
from care_retriever.documents import Document, check_metadata_keys
from care_retriever.errors import StoreError, WriteError
from care_retriever.stores.base import Filters, LocalFootprint, Manifest, check_metric, default_versions
from care_retriever.stores.config import QdrantCollectionConfig, as_qdrant_config
from care_retriever.stores.qdrant import server_settings
from care_retriever.stores.qdrant.common import (
    DEFAULT_COLLECTION,
    MANIFEST_KEY,
    QdrantOptions,
    QdrantStore,
    dense_vector,
    document_of,
    first_line,
    is_server,
    payload_of,
    point_id,
)
from care_retriever.stores.qdrant.server_async import ServerAsync
from care_retriever.stores.qdrant.server_search import ServerSearch
from care_retriever.stores.qdrant.server_settings import LOCAL_UNUSED, SERVER_ONLY, collection_options
from care_retriever.vectors import VectorContract

logger = logging.getLogger("care_retriever")


class ServerStore(ServerAsync, ServerSearch, QdrantStore):
    """A collection of a Qdrant server (``qdrant:https://host:6333``), or of a qdrant-client handed in."""

    @classmethod
    def serves(cls, location: str, client: Any) -> bool:
        return client is not None or is_server(location)

    def __init__(
        self, location: str, collection: str = DEFAULT_COLLECTION, client: Any = None, *, api_key: str | None = None
    ) -> None:
        """``client``: a ``QdrantClient`` the caller already holds (it stays the caller's: close() leaves it open);
        ``api_key``: a server key other than ``QDRANT_API_KEY``'s."""
        self.location = location
        self.collection = collection
        self._owns_client = client is None
        self._api_key = api_key  # for the async client of a server store, opened on first async read
        self.client = client if client is not None else server_settings.client(location, api_key)
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
                f"{self.describe()}: cannot reach Qdrant ({type(exc).__name__}: {first_line(exc)})"
            ) from exc
        if info is not None:
            raw = (info.config.metadata or {}).get(MANIFEST_KEY)
            if raw is None:
                raise StoreError(f"{self.describe()}: collection exists but was not written by care-retriever")
            self.manifest = Manifest.from_dict(raw, self.describe())

    def local_footprint(self, index: QdrantOptions = None) -> LocalFootprint | None:
        """A local-mode client's folder (it persists point by point: no staging copy); None in memory or on a server."""
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
            self.check_settings(requested)
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
                raise StoreError(f"{self.describe()}: cannot create the collection ({first_line(exc)})") from exc
            joined = ServerStore(self.location, self.collection, client=self.client)
            joined.check_compatible(space_fingerprint, dim)
            joined.check_settings(requested)
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
                "%s: Qdrant local mode %s%s%s; a Qdrant server applies them (benchmarks/results/scale.md)",
                self.describe(),
                f"has one shard and no replicas (ignoring {', '.join(dropped)})" if dropped else "",
                "; it " if dropped and unused else "",
                f"records {', '.join(unused)} but searches the full vectors exactly in RAM" if unused else "",
            )

    def collection_settings(self) -> dict[str, Any]:
        """Quantization, on-disk vectors, shards and replicas as Qdrant reports them for this collection."""
        self.require_manifest()
        with self._lock:
            info = self.client.get_collection(self.collection)
        return server_settings.collection_settings(info)

    def verify(self, *, record_checksums: bool = False) -> int:  # no checksums kept: none to record
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

        vectors = self.checked_vectors(documents, vectors)
        check_metadata_keys(documents)
        from care_retriever.sparse.qdrant_sparse import VECTOR

        terms = self.sparse_terms(documents, sparse_tokens)
        sparse = (
            [{VECTOR: models.SparseVector(indices=ids, values=values)} for ids, values in terms]
            if terms is not None
            else None
        )
        points = [
            models.PointStruct(
                id=point_id(d.id),
                vector=v.tolist() if sparse is None else {"": v.tolist(), **sparse[i]},
                payload=payload_of(d),
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
                yield document_of(p.payload)
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
                found[p.payload["doc_id"]] = document_of(p.payload)
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
                self.client = server_settings.client(self.location)
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
