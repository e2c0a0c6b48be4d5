"""The embedded default store: a folder with a FAISS index, a SQLite docstore and a manifest.

Layout (also read by the Haystack and LangChain adapters)::

    DIR/manifest.json      Manifest: model fingerprint, dim, metric, count, index type, versions, checksums
    DIR/index.faiss        faiss.IndexIDMap2 over Flat (exact inner product), HNSW or IVF; ids = row ids
    DIR/docstore.sqlite    documents(row_id INTEGER PRIMARY KEY, id TEXT UNIQUE, text, title, metadata JSON,
                           content_hash)

Vectors are unit-norm, so inner product is cosine. Writes go to a staging folder beside ``DIR``
(checkpointed by :meth:`commit`); :meth:`finalize` swaps it into place, so readers never see a
half-written store, and a killed writer resumes from its last checkpoint. One writer at a time:
:meth:`prepare` takes an exclusive lock on ``.DIR.lock`` beside the store (released by the OS if the
writer dies), so two indexing runs into one store fail fast instead of mixing their checkpoints.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import faiss
import numpy as np
from tqdm.auto import tqdm

from care_retriever.corpus import Document
from care_retriever.errors import InputError, StoreError
from care_retriever.sparse.sqlite_bm25 import SqliteBM25
from care_retriever.stores.base import (
    FAISS_INDEX_TYPES,
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
INDEX_TYPES = FAISS_INDEX_TYPES

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


def build_index(dim: int, options: dict[str, Any]) -> faiss.Index:
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
        return faiss.IndexIVFPQ(quantizer, dim, int(options.get("nlist", 1024)), pq_m, bits,
                                faiss.METRIC_INNER_PRODUCT)
    else:
        raise InputError(f"Unknown FAISS index type {kind!r}. Available index types: {list(INDEX_TYPES)}")
    return faiss.IndexIDMap2(inner)


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
    parts = [faiss.rev_swig_ptr(lists.get_ids(i), lists.list_size(i)).copy() for i in range(ivf.nlist)
             if lists.list_size(i)]
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)


class FaissStore(VectorStore):
    """FAISS + SQLite store in a folder. Safe for concurrent searches from many threads."""

    backend = "faiss"

    def __init__(self, path: str | Path, *, use_gpu: bool | None = None) -> None:
        self.path = Path(path)
        self.staging = self.path.with_name(f".{self.path.name}.staging")
        self.use_gpu = use_gpu
        self.manifest: Manifest | None = None
        self._index: faiss.Index | None = None
        self._search_index: faiss.Index | None = None
        self._db: sqlite3.Connection | None = None
        self._lock = threading.RLock()
        self._writing = False
        self._writer_lock: Any = None
        self._next_row_id = 0
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
        except OSError:
            fh.close()
            raise StoreError(
                f"{self.describe()}: another writer is indexing into this store (lock {self.lock_path}); "
                "wait for it to finish"
            ) from None
        self._writer_lock = fh

    def _release_writer_lock(self) -> None:
        if self._writer_lock is not None:
            with contextlib.suppress(OSError):
                self._writer_lock.close()  # closing the file releases the flock
            self._writer_lock = None

    # ------------------------------------------------------------------ opening
    def _open(self, folder: Path) -> None:
        manifest_path = folder / MANIFEST
        try:
            data = json.loads(manifest_path.read_text("utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise StoreError(f"{manifest_path}: unreadable manifest ({exc})") from None
        self.manifest = Manifest.from_dict(data, str(manifest_path))
        for name in (INDEX, DOCSTORE):
            if not (folder / name).is_file():
                raise StoreError(f"{folder / name}: missing; the store is incomplete")
        self._verify_checksums(folder)
        try:
            self._index = faiss.read_index(str(folder / INDEX))
        except RuntimeError as exc:
            raise StoreError(f"{folder / INDEX}: corrupted FAISS index ({str(exc).splitlines()[0]})") from None
        if self._db is not None:
            self._db.close()
        self._db = self._connect(folder / DOCSTORE)
        self._check_counts(folder)
        self._search_index = None

    def _verify_checksums(self, folder: Path) -> None:
        assert self.manifest is not None
        for name, expected in self.manifest.checksums.items():
            if _sha256(folder / name) != expected:
                raise StoreError(f"{folder / name}: checksum mismatch with {MANIFEST}; the file is corrupted")

    def _connect(self, path: Path) -> sqlite3.Connection:
        try:
            db = sqlite3.connect(str(path), check_same_thread=False, isolation_level="DEFERRED")
            db.execute(_SCHEMA)
            db.execute("PRAGMA synchronous=FULL")
            return db
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{path}: corrupted docstore ({exc})") from None

    def _check_counts(self, folder: Path) -> None:
        assert self.manifest is not None and self._db is not None and self._index is not None
        try:
            rows = self._db.execute("SELECT COUNT(*) FROM documents").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{folder / DOCSTORE}: corrupted docstore ({exc})") from None
        tombstones = int(self.manifest.index.get("tombstones", 0))
        if rows != self.manifest.count or self._index.ntotal != rows + tombstones:
            raise StoreError(
                f"{folder}: count mismatch: manifest says {self.manifest.count}, docstore has {rows}, "
                f"index has {self._index.ntotal} vectors ({tombstones} tombstones); the store is corrupted"
            )

    # ------------------------------------------------------------------ writing
    def prepare(self, dim: int, space_fingerprint: str, model_name: str, index: dict[str, Any] | None = None) -> None:
        options = {"type": "flat", **(index or {})}
        if options["type"] not in INDEX_TYPES:
            raise InputError(
                f"Unknown FAISS index type {options['type']!r}. Available index types: {list(INDEX_TYPES)}"
            )
        if self.manifest is not None:
            self.check_compatible(space_fingerprint, dim)
        self._acquire_writer_lock()
        try:
            if (self.staging / MANIFEST).exists():
                self._resume_staging(dim, space_fingerprint)
            else:
                self._new_staging(dim, space_fingerprint, model_name, options)
        except BaseException:
            self._release_writer_lock()
            raise
        self._writing = True

    def _new_staging(self, dim: int, space_fingerprint: str, model_name: str, options: dict[str, Any]) -> None:
        """Start a write: a copy of the published store (or an empty index); its manifest is written last."""
        shutil.rmtree(self.staging, ignore_errors=True)
        self.staging.mkdir(parents=True)
        source = self.path if (self.path / MANIFEST).exists() else self._old_path()
        if self.manifest is not None:  # update an existing store: work on a copy
            for name in (INDEX, DOCSTORE):
                shutil.copy2(source / name, self.staging / name)
                _fsync_file(self.staging / name)
            manifest = Manifest.from_dict(self.manifest.to_dict(), MANIFEST)
        else:
            manifest = Manifest(backend="faiss", dim=dim, space_fingerprint=space_fingerprint,
                                model_name=model_name, index=options,
                                versions=default_versions(faiss=faiss.__version__))
            faiss.write_index(build_index(dim, options), str(self.staging / INDEX))
            _fsync_file(self.staging / INDEX)
        manifest.checksums = {}
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
            raise StoreError(f"{path}: unreadable checkpoint manifest ({exc}); remove {self.staging}") from None
        return Manifest.from_dict(data, str(path))

    def _open_staging(self) -> None:
        self._staged_manifest = self._read_staged_manifest()
        try:
            self._index = faiss.read_index(str(self.staging / INDEX))
        except RuntimeError as exc:
            first = str(exc).splitlines()[0]
            raise StoreError(f"{self.staging / INDEX}: corrupted checkpoint ({first}); remove {self.staging}") from None
        if self._db is not None:
            self._db.close()
        self._db = self._connect(self.staging / DOCSTORE)
        try:
            row = self._db.execute("SELECT MAX(row_id) FROM documents").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            raise StoreError(
                f"{self.staging / DOCSTORE}: corrupted checkpoint ({exc}); remove {self.staging}"
            ) from None
        ids = index_ids(self._index)
        top_index = int(ids.max()) if len(ids) else -1
        self._next_row_id = max(row if row is not None else -1, top_index) + 1
        self._search_index = None

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

    def upsert(self, documents: Sequence[Document], vectors: np.ndarray) -> None:
        self._require_writing()
        assert self._index is not None and self._db is not None
        if len(documents) != len(vectors):
            raise InputError(f"{len(documents)} documents but {len(vectors)} vectors")
        if len(documents) == 0:
            return
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != self._staged_manifest.dim:
            raise InputError(
                f"{self.describe()}: vectors have shape {vectors.shape}; "
                f"the store holds {self._staged_manifest.dim}-dim vectors"
            )
        with self._lock:
            self._remove_rows([d.id for d in documents])
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
                SqliteBM25(self._db).add(row_ids.tolist(), [d.embedding_text() for d in documents])
            inner = inner_index(self._index)
            if isinstance(inner, faiss.IndexIVF) and not inner.is_trained:
                # Trained once, on the first batch: make the first chunk large (>= 39 * nlist, and >= 256 * 39
                # for PQ codebooks) for a good quantiser.
                needed = max(inner.nlist, 2 ** inner.pq.nbits if isinstance(inner, faiss.IndexIVFPQ) else 0)
                if len(vectors) < needed:
                    raise InputError(
                        f"{type(inner).__name__} with nlist={inner.nlist} needs at least {needed} vectors in the "
                        "first batch to train; lower --nlist or raise the chunk size"
                    )
                inner.train(vectors)
            self._index.add_with_ids(vectors, row_ids)
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
        if self._supports_remove():
            self._index.remove_ids(np.asarray(existing, dtype=np.int64))
        return len(existing)

    def delete(self, ids: Sequence[str]) -> int:
        self._require_writing()
        with self._lock:
            removed = self._remove_rows(list(ids))
            self._search_index = None
        return removed

    def commit(self) -> None:
        """Checkpoint: docstore transaction first, then the index, each durable and atomic."""
        self._require_writing()
        assert self._index is not None and self._db is not None
        with self._lock:
            self._db.commit()
            tmp = self.staging / (INDEX + ".tmp")
            faiss.write_index(self._index, str(tmp))
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, self.staging / INDEX)
            self._staged_manifest.count = self._db.execute("SELECT COUNT(*) FROM documents").fetchone()[0]
            self._staged_manifest.index["tombstones"] = int(self._index.ntotal - self._staged_manifest.count)
            _write_atomic(self.staging / MANIFEST, json.dumps(self._staged_manifest.to_dict(), indent=2).encode())
            _fsync_dir(self.staging)

    def finalize(self) -> None:
        """Swap the staging folder into place (old store removed only after the new one is in)."""
        self.commit()
        assert self._db is not None
        with self._lock:
            manifest = self._staged_manifest
            manifest.checksums = {name: _sha256(self.staging / name) for name in (INDEX, DOCSTORE)}
            manifest.updated_at = time.time()
            _write_atomic(self.staging / MANIFEST, json.dumps(manifest.to_dict(), indent=2).encode())
            _fsync_dir(self.staging)
            self._db.close()
            self._db = None
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
            with tqdm(total=total, desc="Sparse index", unit="doc", disable=not show_progress) as bar:
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

    def search_sparse(self, queries: Sequence[str], top_k: int, filters: Filters | None = None) -> list[list[Hit]]:
        """BM25 top-``k`` hits for each query text (an empty list for a query with no indexed token)."""
        from care_retriever.sparse import require_sparse
        from care_retriever.sparse.tokenizer import tokenize

        if self._writing:
            raise StoreError(f"{self.describe()}: sparse search on a store being written; finalize() first")
        require_sparse(self)
        if top_k < 1:
            raise InputError(f"top_k must be >= 1, got {top_k}")
        filters = validate_filters(filters)
        db = self._require_db()
        results: list[list[Hit]] = []
        for tokens in tokenize(list(queries)):
            with self._lock:
                allowed = {int(r) for r in self._filtered_row_ids(filters)} if filters else None
                scores = SqliteBM25(db).scores(tokens, allowed)
            best = sorted(scores.items(), key=lambda item: (-item[1], item[0]))[:top_k]
            docs = self._rows({r for r, _ in best})
            results.append([Hit(id=docs[r].id, score=float(s), text=docs[r].text, title=docs[r].title,
                                metadata=docs[r].metadata) for r, s in best if r in docs])
        return results

    # ------------------------------------------------------------------ reading
    def _require_db(self) -> sqlite3.Connection:
        if self._db is None:
            self.require_manifest()
            raise StoreError(f"{self.describe()}: store is closed")
        return self._db

    def _require_writing(self) -> None:
        if not self._writing:
            raise StoreError(f"{self.describe()}: call prepare() before writing")

    def count(self) -> int:
        if self._db is None:
            return 0
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM documents").fetchone()[0]

    def _searchable(self) -> faiss.Index:
        if self._search_index is None:
            assert self._index is not None
            index = self._index
            if self.use_gpu is not False and hasattr(faiss, "index_cpu_to_all_gpus") and faiss.get_num_gpus() > 0:
                index = faiss.index_cpu_to_all_gpus(index)
            self._search_index = index
        return self._search_index

    def search(self, vectors: np.ndarray, top_k: int, filters: Filters | None = None) -> list[list[Hit]]:
        if self._index is None:
            self.require_manifest()
        assert self._index is not None
        if top_k < 1:
            raise InputError(f"top_k must be >= 1, got {top_k}")
        filters = validate_filters(filters)
        vectors = np.ascontiguousarray(np.atleast_2d(vectors), dtype=np.float32)
        manifest = self._staged_manifest if self._writing else self.require_manifest()
        if vectors.shape[1] != manifest.dim:
            raise InputError(f"query vectors have {vectors.shape[1]} dims; the store holds {manifest.dim}")
        if len(vectors) == 0 or self._index.ntotal == 0:
            return [[] for _ in range(len(vectors))]
        tombstones = int(manifest.index.get("tombstones", 0))
        k = min(top_k + tombstones, self._index.ntotal)
        params = self._search_params(manifest, filters)
        if params is False:
            return [[] for _ in range(len(vectors))]
        index = self._searchable() if params is None else self._index
        scores, ids = index.search(vectors, k, params=params) if params is not None else index.search(vectors, k)
        wanted = {int(i) for i in ids.ravel() if i >= 0}
        docs = self._rows(wanted)
        results: list[list[Hit]] = []
        for row_scores, row_ids in zip(scores, ids, strict=True):
            hits = []
            for score, rid in zip(row_scores, row_ids, strict=True):
                doc = docs.get(int(rid))
                if rid < 0 or doc is None:
                    continue
                hits.append(Hit(id=doc.id, score=float(score), text=doc.text, title=doc.title, metadata=doc.metadata))
                if len(hits) == top_k:
                    break
            results.append(hits)
        return results

    def _search_params(self, manifest: Manifest, filters: Filters | None) -> Any:
        inner = inner_index(self._index)
        selector = None
        if filters:
            row_ids = self._filtered_row_ids(filters)
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

    def _rows(self, row_ids: set[int]) -> dict[int, Document]:
        db = self._require_db()
        out: dict[int, Document] = {}
        ids = list(row_ids)
        with self._lock:
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                marks = ",".join("?" * len(chunk))
                for rid, did, text, title, meta in db.execute(
                    f"SELECT row_id, id, text, title, metadata FROM documents WHERE row_id IN ({marks})", chunk
                ):
                    out[rid] = Document(id=did, text=text, title=title, metadata=json.loads(meta))
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

    def iter_documents(self, batch: int = 1000):
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

    def close(self) -> None:
        """Close the docstore; a writer that did not finalize keeps its checkpoint for the next run."""
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
            self._writing = False
            self._release_writer_lock()
