"""The SQLite docstore of a FAISS store: one row per document, keyed by the row id its vector has in the
FAISS index. The functions take the connection; the store serialises access with its lock."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from care_retriever.documents import Document
from care_retriever.errors import StoreError
from care_retriever.stores.base import Hit
from care_retriever.stores.faiss import filter_sql

SCHEMA = """
CREATE TABLE IF NOT EXISTS documents (
    row_id INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    text TEXT NOT NULL,
    title TEXT NOT NULL DEFAULT '',
    metadata TEXT NOT NULL DEFAULT '{}',
    content_hash TEXT NOT NULL
);
"""
COLUMNS = {"row_id", "id", "text", "title", "metadata", "content_hash"}
CHUNK = 500  # ids bound in one IN (...) query: well under SQLite's limit on bound parameters


def connect(path: Path) -> sqlite3.Connection:
    try:
        db = sqlite3.connect(str(path), check_same_thread=False, isolation_level="DEFERRED")
        filter_sql.add_functions(db)
        db.execute(SCHEMA)
        db.execute("PRAGMA synchronous=FULL")
        return db
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{path}: corrupted docstore ({exc})") from exc


def open_published(path: Path, *, writable: bool) -> sqlite3.Connection:
    """A published store's docstore, as it is: nothing is created in it, and a reader's connection refuses writes
    (reading never changes a store file). An empty or foreign database is one line here, not 0 hits later."""
    try:
        db = sqlite3.connect(str(path), check_same_thread=False, isolation_level="DEFERRED")
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{path}: corrupted docstore ({exc})") from exc
    filter_sql.add_functions(db)
    try:
        db.execute(f"PRAGMA query_only={0 if writable else 1}")
        db.execute("PRAGMA synchronous=FULL")
        columns = {row[1] for row in db.execute("PRAGMA table_info(documents)")}
    except sqlite3.DatabaseError as exc:
        db.close()
        raise StoreError(f"{path}: corrupted docstore ({exc})") from exc
    if not columns >= COLUMNS:
        db.close()
        what = "is empty" if not path.stat().st_size else "is another database (no care-retriever documents table)"
        raise StoreError(f"{path}: the docstore {what}; restore the file from a copy or re-index into a new store")
    return db


def backup(db: sqlite3.Connection, path: Path) -> None:
    """Copy the docstore to ``path`` with SQLite's backup API (committed WAL pages included)."""
    target = sqlite3.connect(str(path))
    try:
        db.backup(target)
    finally:
        target.close()


def _chunks(values: Sequence[Any]) -> Iterator[list[Any]]:
    for start in range(0, len(values), CHUNK):
        yield list(values[start : start + CHUNK])


def _marks(chunk: Sequence[Any]) -> str:
    return ",".join("?" * len(chunk))


def count(db: sqlite3.Connection) -> int:
    return int(db.execute("SELECT COUNT(*) FROM documents").fetchone()[0])


def max_row_id(db: sqlite3.Connection) -> int:
    """The highest row id in the docstore, -1 when it is empty."""
    row = db.execute("SELECT MAX(row_id) FROM documents").fetchone()[0]
    return row if row is not None else -1


def all_row_ids(db: sqlite3.Connection) -> set[int]:
    return {r for (r,) in db.execute("SELECT row_id FROM documents")}


def content_hashes(db: sqlite3.Connection, ids: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for chunk in _chunks(ids):
        out.update(db.execute(f"SELECT id, content_hash FROM documents WHERE id IN ({_marks(chunk)})", chunk))
    return out


def row_ids(db: sqlite3.Connection, ids: Sequence[str]) -> dict[str, int]:
    """Row id of each stored document id (ids not stored are left out)."""
    out: dict[str, int] = {}
    for chunk in _chunks(ids):
        out.update(db.execute(f"SELECT id, row_id FROM documents WHERE id IN ({_marks(chunk)})", chunk))
    return out


def insert(db: sqlite3.Connection, rows: Sequence[int], documents: Sequence[Document]) -> None:
    db.executemany(
        "INSERT INTO documents(row_id, id, text, title, metadata, content_hash) VALUES (?,?,?,?,?,?)",
        [
            (int(r), d.id, d.text, d.title, json.dumps(d.metadata, ensure_ascii=False), d.content_hash())
            for r, d in zip(rows, documents, strict=True)
        ],
    )


def delete_rows(db: sqlite3.Connection, rows: Sequence[int]) -> None:
    db.executemany("DELETE FROM documents WHERE row_id = ?", [(r,) for r in rows])


def documents_by_row(db: sqlite3.Connection, rows: set[int], payload: bool = True) -> dict[int, Document]:
    """Stored documents by row id; without ``payload``, their ids alone (no text, no metadata parsing)."""
    out: dict[int, Document] = {}
    columns = "row_id, id, text, title, metadata" if payload else "row_id, id"
    for chunk in _chunks(list(rows)):
        for rid, did, *rest in db.execute(f"SELECT {columns} FROM documents WHERE row_id IN ({_marks(chunk)})", chunk):
            if payload:
                text, title, meta = rest
                out[rid] = Document(id=did, text=text, title=title, metadata=json.loads(meta))
            else:
                out[rid] = Document(id=did, text="")
    return out


def documents_by_id(db: sqlite3.Connection, ids: Sequence[str]) -> dict[str, Document]:
    found: dict[str, Document] = {}
    for chunk in _chunks(ids):
        for did, text, title, meta in db.execute(
            f"SELECT id, text, title, metadata FROM documents WHERE id IN ({_marks(chunk)})", chunk
        ):
            found[did] = Document(id=did, text=text, title=title, metadata=json.loads(meta))
    return found


def page(db: sqlite3.Connection, after: int, limit: int) -> list[tuple[int, Document]]:
    """Up to ``limit`` (row id, document) with row ids above ``after``, in row order."""
    rows = db.execute(
        "SELECT row_id, id, text, title, metadata FROM documents WHERE row_id > ? ORDER BY row_id LIMIT ?",
        (after, limit),
    ).fetchall()
    return [
        (rid, Document(id=did, text=text, title=title, metadata=json.loads(meta)))
        for rid, did, text, title, meta in rows
    ]


def read_blocks(
    db: sqlite3.Connection, path: Path, size: int = 65_536
) -> Iterator[list[tuple[int, str, str, str, str, str]]]:
    """Every row (row id, id, text, title, metadata, content hash) after SQLite's own integrity check, ``size`` rows
    at a time in row-id order: a store of any size is read in bounded memory."""
    try:
        problems = [r for (r,) in db.execute("PRAGMA integrity_check") if r != "ok"]
        if problems:
            raise StoreError(f"{path}: corrupted docstore ({problems[0]})")
        last = -1
        while rows := db.execute(
            "SELECT row_id, id, text, title, metadata, content_hash FROM documents WHERE row_id > ? "
            "ORDER BY row_id LIMIT ?",
            (last, size),
        ).fetchall():
            yield rows
            last = rows[-1][0]
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{path}: corrupted docstore ({exc})") from exc


def check_content(rows: Sequence[tuple[int, str, str, str, str, str]], path: Path) -> None:
    """Each row read by :func:`read_blocks` parses and matches its content hash."""
    for _rid, did, text, title, meta, digest in rows:
        try:
            doc = Document(id=did, text=text, title=title, metadata=json.loads(meta))
        except (TypeError, ValueError) as exc:
            raise StoreError(f"{path}: document {did!r} is unreadable ({exc})") from exc
        if doc.content_hash() != digest:
            raise StoreError(f"{path}: document {did!r} does not match its content hash")


def hits(ranked: Sequence[tuple[int, float]], docs: dict[int, Document], limit: int) -> list[Hit]:
    """Hits for ranked (row id, score) pairs, at most ``limit``; rows gone from the docstore are left out."""
    out = []
    for row_id, score in ranked:
        if (doc := docs.get(row_id)) is not None:
            out.append(Hit(id=doc.id, score=score, text=doc.text, title=doc.title, metadata=doc.metadata))
            if len(out) == limit:
                break
    return out
