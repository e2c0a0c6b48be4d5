"""The delta journal of a FAISS store (format 2): small writes in place without rewriting index.faiss.

vectors.delta holds fixed-size records (op 'A' add / 'D' delete, row id, vector) appended since the last
fold; the docstore's ``care_meta`` table records the counts, the committed length of the delta and the size
of index.faiss. The SQLite commit that records the delta's new length is the commit point: a delta tail past
it is ignored on open and cut by the next writer. Once the delta outgrows half of index.faiss it is folded
into a new index.faiss (amortised cost per write); a fold killed half-way is rolled forward on open.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import faiss
import numpy as np

from care_retriever.errors import StoreError
from care_retriever.stores.faiss import files
from care_retriever.stores.faiss.files import DELTA, DOCSTORE, INDEX, NEXT_INDEX

META_SCHEMA = "CREATE TABLE IF NOT EXISTS care_meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)"
ADD, REMOVE = ord("A"), ord("D")
FOLD_MIN_BYTES = 4 << 20  # a delta smaller than this is never folded (replaying it costs little)
FOLD_RATIO = 0.5  # fold once the delta outgrows this fraction of index.faiss: amortised O(1) per written byte


def delta_dtype(dim: int) -> np.dtype:
    """One delta record: op byte, row id, vector (a removal carries a zero vector: fixed-size records)."""
    return np.dtype([("op", "u1"), ("row", "<i8"), ("vec", "<f4", (dim,))])


def records(op: int, rows: np.ndarray, vectors: np.ndarray | None, dim: int) -> np.ndarray:
    """Delta records for one change: ``rows`` added with ``vectors``, or removed (``vectors`` None)."""
    out = np.zeros(len(rows), dtype=delta_dtype(dim))
    out["op"], out["row"] = op, rows
    if vectors is not None:
        out["vec"] = vectors
    return out


def read_meta(db: sqlite3.Connection, folder: Path) -> dict[str, int]:
    """The journal's bookkeeping in ``folder``'s docstore; empty for a format-1 store (no meta table)."""
    try:
        return dict(db.execute("SELECT key, value FROM care_meta"))
    except sqlite3.OperationalError:  # format 1: no meta table
        return {}
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{folder / DOCSTORE}: corrupted docstore ({exc})") from exc


def set_meta(db: sqlite3.Connection, **values: int) -> None:
    """Record ``values`` in the docstore's current transaction (committed with it)."""
    db.executemany("INSERT OR REPLACE INTO care_meta(key, value) VALUES (?, ?)", list(values.items()))


def start_meta(db: sqlite3.Connection, index_file: Path, count: int, tombstones: int) -> None:
    """The journal's bookkeeping for ``index_file`` with nothing in the delta yet (committed)."""
    db.execute(META_SCHEMA)
    set_meta(
        db, count=count, tombstones=tombstones, delta_bytes=0, fold_pending=0, index_bytes=index_file.stat().st_size
    )
    db.commit()


def published_version(db: sqlite3.Connection, folder: Path) -> tuple[int, int, dict[str, int]]:
    """(inode of index.faiss, committed delta bytes, the journal's meta) as the last commit left them."""
    meta = read_meta(db, folder)
    return (folder / INDEX).stat().st_ino, int(meta.get("delta_bytes", 0)), meta


def roll_fold_forward(folder: Path, meta: dict[str, int]) -> None:
    """Finish a fold that was recorded in the docstore but not yet renamed into place."""
    if meta.get("fold_pending") and (folder / NEXT_INDEX).exists():
        os.replace(folder / NEXT_INDEX, folder / INDEX)


def check_sizes(folder: Path, meta: dict[str, int], recorded_index_bytes: int | None) -> None:
    """index.faiss has the size the store recorded, and vectors.delta holds at least the committed length."""
    expected = meta.get("index_bytes", recorded_index_bytes)
    for name, size in ((INDEX, expected), (DELTA, meta.get("delta_bytes"))):
        actual = (folder / name).stat().st_size if (folder / name).exists() else 0
        if size is not None and (actual != size if name == INDEX else actual < size):
            raise StoreError(
                f"{folder / name}: size mismatch ({actual} bytes, the store recorded {size}); "
                "the file is truncated or corrupted"
            )


def replay(index: faiss.Index, folder: Path, start: int, stop: int, dim: int, removable: bool) -> None:
    """Apply the committed delta records in ``[start, stop)`` bytes to the in-memory ``index``;
    ``removable``: whether the index can remove vectors (an HNSW index keeps them as tombstones)."""
    if stop <= start:
        return
    dtype = delta_dtype(dim)
    if (stop - start) % dtype.itemsize:
        raise StoreError(f"{folder / DELTA}: committed length {stop} is not a whole number of records")
    with open(folder / DELTA, "rb") as fh:
        fh.seek(start)
        found = np.frombuffer(fh.read(stop - start), dtype=dtype)
    if not np.isin(found["op"], (ADD, REMOVE)).all():
        raise StoreError(f"{folder / DELTA}: unknown record type; the file is corrupted")
    # Consecutive records of one kind are applied in one call (row ids are never reused).
    edges = np.flatnonzero(np.diff(found["op"])) + 1
    for run in np.split(found, edges):
        rows = np.ascontiguousarray(run["row"], dtype=np.int64)
        if run["op"][0] == ADD:
            index.add_with_ids(np.ascontiguousarray(run["vec"], dtype=np.float32), rows)
        elif removable:
            index.remove_ids(rows)


def append(folder: Path, committed: int, data: bytes) -> int:
    """Append ``data`` after the committed length (cutting a killed writer's uncommitted tail), durably;
    returns the new length, which the caller commits in the docstore (the commit point)."""
    created = not (folder / DELTA).exists()
    with open(folder / DELTA, "ab") as fh:
        fh.truncate(committed)  # a killed writer's uncommitted tail
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    if created:
        files.fsync_dir(folder)
    return committed + len(data)


def needs_fold(folder: Path, committed: int) -> bool:
    return committed > max(FOLD_MIN_BYTES, (folder / INDEX).stat().st_size * FOLD_RATIO)


def fold(db: sqlite3.Connection, index: faiss.Index, folder: Path) -> int:
    """Write the in-memory ``index`` (delta applied) as the new index.faiss and empty the delta; returns the
    inode of the new index.faiss."""
    nxt = folder / NEXT_INDEX
    try:
        files.write_index_file(index, nxt)
    except BaseException:
        files.remove_quietly(nxt)  # not recorded yet: the store keeps its index.faiss, and the space is freed
        raise
    set_meta(db, delta_bytes=0, fold_pending=1, index_bytes=nxt.stat().st_size)
    db.commit()  # from here on, opening the store rolls the fold forward
    os.replace(nxt, folder / INDEX)
    files.fsync_dir(folder)
    with open(folder / DELTA, "ab") as fh:
        fh.truncate(0)
    set_meta(db, fold_pending=0)
    db.commit()
    return (folder / INDEX).stat().st_ino
