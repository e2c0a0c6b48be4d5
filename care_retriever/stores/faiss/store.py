"""FaissStore: the embedded default store (layout of its folder: the package docstring).

Vectors are as the store's model gives them (:mod:`care_retriever.vectors`): unit-norm for a cosine model, so
inner product is cosine; cut without renormalising for a dot-product model. Two write paths share one writer lock:

* Bulk (``prepare`` / ``commit`` / ``finalize``, used by ``care-retriever index``): writes go to a
  staging folder beside ``DIR`` (checkpointed by :meth:`commit`); :meth:`finalize` swaps it into
  place, so readers never see a half-written store, and a killed writer resumes from its last checkpoint.
* Small (:meth:`transaction` on a published store, used by the framework adapters): rows are written
  in place in the docstore (through SQLite's write-ahead log, folded at the commit: ``docstore_pages``), vectors
  appended to ``vectors.delta`` (``journal``); the SQLite commit, which also records the delta's committed
  length, is the commit point, so a write killed anywhere
  leaves either all or none of it (a delta tail past the committed length is ignored and cut by the
  next writer). Any other table in the docstore written in the same transaction commits with it.
  The delta is folded into ``index.faiss`` when it grows past half of it (amortised cost per write).

Opening checks sizes, headers and counts only (:mod:`~care_retriever.stores.faiss.opening`); ``care-retriever
verify`` reads every byte. Reads are :mod:`~care_retriever.stores.faiss.reading`, the writes of both paths
:mod:`~care_retriever.stores.faiss.writing`; this module opens the folder, starts or resumes the bulk write's
staging copy, verifies and closes.

One writer at a time: :meth:`prepare` takes an exclusive lock on ``.DIR.lock`` beside the store (released by
the OS if the writer dies), so two indexing runs into one store fail fast instead of mixing their checkpoints.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from care_retriever import faults, paths
from care_retriever.errors import StoreError
from care_retriever.stores.base import Manifest, check_metric, default_versions
from care_retriever.stores.config import FaissIndexConfig
from care_retriever.stores.faiss import docstore, files, integrity, journal, pending, rescoring, sparse
from care_retriever.stores.faiss.field_index import FieldIndexes
from care_retriever.stores.faiss.files import DELTA, DOCSTORE, INDEX, MANIFEST, VECTORS
from care_retriever.stores.faiss.index_factory import (
    IdOrder,
    IndexOptions,
    build_index,
    checked_options,
    index_ids,
    manifest_config,
    quantization,
)
from care_retriever.stores.faiss.reading import Reading
from care_retriever.stores.faiss.session import InPlaceWrite, StagedWrite, read_staged_manifest
from care_retriever.stores.faiss.writing import Writing
from care_retriever.stores.runs import RunTag
from care_retriever.vectors import VectorContract


class FaissStore(Reading, Writing):
    """FAISS + SQLite store in a folder. Safe for concurrent searches from many threads."""

    backend = "faiss"
    stages_bulk_writes = True
    keeps_checksums = True

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
        self._vector_file = rescoring.VectorFile()  # vectors.f32 read by row ids
        self._read_folder = self.path  # the published folder opened (the previous version's, mid-swap)
        self.manifest: Manifest | None = None
        self._read_index: faiss.Index | None = None
        self._read_db: sqlite3.Connection | None = None
        self._search_index: faiss.Index | None = None  # the index searched now (on a GPU where there is one)
        self._count = 0
        self._tombstones = 0
        self._opened_as: tuple[int, int] = (0, 0)  # (inode of index.faiss, committed delta bytes) at open
        self._mapped = False  # index vectors memory-mapped from index.faiss (read-only)
        self._id_order: IdOrder | None = None  # where each id of the index read now sits, for vectors() and scans
        self._bm25 = sparse.Scorer()  # the query side of the BM25 index, kept across searches
        self._field_indexes: FieldIndexes | None = None  # the filtered fields' indexes on the docstore connection
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

    def claim_run(self, run: RunTag) -> None:
        self._claimed_run = run

    def pending_run(self) -> str | None:
        """Another run's staged write (or, while this object writes, its own once checkpointed), in one line."""
        mine = isinstance(self._session, StagedWrite)
        if not (self.staging / MANIFEST).exists() or (mine and not self._checkpointed):
            return None
        return pending.line(self.describe(), self.staging, published=self.published())

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
        staged_run = pending.read_tag(self.staging)
        if not run.same_run(staged_run):
            raise pending.refusal(
                self.describe(), self.staging, why=run.difference(staged_run), published=self.published()
            )
        staged = read_staged_manifest(self.staging)
        if staged.space_fingerprint != space_fingerprint or staged.dim != dim:
            raise pending.refusal(
                self.describe(), self.staging, why="it was written by another model", published=self.published()
            )
        session = StagedWrite(self.staging)
        try:
            session.reconcile()
        except BaseException:
            session.close()
            raise
        return session

    def verify(self, *, record_checksums: bool = False) -> int:
        """Read everything: the manifest's own checksum, every file's, SQLite integrity, the delta, the id sets of
        index and docstore, each row's content hash and each vector's norm.

        Checksums that describe the version before the last write (its writer stopped between its commit and its
        manifest) cannot vouch for the files that write changed: after every other check, a :class:`StoreError`
        names them, unless ``record_checksums``, which records the checksums of the files as they are (a write
        of this store's writer, under its lock) and checks them again."""
        unchecked = self._verify_all_but_stale_checksums()
        if not unchecked:
            return self._count
        if not record_checksums:
            raise StoreError(
                f"{self.path / MANIFEST}: not checked: {', '.join(unchecked)} (their checksums describe the "
                "version before the last write, whose writer stopped before recording them); every other check "
                f"passed; 'care-retriever verify --store {self.describe()} --record-checksums' records them for "
                "the files as they are (so does the next write)"
            )
        with self.transaction():  # an empty write: it records every stale checksum (integrity.reseal_if_stale)
            pass
        left = self._verify_all_but_stale_checksums()
        if left:  # another writer stopped meanwhile: say so rather than loop
            raise StoreError(f"{self.path / MANIFEST}: not checked: {', '.join(left)}; run verify again")
        return self._count

    def _verify_all_but_stale_checksums(self) -> list[str]:
        """Every check of :meth:`verify`; returns the files whose checksums could not be checked."""
        manifest = self.require_manifest()
        db = self._require_db()
        if self._session is not None:
            raise StoreError(f"{self.describe()}: a write is in progress; verify after it")
        with self._lock:
            # The manifest first (its fields were typed on open; here its bytes), then every file against it.
            integrity.check_manifest(self.path / MANIFEST)
            unchecked = integrity.check_files(self.path, manifest, journal.read_meta(db, self.path))
            assert self._index is not None
            in_index = index_ids(self._index)
            if quantization(manifest_config(manifest.index)) != "none":  # every row's rescoring vector is there
                self._check_vectors_file(self._read_folder, in_index)
            # The rows a block at a time (a store of any size is checked in bounded memory): each row's content
            # hash, its vector, and the norm the store's model promises (its manifest's metric): unit for cosine, at
            # most 1 for a model that cuts normalised vectors (the authors' released models).
            contract = VectorContract.for_metric(manifest.metric)
            in_docstore: list[np.ndarray] = []
            for rows in docstore.read_blocks(db, self.path / DOCSTORE):
                docstore.check_content(rows, self.path / DOCSTORE)
                in_docstore.append(np.fromiter((r for r, *_ in rows), dtype=np.int64, count=len(rows)))
                vectors = [v for v in self.vectors([r[1] for r in rows]) if v is not None]
                if len(vectors) != len(rows):
                    raise StoreError(
                        f"{self.path / INDEX}: {len(rows) - len(vectors)} documents have no vector; "
                        "the store is corrupted"
                    )
                bad = contract.bad_norms(np.linalg.norm(np.stack(vectors), axis=1))
                if bad.any():
                    raise StoreError(
                        f"{self.path / INDEX}: {int(bad.sum())} vectors are not {contract.describe_norms()} as its "
                        f"{manifest.metric} model's are (first: {rows[int(np.argmax(bad))][1]!r}); the file is "
                        "corrupted"
                    )
            stored = np.concatenate(in_docstore) if in_docstore else np.zeros(0, dtype=np.int64)
            if len(stored) != self._count:
                raise StoreError(
                    f"{self.path}: count mismatch: the store records {self._count} documents, "
                    f"the docstore has {len(stored)}"
                )
            missing = np.setdiff1d(stored, in_index)
            if len(missing) or len(in_index) != len(np.unique(in_index)):
                raise StoreError(
                    f"{self.path / INDEX}: {len(missing)} documents have no vector or vectors repeat "
                    "an id; the store is corrupted"
                )
        return unchecked

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
