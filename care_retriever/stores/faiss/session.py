"""The write sessions of a FaissStore: one object per write mode, each owning the state only that mode needs.

* :class:`StagedWrite` (``prepare``, used by ``care-retriever index``): the next version of the store built in
  the staging folder beside it, with an index, a docstore connection and a manifest of its own; :meth:`commit`
  checkpoints it, :meth:`publish` swaps it into place, :meth:`abort` discards it, :meth:`close` keeps the last
  checkpoint for the next run.
* :class:`InPlaceWrite` (``transaction`` on a published store): writes the published index and docstore the
  store reads; it owns this transaction's delta records, and :meth:`commit` is the journal's commit point.

The store holds the read state (the published version it serves) and at most one session at a time; a
session is dropped when its write ends, so nothing of one write reaches the next.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Sequence
from pathlib import Path

import faiss
import numpy as np

from care_retriever.documents import Document
from care_retriever.errors import StoreError
from care_retriever.stores.base import Manifest
from care_retriever.stores.faiss import docstore, docstore_pages, files, integrity, journal, rescoring, sparse
from care_retriever.stores.faiss.files import DELTA, DOCSTORE, INDEX, MANIFEST, VECTORS
from care_retriever.stores.faiss.index_factory import (
    index_ids,
    manifest_config,
    quantization,
    supports_remove,
    train_on_first_batch,
)
from care_retriever.stores.faiss.pending import RUN


def read_staged_manifest(folder: Path) -> Manifest:
    """The manifest of the checkpoint in the staging ``folder`` (its errors name the folder to remove)."""
    return files.read_manifest(folder / MANIFEST, checkpoint_of=folder)


class WriteSession:
    """What both write modes share: the index, docstore and manifest written, and the numbering of new rows."""

    def __init__(
        self, folder: Path, manifest: Manifest, index: faiss.Index, db: sqlite3.Connection, count: int, tombstones: int
    ) -> None:
        self.folder = folder  # where vectors.f32 rows are written
        self.manifest = manifest  # the manifest of the version being written
        self.index = index
        self.db = db
        self.count = count  # live documents, this write's changes included
        self.tombstones = tombstones  # removed rows an HNSW index still holds
        ids = index_ids(index)
        # Row ids are never reused: past both the docstore's and the index's (a killed writer may leave either ahead).
        self.next_row_id = max(docstore.max_row_id(db), int(ids.max()) if len(ids) else -1) + 1
        self.vector_writer = rescoring.VectorWriter()  # quantized stores: vectors.f32 rows at their offsets
        if quantization(manifest_config(manifest.index)) != "none":
            self.vector_writer.open(folder)
        # A new index given a training sample size holds its first rows (never more than the sample and one batch)
        # until the sample is full, then trains on it and adds them; every later batch is added as it comes.
        self.train_size = manifest_config(manifest.index).train_size
        self.held: list[tuple[np.ndarray, np.ndarray]] = []  # (row ids, vectors) waiting for the training

    def upsert(
        self, documents: Sequence[Document], vectors: np.ndarray, sparse_tokens: Sequence[list[str]] | None
    ) -> None:
        """Replace the documents stored under the ids of ``documents`` (vectors already checked)."""
        removed = self._remove_rows([d.id for d in documents])
        row_ids = np.arange(self.next_row_id, self.next_row_id + len(documents), dtype=np.int64)
        self.next_row_id += len(documents)
        docstore.insert(self.db, row_ids.tolist(), documents)
        if self.manifest.sparse:  # the BM25 side, in the same SQLite transaction
            sparse.add(self.db, row_ids.tolist(), documents, sparse_tokens)
        # Quantized stores: full-precision rows at their offsets, made durable by commit().
        self.vector_writer.write(int(row_ids[0]), vectors)
        self._add(row_ids, vectors)
        self._record(journal.ADD, row_ids, vectors)
        self.count += len(documents) - removed

    def _add(self, row_ids: np.ndarray, vectors: np.ndarray) -> None:
        """Add a batch to the index: trained on it if it is the first, or held while a training sample fills."""
        if self.train_size is None or (self.index.is_trained and not self.held):
            train_on_first_batch(self.index, vectors)
            self.index.add_with_ids(vectors, row_ids)
            return
        self.held.append((row_ids, vectors))
        if sum(len(v) for _, v in self.held) >= self.train_size:
            self.train_held()

    def train_held(self) -> None:
        """Train the index on the rows held (the first ``train_size`` of them) and add them: when the sample is
        full, or when the write is published with fewer rows (too few to train on is one line)."""
        if not self.held:
            return
        rows = np.concatenate([r for r, _ in self.held])
        vectors = np.concatenate([v for _, v in self.held])  # at most the sample and one batch
        self.held = []
        assert self.train_size is not None
        train_on_first_batch(self.index, vectors[: self.train_size])
        self.index.add_with_ids(vectors, rows)

    def delete(self, ids: Sequence[str]) -> int:
        removed = self._remove_rows(ids)
        self.count -= removed
        return removed

    def _remove_rows(self, ids: Sequence[str]) -> int:
        existing = list(docstore.row_ids(self.db, ids).values())
        if not existing:
            return 0
        docstore.delete_rows(self.db, existing)
        if self.manifest.sparse:
            sparse.remove(self.db, existing)
        # HNSW cannot remove vectors: they stay as tombstones that searches skip.
        rows = np.asarray(existing, dtype=np.int64)
        self.held = [(r[keep], v[keep]) for r, v in self.held if (keep := ~np.isin(r, rows)).any()]
        if supports_remove(manifest_config(self.manifest.index)):
            self.index.remove_ids(rows)
        else:
            self.tombstones += len(rows)
        self._record(journal.REMOVE, rows, None)
        return len(existing)

    def _record(self, op: int, rows: np.ndarray, vectors: np.ndarray | None) -> None:
        """A change to remember beyond the index and docstore (nothing: a bulk write checkpoints the whole index)."""

    def close(self) -> None:
        """Release what the session holds open without committing anything."""
        self.vector_writer.close()


class StagedWrite(WriteSession):
    """A bulk write into the staging folder: a checkpoint there is resumed by the next run if this one dies."""

    def __init__(self, folder: Path) -> None:
        manifest = read_staged_manifest(folder)
        try:
            index = faiss.read_index(str(folder / INDEX))
        except RuntimeError as exc:
            first = str(exc).splitlines()[0]
            raise StoreError(f"{folder / INDEX}: corrupted checkpoint ({first}); remove {folder}") from exc
        db = docstore.connect(folder / DOCSTORE)
        try:
            count = docstore.count(db)
            super().__init__(folder, manifest, index, db, count, int(index.ntotal) - count)
        except sqlite3.DatabaseError as exc:
            db.close()
            raise StoreError(f"{folder / DOCSTORE}: corrupted checkpoint ({exc}); remove {folder}") from exc

    def reconcile(self) -> None:
        """Continue a writer that was killed between the docstore's commit and the index's checkpoint: vectors
        without a row are removed, rows without a vector dropped (the writer encodes them again)."""
        stored_ids = set(index_ids(self.index).tolist())
        row_ids = docstore.all_row_ids(self.db)
        orphans = stored_ids - row_ids
        if orphans and supports_remove(manifest_config(self.manifest.index)):
            self.index.remove_ids(np.fromiter(orphans, dtype=np.int64))
        missing = row_ids - stored_ids
        if missing:
            docstore.delete_rows(self.db, sorted(missing))
            if self.manifest.sparse:
                sparse.remove(self.db, sorted(missing))
            self.db.commit()
        self.count = docstore.count(self.db)
        self.tombstones = int(self.index.ntotal) - self.count

    def commit(self) -> None:
        """Checkpoint: docstore transaction first, then the index, each durable and atomic."""
        self.vector_writer.sync()  # every row the docstore commits has its vector on disk
        self.db.commit()
        files.write_index_atomic(self.index, self.folder / INDEX)
        self.count = docstore.count(self.db)
        # rows held for the training are in the docstore, not yet in the index (a resumed run writes them again)
        self.tombstones = int(self.index.ntotal) + sum(len(r) for r, _ in self.held) - self.count
        journal.start_meta(self.db, self.folder / INDEX, self.count, self.tombstones)
        self.manifest.count = self.count
        self.manifest.index["tombstones"] = self.tombstones
        files.write_manifest(self.folder, self.manifest)

    def publish(self, path: Path) -> None:
        """Seal the committed checkpoint and swap it into place at ``path``."""
        self.vector_writer.close()
        self.db.close()  # the last connection's close folds any WAL into the file: hash the final bytes
        integrity.seal_staged(self.folder, self.manifest)
        files.publish(self.folder, path)
        # the staging folder's run tag is not part of the store (a kill just before this leaves it there, unread)
        files.remove_quietly(path / RUN)

    def abort(self) -> None:
        """Drop the staging folder, checkpoints included."""
        self.vector_writer.close()
        with contextlib.suppress(sqlite3.ProgrammingError):  # closed already by a publish that failed later
            self.db.rollback()
        self.db.close()
        files.discard(self.folder)

    def close(self) -> None:
        """Keep the last checkpoint for the next run; what was written after it is dropped."""
        super().close()
        self.db.close()


class InPlaceWrite(WriteSession):
    """A small write into the published store: rows in its docstore (SQLite, committed through its write-ahead
    log, which the commit's checksums read and fold: :mod:`docstore_pages`), vectors in its delta."""

    def __init__(
        self,
        folder: Path,
        manifest: Manifest,
        index: faiss.Index,
        db: sqlite3.Connection,
        count: int,
        tombstones: int,
        opened_as: tuple[int, int],
    ) -> None:
        super().__init__(folder, manifest, index, db, count, tombstones)
        self.opened_as = opened_as  # (inode of index.faiss, committed delta bytes) as of the last commit
        self.delta: list[np.ndarray] = []  # delta records since the last commit, appended by commit()
        # What this write changes, for the checksums its commit records (integrity.seal): the first row it writes
        # in vectors.f32, and the journal's count of committed writes.
        self.first_row = self.next_row_id
        self.writes = int(journal.read_meta(db, folder).get("writes", 0))

    def _record(self, op: int, rows: np.ndarray, vectors: np.ndarray | None) -> None:
        self.delta.append(journal.records(op, rows, vectors, self.manifest.dim))

    def _log_pages(self) -> None:
        """Before a transaction's first change: the docstore logs its pages, which the commit's checksums read."""
        if not self.db.in_transaction:
            docstore_pages.enter_wal(self.db)

    def upsert(
        self, documents: Sequence[Document], vectors: np.ndarray, sparse_tokens: Sequence[list[str]] | None
    ) -> None:
        self._log_pages()
        super().upsert(documents, vectors, sparse_tokens)

    def delete(self, ids: Sequence[str]) -> int:
        self._log_pages()
        return super().delete(ids)

    def commit(self) -> tuple[int, int]:
        """Append the delta, then commit the docstore with the delta's new length (the commit point); returns
        (inode of index.faiss, committed delta bytes) as it leaves them (a fold makes a new index.faiss)."""
        self._log_pages()
        self.train_held()
        committed = self.opened_as[1]
        self.vector_writer.sync()  # the rows' full vectors are durable before the commit point
        if self.delta:
            committed = journal.append(self.folder, committed, np.concatenate(self.delta).tobytes())
        self.writes += 1  # every commit changes the journal's meta: the manifest's checksums then describe it
        journal.set_meta(
            self.db, count=self.count, tombstones=self.tombstones, delta_bytes=committed, writes=self.writes
        )
        self.db.commit()
        self.delta = []
        start = self.opened_as[1]
        self.opened_as = (self.opened_as[0], committed)
        self.manifest.count = self.count
        self.manifest.index["tombstones"] = self.tombstones
        written = {DOCSTORE: 0, DELTA: start, VECTORS: self.first_row * 4 * self.manifest.dim}
        if journal.needs_fold(self.folder, committed):
            self.opened_as = (journal.fold(self.db, self.index, self.folder), 0)
            written.update({INDEX: 0, DELTA: 0})
        # The checksums and sizes of what this write changed, and the counts (the docstore's are the truth).
        integrity.seal_published(self.db, self.folder, self.manifest, written)
        self.first_row = self.next_row_id
        return self.opened_as

    def abort(self) -> None:
        """Roll the docstore back; the store reopens the published files (the index in memory has the writes)."""
        self.vector_writer.close()
        self.db.rollback()
        self.delta = []
        with contextlib.suppress(sqlite3.OperationalError):  # a failed disk may refuse it: the next write retries
            docstore_pages.leave_wal(self.db)
