"""The read state of a :class:`~care_retriever.stores.faiss.store.FaissStore`: the published version it opens
(sizes, headers and counts checked; nothing hashed), the version read now (a staged write's, mid-write) and the
catching up with what other processes committed since.

The base class of the store's read and write mixins (:mod:`~care_retriever.stores.faiss.reading`,
:mod:`~care_retriever.stores.faiss.writing`): it declares the state the store's ``__init__`` sets.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import faiss
import numpy as np

from care_retriever.errors import StoreError
from care_retriever.stores.base import Manifest
from care_retriever.stores.capabilities import IndexBuilding, SparseSearch, StoredIteration, Verification, WriteRuns
from care_retriever.stores.faiss import docstore, files, integrity, journal, rescoring, sparse
from care_retriever.stores.faiss.field_index import FieldIndexes
from care_retriever.stores.faiss.files import DOCSTORE, INDEX, MANIFEST, VECTORS
from care_retriever.stores.faiss.index_factory import IdOrder, index_ids, manifest_config, quantization, supports_remove
from care_retriever.stores.faiss.session import InPlaceWrite, StagedWrite
from care_retriever.stores.runs import RunTag


class OpenedVersion(SparseSearch, WriteRuns, Verification, StoredIteration, IndexBuilding):
    """The state a FaissStore reads through; set by its ``__init__`` (see there what each field holds).

    A FAISS store has every capability (:mod:`care_retriever.stores.capabilities`): claimed here, where the read and
    write mixins see them.
    """

    named: Path
    path: Path
    staging: Path
    use_gpu: bool | None
    oversample: float | None
    _lock: threading.RLock
    _writer_lock: files.WriterLock
    _session: StagedWrite | InPlaceWrite | None
    _checkpointed: bool
    _claimed_run: RunTag | None
    _vector_file: rescoring.VectorFile
    _read_folder: Path
    _read_index: faiss.Index | None
    _read_db: sqlite3.Connection | None
    _search_index: faiss.Index | None
    _count: int
    _tombstones: int
    _opened_as: tuple[int, int]
    _mapped: bool
    _id_order: IdOrder | None
    _field_indexes: FieldIndexes | None
    _bm25: sparse.Scorer

    def published(self) -> bool:
        """Whether a version of the store is published (a first bulk write's staged copy is all there is until it
        ends), where a reader finds it: the folder, or the previous version between the two renames of a publish."""
        return (self.path / MANIFEST).exists() or (files.old_path(self.path) / MANIFEST).exists()

    # The version read now: a staged write reads and writes its staging version; an in-place write, the
    # published one (its session holds the store's own index and connection).
    @property
    def _db(self) -> sqlite3.Connection | None:
        return self._session.db if self._session is not None else self._read_db

    @property
    def _index(self) -> faiss.Index | None:
        return self._session.index if self._session is not None else self._read_index

    def _current_manifest(self) -> Manifest:
        return self._session.manifest if self._session is not None else self.require_manifest()

    def _current_tombstones(self) -> int:
        return self._session.tombstones if self._session is not None else self._tombstones

    # ------------------------------------------------------------------ opening
    def _open(self, folder: Path, writable: bool = False) -> None:
        """Open a published store: sizes, headers and counts are checked; no file is hashed (see verify())."""
        self.manifest = files.read_manifest(folder / MANIFEST)
        if self.manifest.backend != "faiss":  # e.g. a Qdrant Edge collection's folder: not a damaged FAISS store
            raise StoreError(
                f"{folder}: a {self.manifest.backend} store's folder (its {MANIFEST} says so), not a FAISS store"
            )
        for name in (INDEX, DOCSTORE):
            if not (folder / name).is_file():
                raise StoreError(f"{folder / name}: missing; the store is incomplete")
        if self._read_db is not None:
            self._read_db.close()
        self._read_db = docstore.open_published(folder / DOCSTORE, writable=writable)
        meta = journal.read_meta(self._read_db, folder)
        integrity.check_on_open(self._read_db, folder, self.manifest, meta)
        journal.roll_fold_forward(folder, meta)  # the docstore already counts a recorded fold
        journal.check_sizes(folder, meta, self.manifest.sizes.get(INDEX))
        # With no delta to apply, flat vectors are memory-mapped (opening reads headers and ids, not every
        # vector); a mapped index is read-only, so the first write of a process reads it whole (_begin_in_place).
        self._mapped = not meta.get("delta_bytes") and not writable
        try:
            self._read_index = faiss.read_index(str(folder / INDEX), faiss.IO_FLAG_MMAP_IFC if self._mapped else 0)
        except RuntimeError as exc:
            raise StoreError(f"{folder / INDEX}: corrupted FAISS index ({str(exc).splitlines()[0]})") from exc
        integrity.check_index(folder, self.manifest, self._read_index)
        self._id_order = None
        self._replay_delta(folder, 0, int(meta.get("delta_bytes", 0)))
        if "count" in meta:
            self._count, self._tombstones = int(meta["count"]), int(meta.get("tombstones", 0))
        else:  # format 1: the manifest holds the counts
            self._count = self.manifest.count
            self._tombstones = int(self.manifest.index.get("tombstones", 0))
        self._check_counts(folder)
        self._vector_file.forget()
        self._read_folder = folder
        if quantization(manifest_config(self.manifest.index)) != "none":
            self._check_vectors_file(folder, index_ids(self._read_index))
        self._opened_as = ((folder / INDEX).stat().st_ino, int(meta.get("delta_bytes", 0)))
        self._search_index = None

    def _check_vectors_file(self, folder: Path, rows: np.ndarray) -> None:
        """A quantized store's rescoring vectors must exist and hold every row (never codes-only scores)."""
        manifest = self.require_manifest()
        rescoring.check_vectors_file(
            folder, manifest.dim, rows, manifest.sizes.get(VECTORS), quantization(manifest_config(manifest.index))
        )

    def _full_vectors(self, rows: np.ndarray) -> np.ndarray:
        """Full-precision vectors of ``rows`` (row ids), read from the memory-mapped vectors.f32."""
        session = self._session
        folder = session.folder if isinstance(session, StagedWrite) else self._read_folder
        return self._vector_file.read(folder, self._current_manifest().dim, rows)

    def _replay_delta(self, folder: Path, start: int, stop: int) -> None:
        """Apply the committed delta records in ``[start, stop)`` bytes to the in-memory index."""
        assert self._read_index is not None and self.manifest is not None
        removes = supports_remove(manifest_config(self.manifest.index))
        journal.replay(self._read_index, folder, start, stop, self.manifest.dim, removes)

    def _check_counts(self, folder: Path) -> None:
        assert self._read_index is not None
        if self._read_index.ntotal != self._count + self._tombstones:
            raise StoreError(
                f"{folder}: count mismatch: the store records {self._count} documents and {self._tombstones} "
                f"tombstones, the index has {self._read_index.ntotal} vectors; the store is corrupted"
            )

    def _published_version(self) -> tuple[int, int, dict[str, int]]:
        """(inode of index.faiss, committed delta bytes, the journal's meta) as the last commit left them."""
        assert self._read_db is not None
        return journal.published_version(self._read_db, self.path)

    def _follow_writes(self) -> None:
        """A reader catches up with what other processes committed since it opened: the in-memory FAISS index
        would otherwise miss rows the docstore and the BM25 side already hold (hybrid mixing two versions).

        Checked before each read (one stat, one SQLite read); a change observed is a reopen, not an in-place
        replay, so that no search ever runs on an index being added to. A fold in progress changes no row:
        the reader keeps its version until the fold is done; so does it while a re-index swaps the folder.
        """
        if self._session is not None or self._read_db is None or self._opened_as == (0, 0):
            return
        with self._lock:
            try:
                inode, committed, meta = self._published_version()
            except (FileNotFoundError, StoreError):
                return  # mid-swap: the next read sees the new version
            if meta.get("fold_pending") or (inode, committed) == self._opened_as:
                return
            self._open(self.path)

    # ------------------------------------------------------------------ reading
    def _require_db(self) -> sqlite3.Connection:
        if self._db is None:
            self.require_manifest()
            raise StoreError(f"{self.describe()}: store is closed")
        return self._db

    def _require_session(self) -> StagedWrite | InPlaceWrite:
        if self._session is None:
            raise StoreError(f"{self.describe()}: call prepare() before writing")
        return self._session
