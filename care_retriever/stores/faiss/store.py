"""FaissStore: the embedded default store (layout of its folder: the package docstring).

Vectors are as the store's model gives them (:mod:`care_retriever.vectors`): unit-norm for a cosine model, so
inner product is cosine; cut without renormalising for a dot-product model. Two write paths share one writer lock:

* Bulk (``prepare`` / ``commit`` / ``finalize``, used by ``care-retriever index``): writes go to a
  staging folder beside ``DIR`` (checkpointed by :meth:`commit`); :meth:`finalize` swaps it into
  place, so readers never see a half-written store, and a killed writer resumes from its last checkpoint.
* Small (:meth:`transaction` on a published store, used by the framework adapters): rows are written
  in place in the docstore (SQLite WAL), vectors appended to ``vectors.delta`` (``journal``); the SQLite
  commit, which also records the delta's committed length, is the commit point, so a write killed anywhere
  leaves either all or none of it (a delta tail past the committed length is ignored and cut by the
  next writer). Any other table in the docstore written in the same transaction commits with it.
  The delta is folded into ``index.faiss`` when it grows past half of it (amortised cost per write).

Opening checks sizes, headers and counts only; ``care-retriever verify`` reads every byte. One writer at a time:
:meth:`prepare` takes an exclusive lock on ``.DIR.lock`` beside the store (released by the OS if the
writer dies), so two indexing runs into one store fail fast instead of mixing their checkpoints.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from care_retriever import faults, paths
from care_retriever.documents import Document
from care_retriever.errors import InputError, StoreError, WriteError
from care_retriever.sparse.fusion import FUSIONS, FusionConfig
from care_retriever.stores.base import (
    STORE_FORMAT_VERSION,
    Filters,
    Hit,
    LocalFootprint,
    Manifest,
    VectorStore,
    check_metric,
    default_versions,
    validate_filters,
)
from care_retriever.stores.config import FaissIndexConfig, Quantize
from care_retriever.stores.faiss import docstore, files, integrity, journal, pending, rescoring, sparse
from care_retriever.stores.faiss.files import DELTA, DOCSTORE, INDEX, MANIFEST, VECTORS
from care_retriever.stores.faiss.index_factory import (
    IndexOptions,
    build_index,
    checked_options,
    index_ids,
    inner_index,
    manifest_config,
    quantization,
    reconstruct,
    search_params,
    search_with,
    supports_remove,
    takes_search_params,
)
from care_retriever.stores.faiss.session import InPlaceWrite, StagedWrite, read_staged_manifest
from care_retriever.stores.runs import RunTag
from care_retriever.vectors import VectorContract


class FaissStore(VectorStore):
    """FAISS + SQLite store in a folder. Safe for concurrent searches from many threads."""

    backend = "faiss"
    stages_bulk_writes = True

    def __init__(self, path: str | Path, *, use_gpu: bool | None = None, oversample: float | None = None) -> None:
        self.named = Path(path)  # as the user named it (messages)
        # the real folder (links followed, `.` and relative forms resolved): one lock and one publish per folder
        self.path = paths.real_folder(self.named, f"the FAISS store faiss:{path}")
        self.staging = files.staging_path(self.path)
        self.use_gpu = use_gpu
        # Quantized stores: candidates taken from the codes per result wanted; None: the manifest's value.
        self.oversample = oversample
        self._lock = threading.RLock()
        self._writer_lock = files.WriterLock(self.path, self.describe())
        # The write open now, if any: it owns the state of its mode (see session.py); one at a time.
        self._session: StagedWrite | InPlaceWrite | None = None
        self._checkpointed = False  # the staged write open now has a checkpoint a re-run would resume
        self._claimed_run: RunTag | None = None  # the run the next prepare() belongs to (claim_run)
        # The read state: the published version this object serves (closed during a staged write, which reads
        # its staging version instead).
        self._vector_file = rescoring.VectorFile()  # vectors.f32 memory-mapped read-only, rows = row ids
        self._read_folder = self.path  # the published folder opened (the previous version's, mid-swap)
        self.manifest: Manifest | None = None
        self._read_index: faiss.Index | None = None
        self._read_db: sqlite3.Connection | None = None
        self._search_index: faiss.Index | None = None  # the index searched now (on a GPU where there is one)
        self._count = 0
        self._tombstones = 0
        self._opened_as: tuple[int, int] = (0, 0)  # (inode of index.faiss, committed delta bytes) at open
        self._mapped = False  # index vectors memory-mapped from index.faiss (read-only)
        self._id_order: np.ndarray | None = None  # argsort of the ids of the index read now, for vectors()
        self._bm25 = sparse.Scorer()  # the query side of the BM25 index, kept across searches
        old = files.old_path(self.path)
        faults.require_folder(self.path, f"the FAISS store {self.describe()}")  # a file there stays untouched
        if (self.path / MANIFEST).exists():
            self._open(self.path)
        elif self.path.exists() and any(self.path.iterdir()):
            raise StoreError(f"{self.path}: folder exists but is not a care-retriever FAISS store (no {MANIFEST})")
        elif not self.path.exists() and (old / MANIFEST).exists() and (self.staging / MANIFEST).exists():
            # A writer died between the two renames of finalize(): serve the previous version meanwhile;
            # running the writer again publishes the staged one.
            self._open(old)

    def describe(self) -> str:
        return f"faiss:{self.named}"

    @property
    def lock_path(self) -> Path:
        return self._writer_lock.path

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

    # ------------------------------------------------------------------ writing
    def prepare(
        self,
        dim: int,
        space_fingerprint: str,
        model_name: str,
        index: IndexOptions = None,
        *,
        metric: str = "cosine",
    ) -> None:
        run, self._claimed_run = self._claimed_run or RunTag(space_fingerprint=space_fingerprint), None
        options = checked_options(index)  # its config or None; anything else is one line
        check_metric(metric)
        if self.manifest is not None:
            self.check_compatible(space_fingerprint, dim)
            self._check_same_quantization(options)
        self._refuse_second_write()
        paths.require_swappable(self.path, f"the FAISS store {self.describe()}")  # publish renames the folder
        self._writer_lock.acquire()
        try:
            resumed = (self.staging / MANIFEST).exists()
            if resumed:
                session = self._resume_staging(dim, space_fingerprint, run)
            else:
                with faults.writing(self.staging, "the staging copy of the store", unchanged=self._unchanged()):
                    try:
                        session = self._new_staging(dim, space_fingerprint, model_name, options, metric, run)
                    except BaseException:
                        files.discard(self.staging)  # no checkpoint yet: nothing to resume, and the space is freed
                        raise
        except BaseException:
            self._writer_lock.release()
            raise
        self._checkpointed = resumed  # whether the staging folder holds work a re-run should resume
        with self._lock:
            # The published version is not read while its next one is written (its index may be large).
            if self._read_db is not None:
                self._read_db.close()
                self._read_db = None
            self._read_index = None
            self._search_index = None
            self._id_order = None
            self._session = session

    def _refuse_second_write(self) -> None:
        """One write at a time per store object (other objects and processes: the writer lock)."""
        if self._session is not None:
            raise StoreError(f"{self.describe()}: a write is already open; finalize() or abort() it first")

    def _check_same_quantization(self, index: FaissIndexConfig) -> None:
        """A store's quantization is fixed at creation: its codes were trained and written for it."""
        assert self.manifest is not None
        have = quantization(manifest_config(self.manifest.index))
        want = index.quantize  # None: not asked, the store's own
        if want is not None and want != have:
            raise InputError(
                f"{self.describe()} is built with quantize={have}; the quantization of an existing store "
                f"cannot change: index into a new store with quantize={want}"
            )

    @property
    def pending_write(self) -> bool:
        """True while an interrupted bulk writer's checkpoint (a staging folder) waits to be resumed."""
        return (self.staging / MANIFEST).exists() and not isinstance(self._session, StagedWrite)

    def claim_run(self, run: RunTag) -> None:
        self._claimed_run = run

    def pending_run(self) -> str | None:
        """Another run's staged write (or, while this object writes, its own once checkpointed), in one line."""
        mine = isinstance(self._session, StagedWrite)
        if not (self.staging / MANIFEST).exists() or (mine and not self._checkpointed):
            return None
        return f"{pending.describe(self.describe(), self.staging)}; {pending.how_to_end(self.describe())}"

    def discard_pending(self) -> str | None:
        """Remove the staging folder of an unfinished bulk write; the published store is kept (and, where a run
        died between the two renames of its publish, the previous version is put back in place)."""
        self._refuse_second_write()
        if not self.staging.exists():
            return None
        self._writer_lock.acquire()  # not while that run (or any writer) is still going
        try:
            said = pending.describe(self.describe(), self.staging) if (self.staging / MANIFEST).exists() else None
            with faults.writing(self.staging, "the removal of the staging copy", unchanged=self._unchanged()):
                files.discard(self.staging)
                old = files.old_path(self.path)
                if not self.path.exists() and (old / MANIFEST).exists():
                    old.rename(self.path)
                    files.fsync_dir(self.path.parent)
            if (self.path / MANIFEST).exists():
                self._open(self.path)
        finally:
            self._writer_lock.release()
        return said

    def begin(
        self,
        dim: int,
        space_fingerprint: str,
        model_name: str,
        index: IndexOptions = None,
        *,
        metric: str = "cosine",
    ) -> None:
        """Start a :meth:`transaction`: in place on a published store, through a staging folder for a new one."""
        index = checked_options(index)
        if self.manifest is not None:
            self.check_compatible(space_fingerprint, dim)
            self._check_same_quantization(index)
        self._refuse_second_write()
        self._writer_lock.acquire()  # fails fast while another writer is running
        try:
            if self.pending_write:  # a small write now would be lost when that run publishes its copy
                raise pending.refusal(self.describe(), self.staging)
            if (self.path / MANIFEST).exists() and self.manifest is not None:
                with faults.writing(self.path, "the start of a transaction", unchanged=self._unchanged()):
                    self._session = self._begin_in_place()
                return
        except BaseException:
            self._writer_lock.release()
            raise
        self.prepare(dim, space_fingerprint, model_name, index, metric=metric)

    def trains_on_first_vectors(self, index: IndexOptions = None) -> bool:
        """A new store whose index has IVF lists or compressed codes trains them on its first vectors."""
        return self.manifest is None and checked_options(index).trains_on_first_vectors

    def local_footprint(self, index: IndexOptions = None) -> LocalFootprint:
        """The store's folder; a bulk write copies the published store into a staging folder beside it, and a
        quantized store writes each vector twice (codes, and ``vectors.f32`` that rescores them)."""
        quantized = checked_options(index).quantization is not Quantize.NONE
        return LocalFootprint(self.path, published_bytes=faults.folder_size(self.path), quantized=quantized)

    def _unchanged(self) -> str:
        return "the published store is unchanged" if self.manifest is not None else "no store was published"

    @contextlib.contextmanager
    def _write_faults(self, session: StagedWrite | InPlaceWrite, what: str) -> Iterator[None]:
        """A file-system fault in a write (disk full, I/O error, permission denied) ends the write in one line.

        A staged write keeps its last checkpoint for the re-run to resume (or, with none taken, removes the
        staging folder and its space) and the store serves the published version again; an in-place write is
        rolled back by the caller's abort() (its uncommitted delta tail is ignored and cut by the next writer).
        """
        before = session.opened_as if isinstance(session, InPlaceWrite) else None
        # the staging folder's inode: after the publish's swap the store's folder is that very folder
        staged = self.staging.stat().st_ino if isinstance(session, StagedWrite) and self.staging.exists() else None
        try:
            yield
        except WriteError:
            raise
        except (OSError, sqlite3.OperationalError, RuntimeError) as exc:
            reason = faults.reason_of(exc)
            if reason is None:
                raise
            tail = self._unchanged()
            if isinstance(session, InPlaceWrite) and session.opened_as != before:
                tail = "the write was committed before the failure; the store is consistent"
            if staged is not None and self.path.exists() and self.path.stat().st_ino == staged:
                tail = "the new version was published before the failure (its folder's sync failed)"
            if isinstance(session, StagedWrite) and self._session is session:
                tail += self._end_staged_write(session)
            raise faults.write_error(self.path, what, exc, reason, tail) from exc

    def _end_staged_write(self, session: StagedWrite) -> str:
        """After a failed staged write: keep the last checkpoint (or remove a staging folder without one), release
        the writer lock and serve the published version; returns what the message says of the staging folder."""
        self._session = None
        with contextlib.suppress(Exception):
            session.close()  # the docstore's uncommitted rows are rolled back; the checkpoint stays
        if self._checkpointed and (self.staging / MANIFEST).exists():
            for leftover in self.staging.glob("*.tmp"):
                files.remove_quietly(leftover)
            said = f"; the next run resumes from the last checkpoint in {self.staging}"
        else:
            files.discard(self.staging)
            said = ""
        self._writer_lock.release()
        with contextlib.suppress(StoreError, OSError):
            self.manifest = None
            if (self.path / MANIFEST).exists():
                self._open(self.path)
            elif (files.old_path(self.path) / MANIFEST).exists():
                self._open(files.old_path(self.path))
        return said

    def _begin_in_place(self) -> InPlaceWrite:
        """Catch up with writes made by other processes since this one opened, then accept writes in place."""
        with self._lock:
            assert self._read_db is not None
            self._read_db.commit()
            inode, committed, meta = self._published_version()
            stale = inode != self._opened_as[0] or committed < self._opened_as[1] or meta.get("fold_pending")
            if stale or self._mapped:
                self._open(self.path, writable=True)  # republished or folded meanwhile, or mapped: read it whole
            elif committed > self._opened_as[1]:
                self._replay_delta(self.path, self._opened_as[1], committed)
                self._count, self._tombstones = int(meta["count"]), int(meta.get("tombstones", 0))
                self._opened_as = (inode, committed)
            db, index = self._read_db, self._read_index
            assert self.manifest is not None and db is not None and index is not None
            db.execute("PRAGMA query_only=0")  # opened to read: this connection now writes
            if not meta:  # a format-1 store takes its first small write: it becomes format 2
                db.execute("PRAGMA journal_mode=WAL")
                journal.start_meta(db, self.path / INDEX, self._count, self._tombstones)
                self.manifest.format_version = max(self.manifest.format_version, STORE_FORMAT_VERSION)
            # Checksums left stale by a writer killed after its commit are taken again before this write changes
            # the files: each write then records only what it changed (integrity.seal).
            integrity.reseal_if_stale(db, self.path, self.manifest, force=not meta)
            return InPlaceWrite(self.path, self.manifest, index, db, self._count, self._tombstones, self._opened_as)

    def _new_staging(
        self,
        dim: int,
        space_fingerprint: str,
        model_name: str,
        options: FaissIndexConfig,
        metric: str,
        run: RunTag,
    ) -> StagedWrite:
        """Start a write: a copy of the published store (or an empty index); its manifest is written last."""
        files.empty_folder(self.staging)
        pending.write_tag(self.staging, run)  # the copy belongs to this run: no other resumes or publishes it
        source = self.path if (self.path / MANIFEST).exists() else files.old_path(self.path)
        if self.manifest is not None:  # update an existing store: work on a copy
            if self._opened_as[1] and self._read_index is not None:  # a delta is applied in memory: write it whole
                files.write_index_file(self._read_index, self.staging / INDEX)
            else:
                files.copy_durably(source / INDEX, self.staging / INDEX)
            if (source / VECTORS).exists():
                files.copy_durably(source / VECTORS, self.staging / VECTORS)
            if self._read_db is not None:  # the backup API copies committed WAL pages too
                docstore.backup(self._read_db, self.staging / DOCSTORE)
                files.fsync_file(self.staging / DOCSTORE)
            else:
                files.copy_durably(source / DOCSTORE, self.staging / DOCSTORE)
            manifest = Manifest.from_dict(self.manifest.to_dict(), MANIFEST)
            asked = options.oversample  # a search setting: may change (the default does not reset it)
            if asked is not None and quantization(manifest_config(manifest.index)) != "none":
                manifest.index["oversample"] = float(asked)
        else:
            manifest = Manifest(
                backend="faiss",
                dim=dim,
                space_fingerprint=space_fingerprint,
                model_name=model_name,
                metric=metric,  # recorded; the index is inner product either way
                index=options.to_manifest(),
                versions=default_versions(faiss=faiss.__version__),
            )
            files.write_index_file(build_index(dim, options), self.staging / INDEX)
            if quantization(options) != "none":
                manifest.format_version = rescoring.QUANTIZED_FORMAT_VERSION
                (self.staging / VECTORS).touch()
                files.fsync_file(self.staging / VECTORS)
        manifest.checksums, manifest.block_checksums, manifest.sizes, manifest.sealed = {}, {}, {}, {}
        # The staging manifest marks a complete starting point: a run killed before it exists starts over.
        files.write_manifest(self.staging, manifest)
        return StagedWrite(self.staging)

    def _resume_staging(self, dim: int, space_fingerprint: str, run: RunTag) -> StagedWrite:
        """Continue the same run, killed or stopped: reconcile the last checkpoint of index and docstore. Another
        run's staging copy is neither resumed nor published: one line says what is pending."""
        if not run.same_run(pending.read_tag(self.staging)):
            raise pending.refusal(self.describe(), self.staging, why=f"this is {run.describe()}, another run")
        staged = read_staged_manifest(self.staging)
        if staged.space_fingerprint != space_fingerprint or staged.dim != dim:
            raise pending.refusal(self.describe(), self.staging, why="it was written by another model")
        session = StagedWrite(self.staging)
        try:
            session.reconcile()
        except BaseException:
            session.close()
            raise
        return session

    def content_hashes(self, ids: Sequence[str]) -> dict[str, str]:
        db = self._require_db()
        with self._lock:
            return docstore.content_hashes(db, ids)

    def upsert(
        self, documents: Sequence[Document], vectors: np.ndarray, *, sparse_tokens: Sequence[list[str]] | None = None
    ) -> None:
        session = self._require_session()
        if len(documents) != len(vectors):
            raise InputError(f"{len(documents)} documents but {len(vectors)} vectors")
        if sparse_tokens is not None and len(sparse_tokens) != len(documents):
            raise InputError(f"{len(documents)} documents but {len(sparse_tokens)} token lists")
        if len(documents) == 0:
            return
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != session.manifest.dim:
            raise InputError(
                f"{self.describe()}: vectors have shape {vectors.shape}; "
                f"the store holds {session.manifest.dim}-dim vectors"
            )
        with self._lock, self._write_faults(session, "the documents and their vectors"):
            session.upsert(documents, vectors, sparse_tokens)
            self._id_order = None
            self._search_index = None

    def delete(self, ids: Sequence[str]) -> int:
        session = self._require_session()
        with self._lock, self._write_faults(session, "the deletion"):
            removed = session.delete(list(ids))
            self._id_order = None
            self._search_index = None
        return removed

    def commit(self) -> None:
        """Checkpoint a bulk write (staging folder), or commit an in-place transaction (the journal's commit point)."""
        session = self._require_session()
        what = "the transaction" if isinstance(session, InPlaceWrite) else "a checkpoint"
        with self._lock, self._write_faults(session, what):
            if isinstance(session, InPlaceWrite):
                self._opened_as = session.commit()
                self._count, self._tombstones = session.count, session.tombstones
            else:
                session.commit()
                self._checkpointed = True

    def finalize(self) -> None:
        """Publish: swap the staging folder into place (bulk), or commit the in-place transaction."""
        session = self._require_session()
        self.commit()
        with self._lock:
            if isinstance(session, InPlaceWrite):
                session.close()
                self._session = None
                self._vector_file.forget()  # remapped on the next search: the file may have grown
                self._writer_lock.release()
                return
            with self._write_faults(session, "the new version of the store (publish)"):
                session.publish(self.path)
            self._session = None
            self._writer_lock.release()
            self._open(self.path)

    def abort(self) -> None:
        """Drop the writes since begin()/prepare() and release the writer lock; the published store is reopened."""
        with self._lock:
            session, self._session = self._session, None
            if session is not None:
                # after a failed write (disk full, I/O error) SQLite may refuse the rollback too: the uncommitted
                # transaction is dropped with the connection either way
                with contextlib.suppress(sqlite3.OperationalError):
                    session.abort()
            if self._read_db is not None:
                self._read_db.close()
                self._read_db = None
            self._writer_lock.release()
            self._read_index = None
            self._search_index = None
            self._id_order = None
            self.manifest = None
            self._count = self._tombstones = 0
            if (self.path / MANIFEST).exists():
                self._open(self.path)

    def enable_sparse(self, *, rebuild: bool = False, show_progress: bool = False) -> int:
        """Give the store being written a BM25 side (care_retriever.sparse), built from the stored texts.

        Nothing is re-encoded. The postings are written in the docstore's transaction and published by
        finalize(): a build killed before that leaves the published store as it was. Returns the number of
        documents tokenized (0 when the side exists with this tokenizer and ``rebuild`` is off).
        """
        from care_retriever.sparse import sparse_entry
        from care_retriever.sparse.tokenizer import tokenizer_spec

        session = self._require_session()
        entry = session.manifest.sparse
        if entry and entry.get("tokenizer") == tokenizer_spec() and not rebuild:
            return 0
        with self._lock:
            done = sparse.build(session.db, show_progress=show_progress)
            session.manifest.sparse = sparse_entry("sqlite-bm25")
        return done

    def search_sparse(
        self, queries: Sequence[str], top_k: int, filters: Filters | None = None, *, payload: bool = True
    ) -> list[list[Hit]]:
        """BM25 top-``k`` hits for each query text (an empty list for a query with no indexed token)."""
        from care_retriever.sparse import require_sparse

        sparse.check_search(self.describe(), self._session is not None, top_k)
        self._follow_writes()
        require_sparse(self)
        filters = validate_filters(filters)
        ranked = self._sparse_ranked(queries, top_k, self._filtered_row_ids(filters) if filters else None)
        docs = self._rows({r for row in ranked for r, _ in row}, payload=payload)
        return [docstore.hits(row, docs, top_k) for row in ranked]

    hybrid_fusions = FUSIONS  # every fusion runs in this process, on row ids

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
        """Dense and BM25 rankings fused on row ids (care_retriever.sparse.fusion): only the fused top-``k``
        documents are read from the docstore, not each side's candidates (which cost as much as the BM25
        scoring). A query with no indexed token gets its dense hits."""
        from care_retriever.sparse import require_sparse

        sparse.check_search(self.describe(), self._session is not None, top_k)
        self._follow_writes()
        require_sparse(self)
        fusion = fusion or FusionConfig()
        filters = validate_filters(filters)
        allowed = self._filtered_row_ids(filters) if filters else None  # one filter query for both sides
        depth = max(fusion.candidates, top_k)
        dense = self._dense_ranked(vectors, depth, filters, allowed)
        if self._current_tombstones():  # removed rows still in the index (HNSW): dropped before they are fused
            live = self._rows({r for row in dense for r, _ in row}, payload=False)
            dense = [[(r, s) for r, s in row if r in live][:depth] for row in dense]
        cuts = sparse.fused_cuts(dense, self._sparse_ranked(queries, depth, allowed), fusion, top_k)
        docs = self._rows({r for row in cuts for r, _ in row}, payload=payload)
        return sparse.hybrid_hits(cuts, docs, top_k)

    def _sparse_ranked(
        self, queries: Sequence[str], top_k: int, allowed: np.ndarray | None
    ) -> list[list[tuple[int, float]]]:
        """Each query's BM25 top-``k`` (row id, score), best first, ties by row id."""
        db = self._require_db()
        tokens = sparse.query_tokens(queries)
        with self._lock:
            return self._bm25.ranked(db, tokens, top_k, allowed)

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

    def count(self, filters: Filters | None = None) -> int:
        if self._db is None:
            return 0
        self._follow_writes()
        filters = validate_filters(filters)
        if filters:
            return len(self._filtered_row_ids(filters))
        session = self._session
        if session is None:
            return self._count
        if isinstance(session, InPlaceWrite):
            return session.count
        with self._lock:
            return docstore.count(session.db)

    def vectors(self, ids: Sequence[str]) -> list[np.ndarray | None]:
        """Stored vector of each id (None where the id is missing)."""
        if self._db is None or self._index is None:
            return [None] * len(ids)
        self._follow_writes()
        ids = list(ids)
        with self._lock:
            rows = docstore.row_ids(self._db, ids)
            manifest = self._current_manifest()
            if quantization(manifest_config(manifest.index)) != "none":  # the exact vectors, not decoded codes
                found = np.asarray([rows[i] for i in ids if i in rows], dtype=np.int64)
                full = iter(self._full_vectors(found))
                return [next(full).copy() if i in rows else None for i in ids]
            wanted = np.asarray([rows.get(i, -1) for i in ids], dtype=np.int64)
            vectors, self._id_order = reconstruct(self._index, wanted, self._id_order)
            return vectors

    def _searchable(self) -> faiss.Index:
        if self._search_index is None:
            assert self._index is not None
            index = self._index
            if self.use_gpu is not False and hasattr(faiss, "index_cpu_to_all_gpus") and faiss.get_num_gpus() > 0:
                index = faiss.index_cpu_to_all_gpus(index)
            self._search_index = index
        return self._search_index

    def search(
        self, vectors: np.ndarray, top_k: int, filters: Filters | None = None, *, payload: bool = True
    ) -> list[list[Hit]]:
        self._follow_writes()
        filters = validate_filters(filters)
        ranked = self._dense_ranked(vectors, top_k, filters, self._filtered_row_ids(filters) if filters else None)
        docs = self._rows({r for row in ranked for r, _ in row}, payload=payload)
        return [docstore.hits(row, docs, top_k) for row in ranked]

    def _dense_ranked(
        self, vectors: np.ndarray, top_k: int, filters: Filters | None, allowed: np.ndarray | None
    ) -> list[list[tuple[int, float]]]:
        """Each vector's nearest (row id, score), best first: ``top_k`` plus as many as the index holds
        tombstones (removed rows an HNSW index still returns; the caller drops them)."""
        if self._index is None:
            self.require_manifest()
        assert self._index is not None
        if top_k < 1:
            raise InputError(f"top_k must be >= 1, got {top_k}")
        vectors = np.ascontiguousarray(np.atleast_2d(vectors), dtype=np.float32)
        manifest = self._current_manifest()
        if vectors.shape[1] != manifest.dim:
            raise InputError(f"query vectors have {vectors.shape[1]} dims; the store holds {manifest.dim}")
        if len(vectors) == 0 or self._index.ntotal == 0:
            return [[] for _ in range(len(vectors))]
        if quantization(manifest_config(manifest.index)) != "none":
            return self._rescored(vectors, top_k, manifest, filters, allowed)
        k = min(top_k + self._current_tombstones(), self._index.ntotal)
        params = search_params(self._index, manifest_config(manifest.index), allowed if filters else None)
        if params is False:
            return [[] for _ in range(len(vectors))]
        scores, ids = search_with(self._searchable() if params is None else self._index, vectors, k, params)
        return [
            [(int(r), float(s)) for r, s in zip(row_ids, row_scores, strict=True) if r >= 0]
            for row_scores, row_ids in zip(scores, ids, strict=True)
        ]

    def _rescored(
        self, vectors: np.ndarray, top_k: int, manifest: Manifest, filters: Filters | None, allowed: np.ndarray | None
    ) -> list[list[tuple[int, float]]]:
        """Quantized stores: ``top_k x oversample`` candidates from the codes, re-scored with exact inner products
        from vectors.f32, best ``top_k`` (plus tombstones) returned. The scores are exact cosines."""
        assert self._index is not None
        tombstones = self._current_tombstones()
        want = top_k + tombstones
        oversample = float(self.oversample if self.oversample is not None else manifest.index.get("oversample", 1.0))
        if filters and not takes_search_params(inner_index(self._index)):
            # Sign-bit and flat PQ codes take no id selector: the matching rows are scored exactly instead
            # (cost grows with the number of matches, not with the store).
            assert allowed is not None
            candidates = [allowed] * len(vectors)
        else:
            k = rescoring.candidates_wanted(top_k, tombstones, oversample, self._index.ntotal)
            params = search_params(self._index, manifest_config(manifest.index), allowed if filters else None)
            if params is False:
                return [[] for _ in range(len(vectors))]
            _, ids = search_with(self._index, vectors, k, params)
            candidates = [row[row >= 0] for row in ids]
        return rescoring.rescore(vectors, candidates, self._full_vectors, want)

    def _filtered_row_ids(self, filters: Filters) -> np.ndarray:
        db = self._require_db()
        with self._lock:
            return docstore.filtered_row_ids(db, filters)

    def _rows(self, row_ids: set[int], payload: bool = True) -> dict[int, Document]:
        """Stored documents by row id; without ``payload``, their ids alone (no text, no metadata parsing)."""
        db = self._require_db()
        with self._lock:
            return docstore.documents_by_row(db, row_ids, payload)

    def get(self, ids: Sequence[str]) -> list[Document | None]:
        db = self._require_db()
        ids = list(ids)
        with self._lock:
            found = docstore.documents_by_id(db, ids)
        return [found.get(i) for i in ids]

    def iter_documents(self, batch: int = 1000) -> Iterator[Document]:
        """All live documents in row order (adapters use this to list a store)."""
        db = self._require_db()
        last = -1
        while True:
            with self._lock:
                rows = docstore.page(db, last, batch)
            if not rows:
                return
            for _rid, doc in rows:
                yield doc
            last = rows[-1][0]

    def verify(self) -> int:
        """Read everything: the manifest's own checksum, every file's (unless a writer killed after its commit left
        them describing the version before: the next write records them again), SQLite integrity,
        the delta, the id sets of index and docstore, each row's content hash and each vector's norm."""
        manifest = self.require_manifest()
        db = self._require_db()
        if self._session is not None:
            raise StoreError(f"{self.describe()}: a write is in progress; verify after it")
        with self._lock:
            # The manifest first (its fields were typed on open; here its bytes), then every file against it.
            integrity.check_manifest(self.path / MANIFEST)
            integrity.check_files(self.path, manifest, journal.read_meta(db, self.path))
            rows = docstore.read_all(db, self.path / DOCSTORE)
            if len(rows) != self._count:
                raise StoreError(
                    f"{self.path}: count mismatch: the store records {self._count} documents, "
                    f"the docstore has {len(rows)}"
                )
            docstore.check_content(rows, self.path / DOCSTORE)
            assert self._index is not None
            in_index = index_ids(self._index)
            quantized = quantization(manifest_config(manifest.index)) != "none"
            if quantized:  # every row's rescoring vector is there (norms below)
                self._check_vectors_file(self._read_folder, in_index)
            in_docstore = np.fromiter((r for r, *_ in rows), dtype=np.int64, count=len(rows))
            missing = np.setdiff1d(in_docstore, in_index)
            if len(missing) or len(in_index) != len(np.unique(in_index)):
                raise StoreError(
                    f"{self.path / INDEX}: {len(missing)} documents have no vector or vectors repeat "
                    "an id; the store is corrupted"
                )
            if len(rows):
                vectors = [v for v in self.vectors([r[1] for r in rows]) if v is not None]
                if len(vectors) != len(rows):  # the id sets matched above: a row without a vector is corruption
                    raise StoreError(
                        f"{self.path / INDEX}: {len(rows) - len(vectors)} documents have no vector; "
                        "the store is corrupted"
                    )
                # The norms the store's model promises (its manifest's metric): unit for cosine, at most 1 for a
                # model that cuts normalised vectors (the authors' released models).
                contract = VectorContract.for_metric(manifest.metric)
                bad = contract.bad_norms(np.linalg.norm(np.stack(vectors), axis=1))
                if bad.any():
                    raise StoreError(
                        f"{self.path / INDEX}: {int(bad.sum())} vectors are not {contract.describe_norms()} as its "
                        f"{manifest.metric} model's are (first: {rows[int(np.argmax(bad))][1]!r}); the file is "
                        "corrupted"
                    )
        return len(rows)

    def footprint(self) -> dict[str, Any]:
        """Quantization and bytes per live document: in RAM (the index searched: vectors or codes, delta
        included) and on disk (every file of the store, the docstore's text and the rescoring vectors included)."""
        manifest = self.require_manifest()
        folder = self._read_folder
        sizes = {p.name: p.stat().st_size for p in folder.iterdir() if p.is_file()}
        ram = sizes.get(INDEX, 0) + sizes.get(DELTA, 0)
        count = max(self._count, 1)
        quantize = quantization(manifest_config(manifest.index))
        return {
            "quantize": quantize,
            "oversample": manifest.index.get("oversample") if quantize != "none" else None,
            "ram_bytes_per_doc": round(ram / count, 1),
            "disk_bytes_per_doc": round(sum(sizes.values()) / count, 1),
        }

    def close(self) -> None:
        """Close the docstore; a writer that did not finalize keeps its checkpoint for the next run."""
        with self._lock:
            session, self._session = self._session, None
            if session is not None:
                session.close()
            if self._read_db is not None:
                self._read_db.close()
                self._read_db = None
            self._writer_lock.release()
