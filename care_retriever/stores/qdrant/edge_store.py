"""``qdrant:PATH``: a Qdrant collection on Qdrant Edge, Qdrant's own engine in this process.

A store folder holds one collection per subfolder: ``PATH/NAME/shard`` (the Edge shard: write-ahead log,
segments, HNSW graphs, quantized codes, payload indexes) and ``PATH/NAME/manifest.json`` (this package's manifest,
written atomically at each commit). ``qdrant::memory:`` is the same engine in a temporary folder, removed at
``close``: tests and notebooks run the engine users deploy.

Writes: ``upsert`` / ``delete`` go to the engine's log (they survive the death of the process); ``commit`` flushes
the shard, the commit point that survives the machine, then writes the manifest; ``finalize`` commits, then runs
the engine's optimizer (HNSW and quantization are built there, once per bulk write, not per batch). A file-system
fault (disk full, I/O error) ends a write in one line and the shard is reopened from disk, so that what this
object counts is what ``verify`` and the next process find. One process owns a folder at a time.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import care_retriever.faults as faults
from care_retriever.documents import Document, check_metadata_keys
from care_retriever.errors import StoreError, WriteError
from care_retriever.paths import temporary_folder
from care_retriever.stores.base import LocalFootprint, Manifest, check_metric, default_versions
from care_retriever.stores.config import QdrantCollectionConfig, QdrantQuantize, as_qdrant_config
from care_retriever.stores.qdrant import edge, edge_files, edge_memory, edge_readonly, edge_space, edge_verify, legacy
from care_retriever.stores.qdrant.common import (
    DEFAULT_COLLECTION,
    QdrantOptions,
    QdrantStore,
    collection_folder,
    document_of,
    filter_conditions,
    is_server,
    point_id,
)
from care_retriever.stores.qdrant.edge_files import SHARD_FOLDER
from care_retriever.stores.qdrant.edge_manifest import MANIFEST_FILE, read_manifest, write_manifest
from care_retriever.stores.qdrant.edge_opening import Opened, before_open, opened
from care_retriever.stores.qdrant.edge_payload import index_metadata
from care_retriever.stores.qdrant.edge_search import EdgeSearch
from care_retriever.stores.qdrant.edge_space import OPEN_SHARD, folder_bytes, require_space
from care_retriever.stores.qdrant.edge_verify import damage, unchecked_manifest

logger = logging.getLogger("care_retriever")

# settings of a server only: Edge has one shard and no replicas
SERVER_ONLY = ("shards", "replicas")
BATCH = 256


class EdgeStore(EdgeSearch, QdrantStore):
    """A Qdrant collection in a Qdrant Edge shard (``qdrant:PATH``, ``qdrant::memory:``)."""

    keeps_checksums = True  # its manifest's own (the shard checks its own files)

    @classmethod
    def serves(cls, location: str, client: Any) -> bool:
        return client is None and not is_server(location)

    def __init__(
        self, location: str, collection: str = DEFAULT_COLLECTION, client: Any = None, *, api_key: str | None = None
    ) -> None:
        self.location = location
        self.collection = collection_folder(collection)  # before any path is made of it
        self.manifest: Manifest | None = None
        self.shard: edge.EdgeShard | None = None
        self._lock = threading.RLock()  # the binding holds the GIL per call; this keeps a write's calls together
        self._unindexed_kb = 0.0  # vectors written since the last optimize() (max_segment_size)
        self._uncommitted = 0  # points upserted since the last commit (at most: some may replace others)
        self._temporary = location == ":memory:"
        self.root = temporary_folder(self, "care-qdrant-edge-") if self._temporary else Path(location)
        if not self._temporary:
            faults.require_folder(self.root, f"the Qdrant Edge store qdrant:{location}")  # a file there stays
            legacy.refuse_foreign_folder(self.root, collection)
        folder = self.root / collection
        self._read_copy: Path | None = None  # on a full disk: the copy read instead (edge_readonly), no writes
        self._opened: Opened | None = None  # what the engine changed as it opened the shard (edge_opening)
        if (folder / SHARD_FOLDER).is_dir():  # reading opens what exists; creating anything waits for prepare
            self._read_copy = edge_readonly.read_copy(folder, location, collection, self)
            shard_folder = (self._read_copy or folder) / SHARD_FOLDER
            self.manifest = self._read_manifest()
            before = before_open(self.manifest, shard_folder, self._read_copy is None)  # what the open changes
            try:
                self.shard = edge.EdgeShard.load(shard_folder)
            except edge.ShardBusy as exc:
                raise StoreError(
                    f"{self.describe()} is open in another process (or object): one owner per folder at a time"
                ) from exc
            try:
                self._opened = opened(self.manifest, before, shard_folder, self._read_copy is None)
            except BaseException:
                self.close()
                raise

    @property
    def folder(self) -> Path:
        return self.root / self.collection

    def _read_manifest(self) -> Manifest:
        return read_manifest(self.folder / MANIFEST_FILE, self.describe())

    def _write_manifest(self, manifest: Manifest) -> None:
        write_manifest(self.folder / MANIFEST_FILE, manifest)

    # ------------------------------------------------------------------ creating
    def local_footprint(self, index: QdrantOptions = None) -> LocalFootprint | None:
        """The store's folder (Edge writes in place: no staging copy); None for a temporary store."""
        config = as_qdrant_config(index)
        if self._temporary:
            return None
        return LocalFootprint(self.root, quantized=config.quantize not in (None, QdrantQuantize.NONE))

    def prepare(
        self,
        dim: int,
        space_fingerprint: str,
        model_name: str,
        index: QdrantOptions = None,
        *,
        metric: str = "cosine",
    ) -> None:
        """Create the shard with ``index``'s settings, or check the existing collection's."""
        given = as_qdrant_config(index)  # its config or None, else one line: nothing created
        dropped = [k for k in SERVER_ONLY if k in given.given()]
        requested = given.local_mode()
        if self.manifest is not None:
            self.check_compatible(space_fingerprint, dim)
            self.check_settings(requested)
            return
        options = requested.resolved()
        if dropped:
            logger.warning(
                "%s: Qdrant Edge has one shard and no replicas (ignoring %s); a Qdrant server applies them",
                self.describe(),
                ", ".join(dropped),
            )
        import qdrant_edge

        manifest = Manifest(
            backend="qdrant",
            dim=dim,
            space_fingerprint=space_fingerprint,
            model_name=model_name,
            metric=check_metric(metric),
            index=options.to_manifest(),
            versions=default_versions(engine="qdrant-edge", qdrant_edge=getattr(qdrant_edge, "__version__", "0.9.0")),
        )
        settings = edge.ShardSettings(
            dim=dim,
            metric=metric,
            quantize=options.quantize.value if options.quantize else "none",
            always_ram=options.always_ram,
            on_disk=options.on_disk,
            on_disk_payload=options.on_disk_payload,
            m=options.m,
            ef_construct=options.ef_construct,
            indexing_threshold_kb=options.indexing_threshold,
            max_segment_size_kb=options.max_segment_size,
        )
        with self._lock, self._write_faults("the new collection"):
            self.folder.mkdir(parents=True, exist_ok=True)
            require_space(self.folder, OPEN_SHARD)
            self.shard = edge.EdgeShard.create(self.folder / SHARD_FOLDER, settings)
            self.shard.index_field("doc_id", "keyword")
            self.shard.flush()
            self._record_files(manifest)
            self._write_manifest(manifest)
        self.manifest = manifest

    def require_shard(self) -> edge.EdgeShard:
        if self.shard is None:
            self.require_manifest()
            raise StoreError(f"{self.describe()}: the shard is closed")
        return self.shard

    # ------------------------------------------------------------------ writes
    def upsert(
        self, documents: Sequence[Document], vectors: np.ndarray, *, sparse_tokens: Sequence[list[str]] | None = None
    ) -> None:
        vectors = self.checked_vectors(documents, vectors)
        check_metadata_keys(documents)
        manifest = self.require_manifest()  # the next optimize() over every point must fit in memory
        segment_kb = QdrantCollectionConfig.from_manifest(manifest.index).max_segment_size
        edge_memory.check_room(
            self.describe(), manifest.count + self._uncommitted + len(vectors), manifest.dim, segment_kb
        )
        sparse = self.sparse_terms(documents, sparse_tokens)
        terms = sparse if sparse is not None else [None] * len(documents)
        points = [
            edge.EdgePoint(point_id(d.id), v.tolist(), edge_verify.payload_of(d, v), t)
            for d, v, t in zip(documents, vectors, terms, strict=True)
        ]
        with self._lock, self._write_faults("the points"):
            shard = self.require_shard()
            index_metadata(shard, documents)
            for start in range(0, len(points), BATCH):
                batch = points[start : start + BATCH]
                # the log, the vectors and the payloads: each point's bytes about three times over
                require_space(self.folder, 3 * sum(4 * len(p.vector) + len(repr(p.payload).encode()) for p in batch))
                shard.upsert(batch)
                edge_verify.recorded_as_stored(shard, batch)
            self._unindexed_kb += vectors.size * 4 / 1024
            self._uncommitted += len(vectors)

    def delete(self, ids: Sequence[str]) -> int:
        existing = [r.payload["doc_id"] for r in self._records(list(ids), ["doc_id"], False)]
        if existing:
            with self._lock, self._write_faults("the deletion"):
                self.require_shard().delete([point_id(i) for i in existing])
        return len(existing)

    def commit(self) -> None:
        """Flush the shard (the commit point), then record the count in the manifest. Past ``max_segment_size`` KB
        of vectors since the last optimize(), optimize here: Edge writes all points into one segment, whose HNSW
        build peaks with its size (11 GiB at 1M 768-d vectors, benchmarks/results); built a segment at a time, lower."""
        manifest = self.require_manifest()
        with self._lock, self._write_faults("the commit"):
            shard = self.require_shard()
            shard.flush()
            manifest.count, self._uncommitted = shard.count(), 0
            manifest.updated_at = time.time()
            self._record_files(manifest)
            self._write_manifest(manifest)
        limit = QdrantCollectionConfig.from_manifest(manifest.index).max_segment_size
        if limit is not None and self._unindexed_kb >= limit:
            self._optimize()

    def finalize(self) -> None:
        """Commit, then build the engine's HNSW graphs and quantized codes for what was written, and flush them."""
        self.commit()
        self._optimize()

    def _optimize(self) -> None:  # the graphs and codes of the segments written since the last one
        manifest = self.require_manifest()
        segment_kb = QdrantCollectionConfig.from_manifest(manifest.index).max_segment_size
        kept = "the points are kept, searched exactly until an optimize() builds their graphs"
        edge_memory.check_room(self.describe(), manifest.count, manifest.dim, segment_kb, kept)
        with self._lock, self._write_faults("the optimized segments"):
            shard = self.require_shard()
            require_space(self.folder, folder_bytes(self.folder / SHARD_FOLDER / "segments"))  # rebuilt beside the old
            if shard.optimize():
                shard.flush()
                self._record_files(manifest)  # the new segments' files, hashed once
                self._write_manifest(manifest)
            self._unindexed_kb = 0.0

    def _record_files(self, manifest: Manifest) -> None:  # what the open found is what this commit records
        edge_files.record(manifest, self.require_shard().path)
        self._opened = None

    @contextlib.contextmanager
    def _write_faults(self, what: str) -> Iterator[None]:
        """A file-system fault ends the write in one line. A fault the engine met mid-call: the shard is reopened
        from disk, so that this object counts what the next process will (what each update had written to the log
        is replayed). A write the free-space check refused before the engine ran it: the open shard already holds
        what its folder holds, and is kept (reopening it on a full disk would die of SIGBUS)."""
        if self._read_copy is not None:
            raise edge_readonly.refuse_write(self.location, self.collection, what)
        try:
            yield
        except WriteError:
            raise
        except OSError as exc:
            reason = faults.reason_of(exc)
            if reason is None:
                raise
            if not isinstance(exc, edge_space.SpaceRefused):
                self._reopen()
            raise faults.write_error(
                f"qdrant:{self.location}",
                f"{what} into collection {self.collection}",
                exc,
                reason,
                "the points written before the failure are kept whole and the rest are not stored; "
                "run the same command again once there is space",
            ) from exc

    def _reopen(self) -> None:
        """Close the shard and load it again from disk; left closed where the disk has no room to open it (a load
        there can die of SIGBUS): the next open, once there is space, replays its log."""
        if self.shard is not None:
            with contextlib.suppress(Exception):
                self.shard.close()
            self.shard = None
        if (self.folder / SHARD_FOLDER).is_dir():
            with contextlib.suppress(StoreError, OSError):
                if edge_space.room_to_open(self.folder):
                    self.shard = edge.EdgeShard.load(self.folder / SHARD_FOLDER)

    # ------------------------------------------------------------------ reads
    def count(self, filters: Any = None) -> int:
        if self.manifest is None:
            return 0
        conditions = filter_conditions(filters)
        with self._lock:
            return self.require_shard().count(conditions)

    def _records(self, ids: Sequence[str], payload: bool | Sequence[str], vectors: bool) -> list[edge.EdgeRecord]:
        out: list[edge.EdgeRecord] = []
        for start in range(0, len(ids), BATCH):
            with self._lock:
                out += self.require_shard().retrieve(
                    [point_id(i) for i in ids[start : start + BATCH]], payload, vectors
                )
        return out

    def get(self, ids: Sequence[str]) -> list[Document | None]:
        if self.manifest is None:
            return [None] * len(ids)
        found = {r.payload["doc_id"]: document_of(r.payload) for r in self._records(list(ids), True, False)}
        return [found.get(i) for i in ids]

    def content_hashes(self, ids: Sequence[str]) -> dict[str, str]:
        """Each stored document's content hash, where its text and vector match their hashes (else: not stored)."""
        if self.manifest is None or not ids:
            return {}
        records = self._records(list(ids), True, True)
        return {r.payload["doc_id"]: r.payload["content_hash"] for r in records if damage(r) is None}

    def vectors(self, ids: Sequence[str]) -> list[np.ndarray | None]:
        if self.manifest is None:
            return [None] * len(ids)
        records = self._records(list(ids), ["doc_id"], True)
        found = {r.payload["doc_id"]: np.asarray(r.vector, dtype=np.float32) for r in records if r.vector is not None}
        return [found.get(i) for i in ids]

    def scroll(
        self, payload: bool | Sequence[str] = True, vectors: bool = False, batch: int = BATCH
    ) -> Iterator[list[edge.EdgeRecord]]:
        """Every point, ``batch`` at a time."""
        if self.manifest is None:
            return
        offset: str | None = None
        while True:
            with self._lock:
                records, offset = self.require_shard().scroll(offset, batch, payload, vectors)
            if records:
                yield records
            if offset is None:
                return

    def iter_documents(self, batch: int = BATCH) -> Iterator[Document]:
        for records in self.scroll(True, False, batch):
            yield from (document_of(r.payload) for r in records)

    def collection_settings(self) -> dict[str, Any]:
        """The settings the shard holds (quantize, always_ram, on_disk, m, ef_construct; one shard, no replicas)
        and what the engine built: points, segments, indexed vectors, each segment's index (plain | hnsw) and
        quantization, the payload indexes. ``info`` prints it."""
        with self._lock:
            shard = self.require_shard()
            return {
                "engine": "qdrant-edge",
                **shard.recorded_settings(),
                "shards": 1,
                "replicas": 1,
                **shard.built(),
                "payload_indexes": shard.payload_indexes(),
            }

    def verify(self, *, record_checksums: bool = False) -> int:
        """Every check of ``edge_verify.check_shard``; what an earlier release left out: named, or recorded as is."""
        manifest, source, shard = self.require_manifest(), self.describe(), self.require_shard()
        with self._lock:  # every check reads one state of the shard
            found = edge_verify.check_shard(source, manifest, shard, self.folder, self._opened, record_checksums)
        count, unrecorded, checked, stale = found
        for line in [] if record_checksums else edge_verify.unrecorded_lines(source, unrecorded, manifest):
            logger.warning(line)  # written before vectors or files had checksums: the rest was checked
        if record_checksums and (unrecorded or not manifest.checksums or not checked or stale):
            with self._lock, self._write_faults("the checksums"):
                recorded = bool(unrecorded or not manifest.checksums or stale)  # else only the manifest's checksum
                if recorded:
                    shard.set_payload(unrecorded)  # (none: nothing set)
                    shard.flush()
                    self._record_files(manifest)
                self._write_manifest(manifest if recorded else self._read_manifest())
        elif not checked:
            raise unchecked_manifest(source)
        return count

    def close(self) -> None:
        """Release the folder; a temporary store's folder is removed. What was written since the last commit is in
        the engine's log (replayed by the next open), made durable on the machine by a commit."""
        with self._lock:
            if self.shard is not None:
                self.shard.close()
                self.shard = None
            if self._read_copy is not None:
                shutil.rmtree(self._read_copy.parent, ignore_errors=True)
            if self._temporary:
                shutil.rmtree(self.root, ignore_errors=True)
