"""The embedded default store: a folder with a FAISS index, a SQLite docstore and a manifest.

Layout (also read by the Haystack and LangChain adapters)::

    DIR/manifest.json      Manifest: model fingerprint, dim, metric, count, index type, versions, checksums
    DIR/index.faiss        faiss.IndexIDMap (format 1: IndexIDMap2) over Flat (exact IP), HNSW or IVF; ids = row ids
    DIR/docstore.sqlite    documents(row_id INTEGER PRIMARY KEY, id TEXT UNIQUE, text, title, metadata JSON,
                           content_hash)

    DIR/vectors.delta      (format 2) vectors written in place since the last fold: fixed-size records
                           (op: 'A' add / 'D' delete, row id, vector), replayed on open
    DIR/vectors.f32        (format 3, index option ``quantize`` other than none) the full-precision vectors,
                           float32 at offset row id x 4 x dim, memory-mapped: index.faiss then holds compressed
                           codes (sq8, sign bits or PQ) and every search rescores its oversampled candidates
                           with exact inner products read from this file
    docstore care_meta     (format 2) count, tombstones, committed delta length, index.faiss size

Vectors are unit-norm, so inner product is cosine. Two write paths share one writer lock:

* Bulk (``prepare`` / ``commit`` / ``finalize``, used by ``care-retriever index``): writes go to a
  staging folder beside ``DIR`` (checkpointed by :meth:`commit`); :meth:`finalize` swaps it into
  place, so readers never see a half-written store, and a killed writer resumes from its last checkpoint.
* Small (:meth:`transaction` on a published store, used by the framework adapters): rows are written
  in place in the docstore (SQLite WAL), vectors appended to ``vectors.delta``; the SQLite commit,
  which also records the delta's committed length, is the commit point, so a write killed anywhere
  leaves either all or none of it (a delta tail past the committed length is ignored and cut by the
  next writer). Any other table in the docstore written in the same transaction commits with it.
  The delta is folded into ``index.faiss`` when it grows past half of it (amortised cost per write).

Opening checks sizes, headers and counts only; ``care-retriever verify`` reads every byte. One writer at a time:
:meth:`prepare` takes an exclusive lock on ``.DIR.lock`` beside the store (released by the OS if the
writer dies), so two indexing runs into one store fail fast instead of mixing their checkpoints.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import faiss
import numpy as np
from tqdm.auto import tqdm

from care_retriever.corpus import Document
from care_retriever.errors import InputError, StoreError
from care_retriever.sparse.fusion import FUSIONS, FusionConfig, fuse
from care_retriever.sparse.sqlite_bm25 import SqliteBM25
from care_retriever.stores.base import (
    FAISS_INDEX_TYPES,
    STORE_FORMAT_VERSION,
    Filters,
    Hit,
    Manifest,
    VectorStore,
    default_versions,
    validate_filters,
)

MANIFEST = "manifest.json"
INDEX = "index.faiss"
DOCSTORE = "docstore.sqlite"
DELTA = "vectors.delta"
NEXT_INDEX = "index.faiss.next"  # a fold's new index, renamed over INDEX once the docstore records it
FOLD_MIN_BYTES = 4 << 20  # a delta smaller than this is never folded (replaying it costs little)
FOLD_RATIO = 0.5  # fold once the delta outgrows this fraction of index.faiss: amortised O(1) per written byte
INDEX_TYPES = FAISS_INDEX_TYPES
VECTORS = "vectors.f32"  # quantized stores: full-precision vectors by row id, the rescoring source
QUANTIZE = ("none", "sq8", "binary", "pq")
# Candidates taken from the codes per result wanted, by quantization (measured: docs/scale.md); a store's
# own value is kept in its manifest (index option "oversample") and FaissStore(oversample=...) overrides it.
DEFAULT_OVERSAMPLE = {"sq8": 4.0, "binary": 100.0, "pq": 50.0}
QUANTIZED_FORMAT_VERSION = 3
MIN_SQ_TRAIN = 256  # scalar codes take each dimension's range from the first batch: not from a handful of rows

_SCHEMA = """
CREATE TABLE IF NOT EXISTS documents (
    row_id INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    text TEXT NOT NULL,
    title TEXT NOT NULL DEFAULT '',
    metadata TEXT NOT NULL DEFAULT '{}',
    content_hash TEXT NOT NULL
);
"""
_META_SCHEMA = "CREATE TABLE IF NOT EXISTS care_meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)"
ADD, REMOVE = ord("A"), ord("D")


def delta_dtype(dim: int) -> np.dtype:
    """One delta record: op byte, row id, vector (a removal carries a zero vector: fixed-size records)."""
    return np.dtype([("op", "u1"), ("row", "<i8"), ("vec", "<f4", (dim,))])


def _hits(ranked: Sequence[tuple[int, float]], docs: dict[int, Document], limit: int) -> list[Hit]:
    """Hits for ranked (row id, score) pairs, at most ``limit``; rows gone from the docstore are left out."""
    hits = []
    for row_id, score in ranked:
        if (doc := docs.get(row_id)) is not None:
            hits.append(Hit(id=doc.id, score=score, text=doc.text, title=doc.title, metadata=doc.metadata))
            if len(hits) == limit:
                break
    return hits


def _with_ties(ranked: list[tuple[int, float]], k: int) -> list[tuple[int, float]]:
    """The first ``k`` of a ranking and every later entry tied with the ``k``-th."""
    end = min(k, len(ranked))
    while 0 < end < len(ranked) and ranked[end][1] == ranked[k - 1][1]:
        end += 1
    return ranked[:end]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as fh:
        os.fsync(fh.fileno())


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def quantization(options: dict[str, Any]) -> str:
    """The store's code kind: "none" (the index holds the vectors) or sq8 / binary / pq (codes + vectors.f32)."""
    return str(options.get("quantize", "none"))


def _codes_index(dim: int, options: dict[str, Any]) -> faiss.Index:
    """The compressed index of a quantized store (rescored from vectors.f32 at search time)."""
    quantize, kind = quantization(options), options.get("type", "flat")
    sq8, m = faiss.ScalarQuantizer.QT_8bit, int(options.get("m", 32))
    pq_m, bits = int(options.get("pq_m", 96)), int(options.get("pq_bits", 8))
    if quantize == "pq" and dim % pq_m:
        raise InputError(f"quantize=pq: pq_m={pq_m} must divide the dimension {dim}")
    ip = faiss.METRIC_INNER_PRODUCT
    if quantize == "binary":
        # Sign bits, Hamming distance: IndexLSH without rotation or thresholds. Bits split at each dimension's
        # median of the first batch were measured too and kept less of the exact top 10 on the dev tasks
        # (docs/scale.md), so no training.
        return faiss.IndexIDMap(faiss.IndexLSH(dim, dim, False, False))
    if kind == "ivf":
        nlist = int(options.get("nlist", 1024))
        if quantize == "sq8":
            return faiss.IndexIVFScalarQuantizer(faiss.IndexFlatIP(dim), dim, nlist, sq8, ip)
        return faiss.IndexIVFPQ(faiss.IndexFlatIP(dim), dim, nlist, pq_m, bits, ip)
    if kind == "hnsw":
        inner = faiss.IndexHNSWSQ(dim, sq8, m, ip) if quantize == "sq8" else faiss.IndexHNSWPQ(dim, pq_m, m, bits, ip)
        inner.hnsw.efConstruction = int(options.get("ef_construction", 200))
        return faiss.IndexIDMap(inner)
    return faiss.IndexIDMap(
        faiss.IndexScalarQuantizer(dim, sq8, ip) if quantize == "sq8" else faiss.IndexPQ(dim, pq_m, bits, ip)
    )


def build_index(dim: int, options: dict[str, Any]) -> faiss.Index:
    if quantization(options) != "none":
        return _codes_index(dim, options)
    kind = options.get("type", "flat")
    if kind == "flat":
        inner = faiss.IndexFlatIP(dim)
    elif kind == "hnsw":
        inner = faiss.IndexHNSWFlat(dim, int(options.get("m", 32)), faiss.METRIC_INNER_PRODUCT)
        inner.hnsw.efConstruction = int(options.get("ef_construction", 200))
    elif kind == "ivf":
        # IVF stores ids itself; wrapping it in IndexIDMap breaks remove_ids (ids get out of step).
        quantizer = faiss.IndexFlatIP(dim)
        return faiss.IndexIVFFlat(quantizer, dim, int(options.get("nlist", 1024)), faiss.METRIC_INNER_PRODUCT)
    elif kind == "ivfpq":
        # pq_m bytes per vector instead of 4*dim (96 B vs 3 KB at 768 dims): the 10M-100M regime (docs/scale.md).
        pq_m, bits = int(options.get("pq_m", 96)), int(options.get("pq_bits", 8))
        if dim % pq_m:
            raise InputError(f"ivfpq: pq_m={pq_m} must divide the dimension {dim}")
        quantizer = faiss.IndexFlatIP(dim)
        return faiss.IndexIVFPQ(quantizer, dim, int(options.get("nlist", 1024)), pq_m, bits, faiss.METRIC_INNER_PRODUCT)
    else:
        raise InputError(f"Unknown FAISS index type {kind!r}. Available index types: {list(INDEX_TYPES)}")
    # IndexIDMap, not IndexIDMap2: reading an IDMap2 rebuilds its id -> position hash map (about a second
    # per million vectors); stores of format 1 hold IDMap2 and are read as they are.
    return faiss.IndexIDMap(inner)


def _takes_search_params(inner: faiss.Index) -> bool:
    """Whether a search can pass this index an id selector (IndexLSH and IndexPQ refuse search parameters)."""
    return not isinstance(inner, (faiss.IndexLSH, faiss.IndexPQ))


def inner_index(index: faiss.Index) -> faiss.Index:
    """The index doing the search: the one under an IndexIDMap, or the index itself (IVF)."""
    return faiss.downcast_index(index.index) if hasattr(index, "id_map") else faiss.downcast_index(index)


def index_ids(index: faiss.Index) -> np.ndarray:
    """External ids of all vectors in ``index`` (row ids of the docstore, tombstones included)."""
    if index.ntotal == 0:
        return np.zeros(0, dtype=np.int64)
    if hasattr(index, "id_map"):
        return faiss.vector_to_array(index.id_map)
    ivf = faiss.extract_index_ivf(index)
    lists = ivf.invlists
    parts = [
        faiss.rev_swig_ptr(lists.get_ids(i), lists.list_size(i)).copy() for i in range(ivf.nlist) if lists.list_size(i)
    ]
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)


class FaissStore(VectorStore):
    """FAISS + SQLite store in a folder. Safe for concurrent searches from many threads."""

    backend = "faiss"

    def __init__(self, path: str | Path, *, use_gpu: bool | None = None, oversample: float | None = None) -> None:
        self.path = Path(path)
        self.staging = self.path.with_name(f".{self.path.name}.staging")
        self.use_gpu = use_gpu
        # Quantized stores: candidates taken from the codes per result wanted; None: the manifest's value.
        self.oversample = oversample
        self._vec_fd: int | None = None  # vectors.f32 of the folder being written (quantized stores)
        self._vecs: np.ndarray | None = None  # vectors.f32 memory-mapped read-only, rows = row ids
        self._vecs_folder: Path | None = None
        self._read_folder = self.path  # the published folder opened (the previous version's, mid-swap)
        self.manifest: Manifest | None = None
        self._index: faiss.Index | None = None
        self._search_index: faiss.Index | None = None
        self._db: sqlite3.Connection | None = None
        self._lock = threading.RLock()
        self._writing = False
        self._writer_lock: Any = None
        self._next_row_id = 0
        self._in_place = False  # a transaction writing the published store in place (delta + WAL)
        self._delta: list[np.ndarray] = []  # this transaction's delta records, appended at finalize
        self._count = 0
        self._tombstones = 0
        self._opened_as: tuple[int, int] = (0, 0)  # (inode of index.faiss, committed delta bytes) at open
        self._mapped = False  # index vectors memory-mapped from index.faiss (read-only)
        self._id_order: np.ndarray | None = None  # argsort of the IndexIDMap's ids, for vectors()
        self._bm25: SqliteBM25 | None = None  # the query side of the BM25 index, kept across searches
        old = self._old_path()
        if (self.path / MANIFEST).exists():
            self._open(self.path)
        elif self.path.exists() and any(self.path.iterdir()):
            raise StoreError(f"{self.path}: folder exists but is not a care-retriever FAISS store (no {MANIFEST})")
        elif not self.path.exists() and (old / MANIFEST).exists() and (self.staging / MANIFEST).exists():
            # A writer died between the two renames of finalize(): serve the previous version meanwhile;
            # running the writer again publishes the staged one.
            self._open(old)

    def describe(self) -> str:
        return f"faiss:{self.path}"

    def _old_path(self) -> Path:
        return self.path.with_name(f".{self.path.name}.old")

    @property
    def lock_path(self) -> Path:
        return self.path.with_name(f".{self.path.name}.lock")

    def _acquire_writer_lock(self) -> None:
        """Exclusive, non-blocking; held until finalize() or close(). A dead writer's lock is freed by the OS."""
        if self._writer_lock is not None:
            return
        try:
            import fcntl
        except ImportError:  # no flock (Windows): single-writer is then the caller's duty
            return
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.lock_path, "a+")  # noqa: SIM115 - held open while writing
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            fh.close()
            raise StoreError(
                f"{self.describe()}: another writer is indexing into this store (lock {self.lock_path}); "
                "wait for it to finish"
            ) from exc
        self._writer_lock = fh

    def _release_writer_lock(self) -> None:
        if self._writer_lock is not None:
            with contextlib.suppress(OSError):
                self._writer_lock.close()  # closing the file releases the flock
            self._writer_lock = None

    # ------------------------------------------------------------------ opening
    def _open(self, folder: Path, writable: bool = False) -> None:
        """Open a published store: sizes, headers and counts are checked; no file is hashed (see verify())."""
        manifest_path = folder / MANIFEST
        try:
            data = json.loads(manifest_path.read_text("utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise StoreError(f"{manifest_path}: unreadable manifest ({exc})") from exc
        self.manifest = Manifest.from_dict(data, str(manifest_path))
        for name in (INDEX, DOCSTORE):
            if not (folder / name).is_file():
                raise StoreError(f"{folder / name}: missing; the store is incomplete")
        if self._db is not None:
            self._db.close()
        self._db = self._connect(folder / DOCSTORE)
        meta = self._read_meta(folder)
        if meta.get("fold_pending") and (folder / NEXT_INDEX).exists():
            os.replace(folder / NEXT_INDEX, folder / INDEX)  # roll a fold forward: the docstore already counts it
        expected = meta.get("index_bytes", self.manifest.sizes.get(INDEX))
        for name, size in ((INDEX, expected), (DELTA, meta.get("delta_bytes"))):
            actual = (folder / name).stat().st_size if (folder / name).exists() else 0
            if size is not None and (actual != size if name == INDEX else actual < size):
                raise StoreError(
                    f"{folder / name}: size mismatch ({actual} bytes, the store recorded {size}); "
                    "the file is truncated or corrupted"
                )
        # With no delta to apply, flat vectors are memory-mapped (opening reads headers and ids, not every
        # vector); a mapped index is read-only, so the first write of a process reads it whole (_begin_in_place).
        self._mapped = not meta.get("delta_bytes") and not writable
        try:
            self._index = faiss.read_index(str(folder / INDEX), faiss.IO_FLAG_MMAP_IFC if self._mapped else 0)
        except RuntimeError as exc:
            raise StoreError(f"{folder / INDEX}: corrupted FAISS index ({str(exc).splitlines()[0]})") from exc
        self._id_order = None
        self._replay_delta(folder, 0, int(meta.get("delta_bytes", 0)))
        if "count" in meta:
            self._count, self._tombstones = int(meta["count"]), int(meta.get("tombstones", 0))
        else:  # format 1: the manifest holds the counts
            self._count = self.manifest.count
            self._tombstones = int(self.manifest.index.get("tombstones", 0))
        self._check_counts(folder)
        self._vecs, self._read_folder = None, folder
        if quantization(self.manifest.index) != "none":
            self._check_vectors_file(folder, index_ids(self._index))
        self._opened_as = ((folder / INDEX).stat().st_ino, int(meta.get("delta_bytes", 0)))
        self._search_index = None

    def _check_vectors_file(self, folder: Path, rows: np.ndarray) -> None:
        """A quantized store's rescoring vectors must exist and hold every row (never codes-only scores)."""
        assert self.manifest is not None
        path = folder / VECTORS
        if not path.is_file():
            raise StoreError(
                f"{path}: missing; this store keeps compressed codes ({quantization(self.manifest.index)}) and "
                "rescores every search from these full-precision vectors: restore the file or re-index"
            )
        size, row_bytes = path.stat().st_size, 4 * self.manifest.dim
        need = (int(rows.max()) + 1) * row_bytes if len(rows) else 0
        recorded = self.manifest.sizes.get(VECTORS)
        if size < need or (recorded is not None and size != recorded):
            raise StoreError(
                f"{path}: truncated ({size} bytes; the store's rows need {max(need, recorded or 0)}); "
                "restore the file or re-index"
            )

    def _full_vectors(self, rows: np.ndarray) -> np.ndarray:
        """Full-precision vectors of ``rows`` (row ids), read from the memory-mapped vectors.f32."""
        folder = self.staging if self._writing and not self._in_place else self._read_folder
        dim = (self._staged_manifest if self._writing else self.require_manifest()).dim
        top = int(rows.max()) if len(rows) else -1
        if self._vecs is None or self._vecs_folder != folder or top >= len(self._vecs):
            # (Re)mapped when rows were written past the mapped length (writes extend the file).
            count = (folder / VECTORS).stat().st_size // (4 * dim)
            self._vecs = (
                np.memmap(folder / VECTORS, dtype=np.float32, mode="r", shape=(count, dim))
                if count
                else np.zeros((0, dim), dtype=np.float32)
            )
            self._vecs_folder = folder
            if top >= count:
                raise StoreError(f"{folder / VECTORS}: row {top} is past the end of the file; the file is truncated")
        return np.asarray(self._vecs[rows])

    def _read_meta(self, folder: Path) -> dict[str, int]:
        assert self._db is not None
        try:
            return dict(self._db.execute("SELECT key, value FROM care_meta"))
        except sqlite3.OperationalError:  # format 1: no meta table
            return {}
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{folder / DOCSTORE}: corrupted docstore ({exc})") from exc

    def _replay_delta(self, folder: Path, start: int, stop: int) -> None:
        """Apply the committed delta records in ``[start, stop)`` bytes to the in-memory index."""
        if stop <= start:
            return
        assert self._index is not None and self.manifest is not None
        dtype = delta_dtype(self.manifest.dim)
        if (stop - start) % dtype.itemsize:
            raise StoreError(f"{folder / DELTA}: committed length {stop} is not a whole number of records")
        with open(folder / DELTA, "rb") as fh:
            fh.seek(start)
            records = np.frombuffer(fh.read(stop - start), dtype=dtype)
        if not np.isin(records["op"], (ADD, REMOVE)).all():
            raise StoreError(f"{folder / DELTA}: unknown record type; the file is corrupted")
        removable = self.manifest.index.get("type", "flat") != "hnsw"
        # Consecutive records of one kind are applied in one call (row ids are never reused).
        edges = np.flatnonzero(np.diff(records["op"])) + 1
        for run in np.split(records, edges):
            rows = np.ascontiguousarray(run["row"], dtype=np.int64)
            if run["op"][0] == ADD:
                self._index.add_with_ids(np.ascontiguousarray(run["vec"], dtype=np.float32), rows)
            elif removable:
                self._index.remove_ids(rows)

    def _connect(self, path: Path) -> sqlite3.Connection:
        try:
            db = sqlite3.connect(str(path), check_same_thread=False, isolation_level="DEFERRED")
            db.execute(_SCHEMA)
            db.execute("PRAGMA synchronous=FULL")
            return db
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{path}: corrupted docstore ({exc})") from exc

    def _check_counts(self, folder: Path) -> None:
        assert self._index is not None
        if self._index.ntotal != self._count + self._tombstones:
            raise StoreError(
                f"{folder}: count mismatch: the store records {self._count} documents and {self._tombstones} "
                f"tombstones, the index has {self._index.ntotal} vectors; the store is corrupted"
            )

    def _published_version(self) -> tuple[int, int, dict[str, int]]:
        """(inode of index.faiss, committed delta bytes, the journal's meta) as the last commit left them."""
        meta = self._read_meta(self.path)
        return (self.path / INDEX).stat().st_ino, int(meta.get("delta_bytes", 0)), meta

    def _follow_writes(self) -> None:
        """A reader catches up with what other processes committed since it opened: the in-memory FAISS index
        would otherwise miss rows the docstore and the BM25 side already hold (hybrid mixing two versions).

        Checked before each read (one stat, one SQLite read); a change observed is a reopen, not an in-place
        replay, so that no search ever runs on an index being added to. A fold in progress changes no row:
        the reader keeps its version until the fold is done; so does it while a re-index swaps the folder.
        """
        if self._writing or self._db is None or self._opened_as == (0, 0):
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
    def prepare(self, dim: int, space_fingerprint: str, model_name: str, index: dict[str, Any] | None = None) -> None:
        options = self._checked_options(index)
        if self.manifest is not None:
            self.check_compatible(space_fingerprint, dim)
            self._check_same_quantization(index)
        self._acquire_writer_lock()
        try:
            if (self.staging / MANIFEST).exists():
                self._resume_staging(dim, space_fingerprint)
            else:
                self._new_staging(dim, space_fingerprint, model_name, options, index)
        except BaseException:
            self._release_writer_lock()
            raise
        self._writing = True

    @staticmethod
    def _checked_options(index: dict[str, Any] | None) -> dict[str, Any]:
        options = {"type": "flat", **(index or {})}
        if options["type"] not in INDEX_TYPES:
            raise InputError(
                f"Unknown FAISS index type {options['type']!r}. Available index types: {list(INDEX_TYPES)}"
            )
        quantize = options.get("quantize")
        if quantize is not None and quantize not in QUANTIZE:
            raise InputError(f"Unknown FAISS quantize {quantize!r}. Available: {list(QUANTIZE)}")
        oversample = options.get("oversample")
        if oversample is not None and (
            isinstance(oversample, bool) or not isinstance(oversample, (int, float)) or not oversample >= 1
        ):
            raise InputError(f"oversample must be a number >= 1, got {oversample!r}")
        if quantize in (None, "none"):  # today's store (no key, no vector file, format 2), or keep the store's
            options.pop("quantize", None)
            if quantize == "none" or oversample is None:
                options.pop("oversample", None)
            return options
        if options["type"] == "ivfpq":
            raise InputError("index type ivfpq already stores PQ codes; use --index-type ivf --quantize pq to rescore")
        if quantize == "binary" and options["type"] != "flat":
            raise InputError(f"quantize=binary works with index type flat only, not {options['type']!r}")
        options["oversample"] = float(DEFAULT_OVERSAMPLE[quantize] if oversample is None else oversample)
        return options

    def _check_same_quantization(self, index: dict[str, Any] | None) -> None:
        """A store's quantization is fixed at creation: its codes were trained and written for it."""
        assert self.manifest is not None
        have = quantization(self.manifest.index)
        want = (index or {}).get("quantize")
        if want is not None and want != have:
            raise InputError(
                f"{self.describe()} is built with quantize={have}; the quantization of an existing store "
                f"cannot change: index into a new store with quantize={want}"
            )

    @property
    def pending_write(self) -> bool:
        """True while an interrupted bulk writer's checkpoint (a staging folder) waits to be resumed."""
        return (self.staging / MANIFEST).exists() and not self._writing

    def begin(self, dim: int, space_fingerprint: str, model_name: str, index: dict[str, Any] | None = None) -> None:
        """Start a :meth:`transaction`: in place on a published store, through a staging folder for a new one."""
        self._checked_options(index)
        if self.manifest is not None:
            self.check_compatible(space_fingerprint, dim)
            self._check_same_quantization(index)
        self._acquire_writer_lock()  # fails fast while another writer is running
        try:
            if self.pending_write:
                raise StoreError(
                    f"{self.describe()}: an interrupted `care-retriever index` run is pending in {self.staging}; "
                    "finish it by running the same command again, or remove that folder"
                )
            if (self.path / MANIFEST).exists() and self.manifest is not None:
                self._begin_in_place()
                return
        except BaseException:
            self._release_writer_lock()
            raise
        self.prepare(dim, space_fingerprint, model_name, index)

    def _begin_in_place(self) -> None:
        """Catch up with writes made by other processes since this one opened, then accept writes in place."""
        with self._lock:
            assert self._db is not None
            self._db.commit()
            inode, committed, meta = self._published_version()
            stale = inode != self._opened_as[0] or committed < self._opened_as[1] or meta.get("fold_pending")
            if stale or self._mapped:
                self._open(self.path, writable=True)  # republished or folded meanwhile, or mapped: read it whole
            elif committed > self._opened_as[1]:
                self._replay_delta(self.path, self._opened_as[1], committed)
                self._count, self._tombstones = int(meta["count"]), int(meta.get("tombstones", 0))
                self._opened_as = (inode, committed)
            assert self.manifest is not None and self._db is not None and self._index is not None
            if not meta:  # a format-1 store takes its first small write: it becomes format 2
                self._db.execute("PRAGMA journal_mode=WAL")
                self._start_meta(self.path / INDEX)
            if self.manifest.checksums or self.manifest.sizes:
                # Whole-file checksums stop describing the files once they change in place: drop them first,
                # so that no crash leaves a manifest whose checksums look like corruption.
                self.manifest.checksums, self.manifest.sizes = {}, {}
                self.manifest.format_version = max(self.manifest.format_version, STORE_FORMAT_VERSION)
                self._write_manifest(self.path, self.manifest)
            ids = index_ids(self._index)
            row = self._db.execute("SELECT MAX(row_id) FROM documents").fetchone()[0]
            self._next_row_id = max(row if row is not None else -1, int(ids.max()) if len(ids) else -1) + 1
            self._staged_manifest = self.manifest
            self._delta = []
            self._in_place = True
            self._writing = True
            self._open_vector_writer(self.path)

    def _open_vector_writer(self, folder: Path) -> None:
        """Quantized stores: open ``folder``'s vectors.f32 for writing rows at their offsets."""
        self._close_vector_writer()
        if quantization(self._staged_manifest.index) != "none":
            self._vec_fd = os.open(folder / VECTORS, os.O_RDWR | os.O_CREAT, 0o644)

    def _close_vector_writer(self) -> None:
        if self._vec_fd is not None:
            os.close(self._vec_fd)
            self._vec_fd = None

    def _start_meta(self, index_file: Path) -> None:
        """The journal's bookkeeping for ``index_file`` with nothing in the delta yet (committed)."""
        assert self._db is not None
        self._db.execute(_META_SCHEMA)
        self._set_meta(
            count=self._count,
            tombstones=self._tombstones,
            delta_bytes=0,
            fold_pending=0,
            index_bytes=index_file.stat().st_size,
        )
        self._db.commit()

    def _set_meta(self, **values: int) -> None:
        assert self._db is not None
        self._db.executemany("INSERT OR REPLACE INTO care_meta(key, value) VALUES (?, ?)", list(values.items()))

    @staticmethod
    def _write_manifest(folder: Path, manifest: Manifest) -> None:
        _write_atomic(folder / MANIFEST, json.dumps(manifest.to_dict(), indent=2).encode())
        _fsync_dir(folder)

    def _new_staging(
        self,
        dim: int,
        space_fingerprint: str,
        model_name: str,
        options: dict[str, Any],
        index: dict[str, Any] | None = None,
    ) -> None:
        """Start a write: a copy of the published store (or an empty index); its manifest is written last."""
        shutil.rmtree(self.staging, ignore_errors=True)
        self.staging.mkdir(parents=True)
        source = self.path if (self.path / MANIFEST).exists() else self._old_path()
        if self.manifest is not None:  # update an existing store: work on a copy
            if self._opened_as[1] and self._index is not None:  # a delta is applied in memory: write it out whole
                faiss.write_index(self._index, str(self.staging / INDEX))
            else:
                shutil.copy2(source / INDEX, self.staging / INDEX)
            _fsync_file(self.staging / INDEX)
            if (source / VECTORS).exists():
                shutil.copy2(source / VECTORS, self.staging / VECTORS)
                _fsync_file(self.staging / VECTORS)
            if self._db is not None:  # the backup API copies committed WAL pages too
                target = sqlite3.connect(str(self.staging / DOCSTORE))
                try:
                    self._db.backup(target)
                finally:
                    target.close()
            else:
                shutil.copy2(source / DOCSTORE, self.staging / DOCSTORE)
            _fsync_file(self.staging / DOCSTORE)
            manifest = Manifest.from_dict(self.manifest.to_dict(), MANIFEST)
            asked = (index or {}).get("oversample")  # a search setting: may change (the default does not reset it)
            if asked is not None and quantization(manifest.index) != "none":
                manifest.index["oversample"] = float(asked)
        else:
            manifest = Manifest(
                backend="faiss",
                dim=dim,
                space_fingerprint=space_fingerprint,
                model_name=model_name,
                index=options,
                versions=default_versions(faiss=faiss.__version__),
            )
            faiss.write_index(build_index(dim, options), str(self.staging / INDEX))
            _fsync_file(self.staging / INDEX)
            if quantization(options) != "none":
                manifest.format_version = QUANTIZED_FORMAT_VERSION
                (self.staging / VECTORS).touch()
                _fsync_file(self.staging / VECTORS)
        manifest.checksums, manifest.sizes = {}, {}
        # The staging manifest marks a complete starting point: a run killed before it exists starts over.
        _write_atomic(self.staging / MANIFEST, json.dumps(manifest.to_dict(), indent=2).encode())
        _fsync_dir(self.staging)
        self._open_staging()

    def _resume_staging(self, dim: int, space_fingerprint: str) -> None:
        """Continue a writer that was killed: reconcile the last checkpoint of index and docstore."""
        staged = self._read_staged_manifest()
        if staged.space_fingerprint != space_fingerprint or staged.dim != dim:
            raise StoreError(
                f"{self.staging}: an interrupted write by another model is pending; remove that folder to start over"
            )
        self._open_staging()
        assert self._index is not None and self._db is not None
        stored_ids = set(index_ids(self._index).tolist())
        row_ids = {r for (r,) in self._db.execute("SELECT row_id FROM documents")}
        orphans = stored_ids - row_ids
        if orphans and self._supports_remove():
            self._index.remove_ids(np.fromiter(orphans, dtype=np.int64))
        missing = row_ids - stored_ids
        if missing:
            self._db.executemany("DELETE FROM documents WHERE row_id = ?", [(r,) for r in missing])
            if self._staged_manifest.sparse:
                SqliteBM25(self._db).remove(sorted(missing))
            self._db.commit()

    def _read_staged_manifest(self) -> Manifest:
        path = self.staging / MANIFEST
        try:
            data = json.loads(path.read_text("utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise StoreError(f"{path}: unreadable checkpoint manifest ({exc}); remove {self.staging}") from exc
        return Manifest.from_dict(data, str(path))

    def _open_staging(self) -> None:
        self._staged_manifest = self._read_staged_manifest()
        try:
            self._index = faiss.read_index(str(self.staging / INDEX))
        except RuntimeError as exc:
            first = str(exc).splitlines()[0]
            raise StoreError(f"{self.staging / INDEX}: corrupted checkpoint ({first}); remove {self.staging}") from exc
        if self._db is not None:
            self._db.close()
        self._db = self._connect(self.staging / DOCSTORE)
        try:
            row = self._db.execute("SELECT MAX(row_id) FROM documents").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.staging / DOCSTORE}: corrupted checkpoint ({exc}); remove {self.staging}") from exc
        ids = index_ids(self._index)
        top_index = int(ids.max()) if len(ids) else -1
        self._next_row_id = max(row if row is not None else -1, top_index) + 1
        self._search_index = None
        self._open_vector_writer(self.staging)

    def _supports_remove(self) -> bool:
        return self._staged_manifest.index.get("type", "flat") != "hnsw"

    def content_hashes(self, ids: Sequence[str]) -> dict[str, str]:
        db = self._require_db()
        out: dict[str, str] = {}
        with self._lock:
            for start in range(0, len(ids), 500):
                chunk = list(ids[start : start + 500])
                marks = ",".join("?" * len(chunk))
                out.update(db.execute(f"SELECT id, content_hash FROM documents WHERE id IN ({marks})", chunk))
        return out

    def upsert(
        self, documents: Sequence[Document], vectors: np.ndarray, *, sparse_tokens: Sequence[list[str]] | None = None
    ) -> None:
        self._require_writing()
        assert self._index is not None and self._db is not None
        if len(documents) != len(vectors):
            raise InputError(f"{len(documents)} documents but {len(vectors)} vectors")
        if sparse_tokens is not None and len(sparse_tokens) != len(documents):
            raise InputError(f"{len(documents)} documents but {len(sparse_tokens)} token lists")
        if len(documents) == 0:
            return
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != self._staged_manifest.dim:
            raise InputError(
                f"{self.describe()}: vectors have shape {vectors.shape}; "
                f"the store holds {self._staged_manifest.dim}-dim vectors"
            )
        with self._lock:
            removed = self._remove_rows([d.id for d in documents])
            row_ids = np.arange(self._next_row_id, self._next_row_id + len(documents), dtype=np.int64)
            self._next_row_id += len(documents)
            self._db.executemany(
                "INSERT INTO documents(row_id, id, text, title, metadata, content_hash) VALUES (?,?,?,?,?,?)",
                [
                    (int(r), d.id, d.text, d.title, json.dumps(d.metadata, ensure_ascii=False), d.content_hash())
                    for r, d in zip(row_ids, documents, strict=True)
                ],
            )
            if self._staged_manifest.sparse:  # the BM25 side, in the same SQLite transaction
                SqliteBM25(self._db).add(row_ids.tolist(), [d.embedding_text() for d in documents], sparse_tokens)
            inner = inner_index(self._index)
            if not inner.is_trained:
                # Trained once, on the first batch: make the first chunk large (>= 39 * nlist, and >= 256 * 39
                # for PQ codebooks) for a good quantiser; scalar codes take their value ranges from it.
                pq = getattr(inner, "pq", None)
                nlist = inner.nlist if isinstance(inner, faiss.IndexIVF) else 0
                needed = max(nlist, 2**pq.nbits if pq is not None else 0, MIN_SQ_TRAIN if nlist == 0 else 0)
                if len(vectors) < needed:
                    what = f" with nlist={nlist}" if nlist else ""
                    raise InputError(
                        f"{type(inner).__name__}{what} needs at least {needed} vectors in the first batch to train; "
                        f"{'lower --nlist or ' if nlist else ''}raise the chunk size"
                    )
                inner.train(vectors)
            if self._vec_fd is not None:  # full-precision rows at their offsets, made durable by commit()
                os.pwrite(self._vec_fd, vectors.tobytes(), int(row_ids[0]) * 4 * vectors.shape[1])
            self._index.add_with_ids(vectors, row_ids)
            self._id_order = None
            self._record(ADD, row_ids, vectors)
            self._count += len(documents) - removed
            self._search_index = None

    def _remove_rows(self, ids: Sequence[str]) -> int:
        assert self._index is not None and self._db is not None
        existing = []
        for start in range(0, len(ids), 500):
            chunk = list(ids[start : start + 500])
            marks = ",".join("?" * len(chunk))
            existing += [r for (r,) in self._db.execute(f"SELECT row_id FROM documents WHERE id IN ({marks})", chunk)]
        if not existing:
            return 0
        self._db.executemany("DELETE FROM documents WHERE row_id = ?", [(r,) for r in existing])
        if self._staged_manifest.sparse:
            SqliteBM25(self._db).remove(existing)
        # HNSW cannot remove vectors: they stay as tombstones that searches skip (counted at commit).
        rows = np.asarray(existing, dtype=np.int64)
        if self._supports_remove():
            self._index.remove_ids(rows)
            self._id_order = None
        else:
            self._tombstones += len(rows)
        self._record(REMOVE, rows, None)
        return len(existing)

    def _record(self, op: int, rows: np.ndarray, vectors: np.ndarray | None) -> None:
        """Remember a change for this in-place transaction's delta (bulk writes checkpoint the whole index)."""
        if not self._in_place:
            return
        records = np.zeros(len(rows), dtype=delta_dtype(self._staged_manifest.dim))
        records["op"], records["row"] = op, rows
        if vectors is not None:
            records["vec"] = vectors
        self._delta.append(records)

    def delete(self, ids: Sequence[str]) -> int:
        self._require_writing()
        with self._lock:
            removed = self._remove_rows(list(ids))
            self._count -= removed
            self._search_index = None
        return removed

    def commit(self) -> None:
        """Checkpoint: docstore transaction first, then the index, each durable and atomic."""
        self._require_writing()
        if self._in_place:
            self._commit_in_place()
            return
        assert self._index is not None and self._db is not None
        with self._lock:
            if self._vec_fd is not None:  # every row the docstore commits has its vector on disk
                os.fsync(self._vec_fd)
            self._db.commit()
            tmp = self.staging / (INDEX + ".tmp")
            faiss.write_index(self._index, str(tmp))
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, self.staging / INDEX)
            self._count = self._db.execute("SELECT COUNT(*) FROM documents").fetchone()[0]
            self._tombstones = int(self._index.ntotal - self._count)
            self._start_meta(self.staging / INDEX)
            self._staged_manifest.count = self._count
            self._staged_manifest.index["tombstones"] = self._tombstones
            self._write_manifest(self.staging, self._staged_manifest)

    def _commit_in_place(self) -> None:
        """Append this transaction's delta, then commit the docstore with the delta's new length (the commit point)."""
        assert self._db is not None and self.manifest is not None
        with self._lock:
            committed = self._opened_as[1]
            if self._vec_fd is not None:  # the rows' full vectors are durable before the commit point
                os.fsync(self._vec_fd)
            if self._delta:
                data = np.concatenate(self._delta).tobytes()
                created = not (self.path / DELTA).exists()
                with open(self.path / DELTA, "ab") as fh:
                    fh.truncate(committed)  # a killed writer's uncommitted tail
                    fh.write(data)
                    fh.flush()
                    os.fsync(fh.fileno())
                if created:
                    _fsync_dir(self.path)
                committed += len(data)
            self._set_meta(count=self._count, tombstones=self._tombstones, delta_bytes=committed)
            self._db.commit()
            self._delta = []
            self._opened_as = (self._opened_as[0], committed)
            self.manifest.count = self._count
            self.manifest.index["tombstones"] = self._tombstones
            self.manifest.updated_at = time.time()
            self._write_manifest(self.path, self.manifest)  # informative: the docstore's counts are the truth
            if committed > max(FOLD_MIN_BYTES, (self.path / INDEX).stat().st_size * FOLD_RATIO):
                self._fold()

    def _fold(self) -> None:
        """Write the in-memory index (delta applied) as the new index.faiss and empty the delta."""
        assert self._db is not None and self._index is not None
        nxt = self.path / NEXT_INDEX
        faiss.write_index(self._index, str(nxt))
        _fsync_file(nxt)
        self._set_meta(delta_bytes=0, fold_pending=1, index_bytes=nxt.stat().st_size)
        self._db.commit()  # from here on, open() rolls the fold forward
        os.replace(nxt, self.path / INDEX)
        _fsync_dir(self.path)
        with open(self.path / DELTA, "ab") as fh:
            fh.truncate(0)
        self._set_meta(fold_pending=0)
        self._db.commit()
        self._opened_as = ((self.path / INDEX).stat().st_ino, 0)

    def finalize(self) -> None:
        """Publish: swap the staging folder into place (bulk), or commit the in-place transaction."""
        self.commit()
        self._close_vector_writer()
        if self._in_place:
            with self._lock:
                self._in_place = False
                self._writing = False
                self._vecs = None  # remapped on the next search: the file may have grown
                self._release_writer_lock()
            return
        assert self._db is not None
        with self._lock:
            manifest = self._staged_manifest
            self._db.close()  # the last connection's close folds any WAL into the file: hash the final bytes
            self._db = None
            names = (INDEX, DOCSTORE, VECTORS) if (self.staging / VECTORS).exists() else (INDEX, DOCSTORE)
            manifest.checksums = {name: _sha256(self.staging / name) for name in names}
            manifest.updated_at = time.time()
            manifest.sizes = {name: (self.staging / name).stat().st_size for name in names}
            self._write_manifest(self.staging, manifest)
            old = self._old_path()
            shutil.rmtree(old, ignore_errors=True)
            if self.path.exists():
                self.path.rename(old)
            self.staging.rename(self.path)
            _fsync_dir(self.path.parent)
            shutil.rmtree(old, ignore_errors=True)
            self._writing = False
            self._release_writer_lock()
            self._open(self.path)

    def abort(self) -> None:
        """Drop the writes since begin()/prepare() and release the writer lock; the published store is reopened."""
        with self._lock:
            self._close_vector_writer()
            if self._db is not None:
                self._db.rollback()
                self._db.close()
                self._db = None
            if not self._in_place:
                shutil.rmtree(self.staging, ignore_errors=True)
            self._in_place = False
            self._delta = []
            self._writing = False
            self._release_writer_lock()
            self._index = None
            self._search_index = None
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
        from care_retriever.sparse.tokenizer import tokenize, tokenizer_spec

        self._require_writing()
        assert self._db is not None
        entry = self._staged_manifest.sparse
        if entry and entry.get("tokenizer") == tokenizer_spec() and not rebuild:
            return 0
        with self._lock:
            bm25 = SqliteBM25(self._db)
            bm25.clear()  # a killed earlier build (or another tokenizer's) may have committed postings
            done, last = 0, -1
            total = self._db.execute("SELECT COUNT(*) FROM documents").fetchone()[0]
            with tqdm(total=total, desc="Sparse index", unit="doc", disable=not show_progress or not total) as bar:
                while rows := self._db.execute(
                    "SELECT row_id, text, title FROM documents WHERE row_id > ? ORDER BY row_id LIMIT 2000", (last,)
                ).fetchall():
                    texts = [Document(id="", text=text, title=title).embedding_text() for _, text, title in rows]
                    bm25.add([r for r, _, _ in rows], texts, tokenize(texts))
                    done += len(rows)
                    last = rows[-1][0]
                    bar.update(len(rows))
            self._staged_manifest.sparse = sparse_entry("sqlite-bm25")
        return done

    def search_sparse(
        self, queries: Sequence[str], top_k: int, filters: Filters | None = None, *, payload: bool = True
    ) -> list[list[Hit]]:
        """BM25 top-``k`` hits for each query text (an empty list for a query with no indexed token)."""
        from care_retriever.sparse import require_sparse

        self._check_sparse_search(top_k)
        self._follow_writes()
        require_sparse(self)
        filters = validate_filters(filters)
        ranked = self._sparse_ranked(queries, top_k, self._filtered_row_ids(filters) if filters else None)
        docs = self._rows({r for row in ranked for r, _ in row}, payload=payload)
        return [_hits(row, docs, top_k) for row in ranked]

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

        self._check_sparse_search(top_k)
        self._follow_writes()
        require_sparse(self)
        fusion = fusion or FusionConfig()
        filters = validate_filters(filters)
        allowed = self._filtered_row_ids(filters) if filters else None  # one filter query for both sides
        depth = max(fusion.candidates, top_k)
        dense = self._dense_ranked(vectors, depth, filters, allowed)
        if self._tombstones:  # removed rows still in the index (HNSW): dropped before they take part in fusion
            live = self._rows({r for row in dense for r, _ in row}, payload=False)
            dense = [[(r, s) for r, s in row if r in live][:depth] for row in dense]
        sparse = self._sparse_ranked(queries, depth, allowed)
        fused = [fuse(d, s, fusion) if s else d for d, s in zip(dense, sparse, strict=True)]
        # Ties at the cut are kept and broken by document id, as fuse() breaks them on ids for other stores.
        cuts = [_with_ties(row, top_k) for row in fused]
        docs = self._rows({r for row in cuts for r, _ in row}, payload=payload)
        return [sorted(_hits(row, docs, len(row)), key=lambda h: (-h.score, h.id))[:top_k] for row in cuts]

    def _check_sparse_search(self, top_k: int) -> None:
        if self._writing:
            raise StoreError(f"{self.describe()}: sparse search on a store being written; finalize() first")
        if top_k < 1:
            raise InputError(f"top_k must be >= 1, got {top_k}")

    def _sparse_ranked(
        self, queries: Sequence[str], top_k: int, allowed: np.ndarray | None
    ) -> list[list[tuple[int, float]]]:
        """Each query's BM25 top-``k`` (row id, score), best first, ties by row id."""
        from care_retriever.sparse.tokenizer import tokenize

        db = self._require_db()
        tokens = tokenize(list(queries))
        with self._lock:
            if self._bm25 is None or self._bm25.db is not db:  # one per connection: it keeps the postings in memory
                self._bm25 = SqliteBM25(db)
            return [self._bm25.top(toks, top_k, allowed) for toks in tokens]

    # ------------------------------------------------------------------ reading
    def _require_db(self) -> sqlite3.Connection:
        if self._db is None:
            self.require_manifest()
            raise StoreError(f"{self.describe()}: store is closed")
        return self._db

    def _require_writing(self) -> None:
        if not self._writing:
            raise StoreError(f"{self.describe()}: call prepare() before writing")

    def count(self, filters: Filters | None = None) -> int:
        if self._db is None:
            return 0
        self._follow_writes()
        filters = validate_filters(filters)
        if filters:
            return len(self._filtered_row_ids(filters))
        if not self._writing or self._in_place:
            return self._count
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM documents").fetchone()[0]

    def vectors(self, ids: Sequence[str]) -> list[np.ndarray | None]:
        """Stored vector of each id (None where the id is missing)."""
        if self._db is None or self._index is None:
            return [None] * len(ids)
        self._follow_writes()
        ids = list(ids)
        rows: dict[str, int] = {}
        with self._lock:
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                marks = ",".join("?" * len(chunk))
                rows.update(self._db.execute(f"SELECT id, row_id FROM documents WHERE id IN ({marks})", chunk))
            index = self._index
            manifest = self._staged_manifest if self._writing else self.require_manifest()
            if quantization(manifest.index) != "none":  # the exact vectors, not decoded codes
                found = np.asarray([rows[i] for i in ids if i in rows], dtype=np.int64)
                full = iter(self._full_vectors(found))
                return [next(full).copy() if i in rows else None for i in ids]
            if isinstance(index, faiss.IndexIDMap):  # no id -> position map: find positions in the sorted ids
                stored = faiss.vector_to_array(index.id_map)
                if self._id_order is None:
                    self._id_order = np.argsort(stored, kind="stable")
                inner = faiss.downcast_index(index.index)
                wanted = np.asarray([rows.get(i, -1) for i in ids], dtype=np.int64)
                where = np.clip(np.searchsorted(stored[self._id_order], wanted), 0, max(len(stored) - 1, 0))
                positions = self._id_order[where] if len(stored) else where
                return [
                    None if i not in rows or stored[p] != r else inner.reconstruct(int(p))
                    for i, r, p in zip(ids, wanted, positions, strict=True)
                ]
            if not hasattr(index, "id_map"):  # IVF keeps ids itself; reconstructing by id needs its direct map
                ivf = faiss.extract_index_ivf(index)
                if ivf.direct_map.type == faiss.DirectMap.NoMap:
                    ivf.set_direct_map_type(faiss.DirectMap.Hashtable)
            return [None if i not in rows else index.reconstruct(int(rows[i])) for i in ids]

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
        return [_hits(row, docs, top_k) for row in ranked]

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
        manifest = self._staged_manifest if self._writing else self.require_manifest()
        if vectors.shape[1] != manifest.dim:
            raise InputError(f"query vectors have {vectors.shape[1]} dims; the store holds {manifest.dim}")
        if len(vectors) == 0 or self._index.ntotal == 0:
            return [[] for _ in range(len(vectors))]
        if quantization(manifest.index) != "none":
            return self._rescored(vectors, top_k, manifest, filters, allowed)
        k = min(top_k + self._tombstones, self._index.ntotal)
        params = self._search_params(manifest, filters, allowed)
        if params is False:
            return [[] for _ in range(len(vectors))]
        index = self._searchable() if params is None else self._index
        scores, ids = index.search(vectors, k, params=params) if params is not None else index.search(vectors, k)
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
        want = top_k + self._tombstones
        oversample = float(self.oversample if self.oversample is not None else manifest.index.get("oversample", 1.0))
        if filters and not _takes_search_params(inner_index(self._index)):
            # Sign-bit and flat PQ codes take no id selector: the matching rows are scored exactly instead
            # (cost grows with the number of matches, not with the store).
            assert allowed is not None
            candidates = [allowed] * len(vectors)
        else:
            k = min(max(want, math.ceil(top_k * oversample) + self._tombstones), self._index.ntotal)
            params = self._search_params(manifest, filters, allowed)
            if params is False:
                return [[] for _ in range(len(vectors))]
            _, ids = (
                self._index.search(vectors, k, params=params) if params is not None else self._index.search(vectors, k)
            )
            candidates = [row[row >= 0] for row in ids]
        out = []
        for query, rows in zip(vectors, candidates, strict=True):
            rows = np.sort(rows)  # ascending offsets: sequential reads of the memory-mapped file
            scores = np.concatenate(
                [self._full_vectors(rows[i : i + 65536]) @ query for i in range(0, len(rows), 65536)] or [np.zeros(0)]
            )
            order = np.argsort(-scores, kind="stable")[:want]
            out.append([(int(rows[i]), float(scores[i])) for i in order])
        return out

    def _search_params(self, manifest: Manifest, filters: Filters | None, row_ids: np.ndarray | None) -> Any:
        inner = inner_index(self._index)
        selector = None
        if filters:
            assert row_ids is not None
            if len(row_ids) == 0:
                return False
            selector = faiss.IDSelectorBatch(row_ids)
        if isinstance(inner, faiss.IndexHNSW):
            params = faiss.SearchParametersHNSW()
            params.efSearch = int(manifest.index.get("ef_search", 128))
        elif isinstance(inner, faiss.IndexIVF):
            params = faiss.SearchParametersIVF()
            params.nprobe = int(manifest.index.get("nprobe", 32))
        elif selector is None:
            return None
        else:
            params = faiss.SearchParameters()
        if selector is not None:
            params.sel = selector
            params._care_selector_ref = selector  # keep the selector alive as long as params
        return params

    def _filtered_row_ids(self, filters: Filters) -> np.ndarray:
        clauses, args = [], []
        for key, value in filters.items():
            values = value if isinstance(value, list) else [value]
            clauses.append(f"json_extract(metadata, ?) IN ({','.join('?' * len(values))})")
            args += [f'$."{key}"', *values]
        db = self._require_db()
        with self._lock:
            rows = db.execute(f"SELECT row_id FROM documents WHERE {' AND '.join(clauses)}", args).fetchall()
        return np.asarray([r for (r,) in rows], dtype=np.int64)

    def _rows(self, row_ids: set[int], payload: bool = True) -> dict[int, Document]:
        """Stored documents by row id; without ``payload``, their ids alone (no text, no metadata parsing)."""
        db = self._require_db()
        out: dict[int, Document] = {}
        ids = list(row_ids)
        columns = "row_id, id, text, title, metadata" if payload else "row_id, id"
        with self._lock:
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                marks = ",".join("?" * len(chunk))
                for rid, did, *rest in db.execute(f"SELECT {columns} FROM documents WHERE row_id IN ({marks})", chunk):
                    if payload:
                        text, title, meta = rest
                        out[rid] = Document(id=did, text=text, title=title, metadata=json.loads(meta))
                    else:
                        out[rid] = Document(id=did, text="")
        return out

    def get(self, ids: Sequence[str]) -> list[Document | None]:
        db = self._require_db()
        found: dict[str, Document] = {}
        ids = list(ids)
        with self._lock:
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                marks = ",".join("?" * len(chunk))
                for did, text, title, meta in db.execute(
                    f"SELECT id, text, title, metadata FROM documents WHERE id IN ({marks})", chunk
                ):
                    found[did] = Document(id=did, text=text, title=title, metadata=json.loads(meta))
        return [found.get(i) for i in ids]

    def iter_documents(self, batch: int = 1000) -> Iterator[Document]:
        """All live documents in row order (adapters use this to list a store)."""
        db = self._require_db()
        last = -1
        while True:
            with self._lock:
                rows = db.execute(
                    "SELECT row_id, id, text, title, metadata FROM documents WHERE row_id > ? ORDER BY row_id LIMIT ?",
                    (last, batch),
                ).fetchall()
            if not rows:
                return
            for _rid, did, text, title, meta in rows:
                yield Document(id=did, text=text, title=title, metadata=json.loads(meta))
            last = rows[-1][0]

    def verify(self) -> int:
        """Read everything: checksums (while the manifest's still describe the files), SQLite integrity,
        the delta, the id sets of index and docstore, each row's content hash and each vector's norm."""
        manifest = self.require_manifest()
        db = self._require_db()
        if self._writing:
            raise StoreError(f"{self.describe()}: a write is in progress; verify after it")
        with self._lock:
            for name, expected in manifest.checksums.items():
                if _sha256(self.path / name) != expected:
                    raise StoreError(f"{self.path / name}: checksum mismatch with {MANIFEST}; the file is corrupted")
            try:
                problems = [r for (r,) in db.execute("PRAGMA integrity_check") if r != "ok"]
                rows = db.execute("SELECT row_id, id, text, title, metadata, content_hash FROM documents").fetchall()
            except sqlite3.DatabaseError as exc:
                raise StoreError(f"{self.path / DOCSTORE}: corrupted docstore ({exc})") from exc
            if problems:
                raise StoreError(f"{self.path / DOCSTORE}: corrupted docstore ({problems[0]})")
            if len(rows) != self._count:
                raise StoreError(
                    f"{self.path}: count mismatch: the store records {self._count} documents, "
                    f"the docstore has {len(rows)}"
                )
            for _rid, did, text, title, meta, digest in rows:
                try:
                    doc = Document(id=did, text=text, title=title, metadata=json.loads(meta))
                except (TypeError, ValueError) as exc:
                    raise StoreError(f"{self.path / DOCSTORE}: document {did!r} is unreadable ({exc})") from exc
                if doc.content_hash() != digest:
                    raise StoreError(f"{self.path / DOCSTORE}: document {did!r} does not match its content hash")
            assert self._index is not None
            in_index = index_ids(self._index)
            if quantization(manifest.index) != "none":  # every row's rescoring vector is there (norms below)
                self._check_vectors_file(self._read_folder, in_index)
            in_docstore = np.fromiter((r for r, *_ in rows), dtype=np.int64, count=len(rows))
            missing = np.setdiff1d(in_docstore, in_index)
            if len(missing) or len(in_index) != len(np.unique(in_index)):
                raise StoreError(
                    f"{self.path / INDEX}: {len(missing)} documents have no vector or vectors repeat "
                    "an id; the store is corrupted"
                )
            if len(rows):
                vectors = self.vectors([r[1] for r in rows])
                norms = np.linalg.norm(np.stack(vectors), axis=1)
                bad = ~(np.isclose(norms, 1.0, atol=1e-3) | (norms == 0.0))
                if bad.any():
                    raise StoreError(
                        f"{self.path / INDEX}: {int(bad.sum())} vectors are not unit-norm (first: "
                        f"{rows[int(np.argmax(bad))][1]!r}); the file is corrupted"
                    )
        return len(rows)

    def footprint(self) -> dict[str, Any]:
        """Quantization and bytes per live document: in RAM (the index searched: vectors or codes, delta
        included) and on disk (every file of the store, the docstore's text and the rescoring vectors included)."""
        manifest = self.require_manifest()
        folder = self._read_folder
        files = {p.name: p.stat().st_size for p in folder.iterdir() if p.is_file()}
        ram = files.get(INDEX, 0) + files.get(DELTA, 0)
        count = max(self._count, 1)
        return {
            "quantize": quantization(manifest.index),
            "oversample": manifest.index.get("oversample") if quantization(manifest.index) != "none" else None,
            "ram_bytes_per_doc": round(ram / count, 1),
            "disk_bytes_per_doc": round(sum(files.values()) / count, 1),
        }

    def close(self) -> None:
        """Close the docstore; a writer that did not finalize keeps its checkpoint for the next run."""
        with self._lock:
            self._close_vector_writer()
            if self._db is not None:
                self._db.close()
                self._db = None
            self._writing = False
            self._release_writer_lock()
