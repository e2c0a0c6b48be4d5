"""Writing a FAISS store: a transaction in place on a published store (``begin``), the writes of either mode
(upsert, delete, the BM25 side), their commit, publish or abort, and a file-system fault ended in one line.

A mixin of :class:`~care_retriever.stores.faiss.store.FaissStore`: the state of the write open now lives in its
session (:mod:`~care_retriever.stores.faiss.session`); the bulk write's staging copy is started and resumed by
the store's ``prepare``.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator, Sequence

import numpy as np

import care_retriever.faults as faults
from care_retriever.documents import Document, check_metadata_keys
from care_retriever.errors import InputError, StoreError, WriteError
from care_retriever.stores.base import STORE_FORMAT_VERSION, LocalFootprint
from care_retriever.stores.config import FaissIndexConfig, Quantize
from care_retriever.stores.faiss import files, integrity, journal, pending, sparse
from care_retriever.stores.faiss.files import INDEX, MANIFEST
from care_retriever.stores.faiss.index_factory import (
    IndexOptions,
    build_index,
    checked_options,
    manifest_config,
    quantization,
    vectors_to_train,
)
from care_retriever.stores.faiss.opening import OpenedVersion
from care_retriever.stores.faiss.session import InPlaceWrite, StagedWrite


class Writing(OpenedVersion):
    """The write side of a FaissStore: one write at a time, under the store's writer lock."""

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
                raise pending.refusal(self.describe(), self.staging, published=self.published())
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

    def vectors_to_train(self, dim: int, index: IndexOptions = None) -> int:
        """What the first batch of a new store's index must hold to train it (an empty index built to ask)."""
        if not self.trains_on_first_vectors(index):
            return 0
        return vectors_to_train(build_index(dim, checked_options(index)))

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
        check_metadata_keys(documents)
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
        if isinstance(session, StagedWrite):  # rows held for a training sample that never filled
            with self._lock, self._write_faults(session, "the index's training"):
                session.train_held()
        self.commit()
        with self._lock:
            if isinstance(session, InPlaceWrite):
                session.close()
                self._session = None
                self._vector_file.forget()  # reopened on the next search: the file may have grown
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
