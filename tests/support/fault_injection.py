"""A counting fault injector for the writes of the stores (tests/cross/test_faults_injection.py), in the manner of
SQLite's I/O-error tests: every write point of a transaction (open for writing, write, truncate, fsync, rename,
copy, SQLite commit; FAISS indexes are written through a Python file) is numbered as a clean run passes it, and
a run is made to fail at the Nth point (ENOSPC or EIO, as the operating system or SQLite would say it) or to
die there (``os._exit``).

The functions are wrapped where the stores' code looks them up (os, shutil, sqlite3 and the ``open`` of
the stores' own modules, and the write calls of the Qdrant Edge adapter); the stores themselves run unchanged.

Run as a script it is the subprocess of the kill tests: ``python tests/support/fault_injection.py SCENARIO DIR N`` runs
SCENARIO's write in DIR and exits with KILLED at the Nth point.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import hashlib
import importlib
import os
import shutil
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

KILLED = 86  # the exit status of a run killed at its point
DIM = 32  # 8 documents' vectors are 1 KB: the smallest max_segment_size, reached at the write's first commit
FINGERPRINT = "fault-injection-space"
# modules whose own ``open`` is wrapped (each resolves the name through its globals first)
OPEN_MODULES = (
    "care_retriever.stores.faiss.files",
    "care_retriever.stores.faiss.journal",
    "care_retriever.stores.faiss.rescoring",
    "care_retriever.stores.qdrant.edge_manifest",
)
# Qdrant Edge writes in Rust, out of reach of Python's os and open: each call of the engine adapter that writes is
# a point, failing before the engine runs it (the engine's own failures mid-write: tests/cross/test_faults_disk_full.py)
EDGE_WRITES = ("upsert", "delete", "set_sparse", "index_field", "flush", "optimize")
# ... and a point once the engine's optimize has returned, its segments built and moved in: failing there is an
# engine that reports a fault at the end of its build; dying there is a kill right after the optimize
EDGE_WRITES_DONE = ("optimize",)
# the store settings of each Qdrant scenario: ``qdrant-segments`` optimizes at each commit (every KB written since
# the last optimize), mid-write, and builds graphs there (segments past 1 KB get HNSW)
QDRANT_OPTIONS: dict[str, dict[str, int] | None] = {
    "qdrant": None,
    "qdrant-segments": {"indexing_threshold": 1, "max_segment_size": 1},
}


class Injector:
    """Numbers the write points passed; fails (``fail_at``) or dies (``kill_at``) at one of them."""

    def __init__(self, fail_at: int = 0, code: int = errno.ENOSPC, kill_at: int = 0) -> None:
        self.count = 0
        self.fail_at = fail_at
        self.kill_at = kill_at
        self.code = code
        self.fired: list[str] = []  # the point that failed, as "N:label path"
        self.labels: list[str] = []

    def point(self, label: str, path: object = "") -> bool:
        """Count a point; True when this one is to fail (the caller raises :meth:`error` after any partial write)."""
        self.count += 1
        self.labels.append(f"{label} {path}")
        if self.count == self.kill_at:
            os._exit(KILLED)
        if self.count == self.fail_at:
            self.fired.append(f"{self.count}:{label} {path}")
            return True
        return False

    def os_error(self, path: object) -> OSError:
        if isinstance(path, int):  # os.fsync(fd): the operating system names no file
            return OSError(self.code, os.strerror(self.code))
        return OSError(self.code, os.strerror(self.code), str(path))

    def sqlite_error(self) -> sqlite3.OperationalError:
        return sqlite3.OperationalError("database or disk is full" if self.code == errno.ENOSPC else "disk I/O error")


class _File:
    """A file opened for writing whose write and truncate calls are points."""

    def __init__(self, fh: Any, injector: Injector, path: object) -> None:
        self._fh, self._injector, self._path = fh, injector, path

    def write(self, data: Any) -> int:
        if self._injector.point("write", self._path):
            self._fh.write(data[: len(data) // 2])  # a short write, as a filling disk leaves
            raise self._injector.os_error(self._path)
        return self._fh.write(data)

    def truncate(self, size: int | None = None) -> int:
        if self._injector.point("truncate", self._path):
            raise self._injector.os_error(self._path)
        return self._fh.truncate(size)

    def __enter__(self) -> _File:
        return self

    def __exit__(self, *exc: object) -> None:
        self._fh.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fh, name)


@contextlib.contextmanager
def armed(injector: Injector) -> Iterator[Injector]:
    """Wrap the write functions for the duration of the block; restored after it."""
    saved: list[tuple[Any, str, Any, bool]] = []

    def patch(owner: Any, name: str, value: Any) -> None:
        saved.append((owner, name, getattr(owner, name, None), hasattr(owner, name)))
        setattr(owner, name, value)

    def before(label: str, real: Any, path_arg: int = 0) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            path = args[path_arg] if len(args) > path_arg else ""
            if injector.point(label, path):
                raise injector.os_error(path)
            return real(*args, **kwargs)

        return wrapped

    real_open = builtins.open

    def opening(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if not any(c in mode for c in "wax+"):
            return real_open(file, mode, *args, **kwargs)
        if injector.point("open", file):
            raise injector.os_error(file)
        return _File(real_open(file, mode, *args, **kwargs), injector, file)

    class Connection(sqlite3.Connection):
        def commit(self) -> None:
            if injector.point("sqlite commit"):
                raise injector.sqlite_error()
            super().commit()

        def __exit__(self, kind: Any, value: Any, tb: Any) -> Any:
            # ``with connection:`` commits in C, past commit() (local Qdrant's persistence writes so)
            if kind is None and injector.point("sqlite commit"):
                super().rollback()
                raise injector.sqlite_error()
            return super().__exit__(kind, value, tb)

        def backup(self, target: Any, *args: Any, **kwargs: Any) -> None:
            if injector.point("sqlite backup"):
                raise injector.sqlite_error()
            super().backup(target, *args, **kwargs)

    real_connect = sqlite3.connect

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        kwargs.setdefault("factory", Connection)
        return real_connect(*args, **kwargs)

    patch(os, "replace", before("os.replace", os.replace))
    patch(os, "rename", before("os.rename", os.rename))
    patch(os, "fsync", before("os.fsync", os.fsync))
    patch(shutil, "copy2", before("shutil.copy2", shutil.copy2, 1))
    patch(sqlite3, "connect", connect)
    for name in OPEN_MODULES:
        if name in sys.modules:  # (the Qdrant modules only where the run uses them)
            patch(sys.modules[name], "open", opening)
    edge = sys.modules.get("care_retriever.stores.qdrant.edge")
    if edge is not None:

        def engine(label: str, real: Any, done: bool) -> Any:
            def wrapped(shard: Any, *args: Any, **kwargs: Any) -> Any:
                if injector.point(label, shard.path):
                    raise injector.os_error(shard.path)
                result = real(shard, *args, **kwargs)
                if done and injector.point(f"{label} done", shard.path):
                    raise injector.os_error(shard.path)
                return result

            return wrapped

        for name in EDGE_WRITES:
            patch(edge.EdgeShard, name, engine(f"edge {name}", getattr(edge.EdgeShard, name), name in EDGE_WRITES_DONE))
    try:
        yield injector
    finally:
        for owner, name, value, existed in reversed(saved):
            if existed:
                setattr(owner, name, value)
            else:
                delattr(owner, name)


# ------------------------------------------------------------------------------------------------ scenarios
def vector(text: str) -> np.ndarray:
    """A unit vector from the text (deterministic across processes)."""
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")
    v = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def documents(ids_texts: list[tuple[str, str]]) -> list[Any]:
    from care_retriever.indexing.corpus import Document

    return [Document(id=i, text=t) for i, t in ids_texts]


OLD = [(f"d{i}", f"老版本 文档 {i} 高血压 糖尿病") for i in range(10)]
# the write: three documents changed, ten added, one deleted
CHANGED = [(f"d{i}", f"新版本 文档 {i} 冠心病") for i in range(3)]
ADDED = [(f"n{i}", f"新增 文档 {i} 肺炎 咳嗽") for i in range(10)]
DELETED = ["d9"]


def expected_old() -> dict[str, str]:
    return {d.id: d.content_hash() for d in documents(OLD)}


def expected_new() -> dict[str, str]:
    out = expected_old()
    out.update({d.id: d.content_hash() for d in documents(CHANGED + ADDED)})
    for i in DELETED:
        out.pop(i)
    return out


def _upsert(store: Any, pairs: list[tuple[str, str]]) -> None:
    docs = documents(pairs)
    store.upsert(docs, np.stack([vector(d.text) for d in docs]))


def is_qdrant(kind: str) -> bool:
    return kind in QDRANT_OPTIONS


def prepare_store(store: Any, kind: str) -> None:
    from care_retriever.stores.config import QdrantCollectionConfig

    options = QDRANT_OPTIONS.get(kind)
    store.prepare(DIM, FINGERPRINT, "fault-model", QdrantCollectionConfig(**options) if options else None)


def seed(kind: str, folder: Path) -> None:
    """The old version: ten documents, published."""
    store = open_scenario_store(kind, folder)
    prepare_store(store, kind)
    _upsert(store, OLD)
    store.finalize()
    store.close()


def prepare_modules(kind: str) -> None:
    """Import what the scenario writes with before :func:`armed` wraps the ``open`` of those modules."""
    for name in OPEN_MODULES:
        if is_qdrant(kind) or "qdrant" not in name:
            importlib.import_module(name)


def open_scenario_store(kind: str, folder: Path) -> Any:
    from care_retriever.stores import open_store

    return open_store(f"{'qdrant' if is_qdrant(kind) else 'faiss'}:{folder}")


def write(kind: str, folder: Path) -> None:
    """The write under test, from a store opened afresh: ``staged`` (a bulk write through the staging folder,
    checkpointed half-way), ``in-place`` (one transaction on the published store), ``fold`` (the same, folding its
    delta into index.faiss), ``qdrant`` (Qdrant Edge), ``qdrant-segments`` (the same, whose first commit optimizes:
    ``index --max-segment-size``)."""
    store = open_scenario_store(kind, folder)
    try:
        if kind == "staged" or is_qdrant(kind):
            prepare_store(store, kind)
            _upsert(store, CHANGED + ADDED[:5])
            store.commit()
            _upsert(store, ADDED[5:])
            store.delete(DELETED)
            store.finalize()
        else:
            from care_retriever.stores.faiss import journal

            saved = journal.FOLD_MIN_BYTES, journal.FOLD_RATIO
            if kind == "fold":  # this transaction folds its delta into a new index.faiss
                journal.FOLD_MIN_BYTES, journal.FOLD_RATIO = 0, 0.0
            try:
                with store.transaction():
                    _upsert(store, CHANGED + ADDED)
                    store.delete(DELETED)
            finally:
                journal.FOLD_MIN_BYTES, journal.FOLD_RATIO = saved
    finally:
        store.close()


def contents(kind: str, folder: Path) -> tuple[dict[str, str], int]:
    """(id -> content hash of every stored document, what verify counts), from a store opened afresh."""
    store = open_scenario_store(kind, folder)
    try:
        found = {d.id: d.content_hash() for d in store.iter_documents()}
        try:
            return found, store.verify()
        except Exception as exc:
            # A FAISS writer stopped between its commit and its manifest: verify names the files it could not
            # check (never "ok"); recorded on request, after every other check, they are then checked.
            if "not checked:" not in str(exc):
                raise
            return found, store.verify(record_checksums=True)
    finally:
        store.close()


if __name__ == "__main__":
    scenario, where, at = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    prepare_modules(scenario)
    with armed(Injector(kill_at=at)) as injector:
        write(scenario, where)
    print(f"finished after {injector.count} points", flush=True)
