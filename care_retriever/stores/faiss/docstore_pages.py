"""Which pages of the docstore a small write changed, so that its checksums hash those pages and no others.

An in-place write runs the docstore in SQLite's write-ahead log: every page the write changes is a frame of
``docstore.sqlite-wal`` (file format: https://www.sqlite.org/fileformat2.html#walformat), named by its page
number. Before the log is folded into the file, :func:`logged_pages` reads those numbers; afterwards the
docstore goes back to its rollback journal (:func:`leave_wal`), so that a reader needs no shared-memory file of
the log (a read-only or full disk cannot hold one); where another process holds the docstore open, it stays in
WAL mode until a later write can switch it back. SQLite's checksum VFS keeps one checksum per page for the same
reason; here the checksums live in the manifest, one per block of pages (:mod:`integrity`).
"""

from __future__ import annotations

import contextlib
import sqlite3
import struct
from collections.abc import Iterator
from pathlib import Path

WAL_HEADER = 32  # bytes: magic, format, page size, checkpoint sequence, two salts, two checksums
FRAME_HEADER = 24  # bytes: page number, size after a commit, the log's two salts, two checksums
WAL_MAGIC = (0x377F0682, 0x377F0683)
BUSY_MS = 5000  # Python's default wait for a lock, restored after the non-waiting switch back


def wal_path(path: Path) -> Path:
    return path.with_name(path.name + "-wal")


def enter_wal(db: sqlite3.Connection) -> None:
    """Log this connection's writes in the WAL until :func:`leave_wal`; the log is folded only by the writer
    (after it has read which pages it holds), never automatically mid-write."""
    db.commit()  # the journal mode changes outside a transaction
    with _unsynced(db):
        db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA wal_autocheckpoint=0")


def leave_wal(db: sqlite3.Connection) -> None:
    """Back to the rollback journal (the log folded into the file). Another process holding the docstore open
    keeps it in WAL mode: the switch is then left to the next write, without waiting."""
    db.execute("PRAGMA busy_timeout=0")
    try:
        with _unsynced(db), contextlib.suppress(sqlite3.OperationalError):  # locked by another connection
            db.execute("PRAGMA journal_mode=DELETE")
    finally:
        db.execute(f"PRAGMA busy_timeout={BUSY_MS}")
        db.execute("PRAGMA wal_autocheckpoint=1000")


@contextlib.contextmanager
def _unsynced(db: sqlite3.Connection) -> Iterator[None]:
    """A switch of journal mode without its own fsyncs: it changes two header bytes and no row. The write's
    commit into the log and the fold that follows it are synced (``synchronous=FULL``); a switch to the log lost
    by a power cut leaves the docstore in its rollback journal, a switch back lost leaves it in WAL mode with the
    log folded: the rows are the same either way."""
    db.execute("PRAGMA synchronous=OFF")
    try:
        yield
    finally:
        db.execute("PRAGMA synchronous=FULL")


def logged_pages(path: Path) -> tuple[int, set[int]] | None:
    """(page size, byte offsets of the pages) that the WAL of the docstore at ``path`` holds, or None where there
    is no log to read (the docstore was not in WAL mode, or its log is unreadable): every page is then changed.

    Frames of an earlier generation of the log (other salts) were folded before this one began, and are left out.
    """
    try:
        with open(wal_path(path), "rb") as fh:
            header = fh.read(WAL_HEADER)
            if len(header) < WAL_HEADER:
                return None
            magic, _, page_size, _, salt1, salt2 = struct.unpack(">6I", header[:24])
            if magic not in WAL_MAGIC or not page_size:
                return None
            offsets: set[int] = set()
            while True:
                frame = fh.read(FRAME_HEADER)
                if len(frame) < FRAME_HEADER:
                    break
                page, _, s1, s2 = struct.unpack(">4I", frame[:16])
                if (s1, s2) != (salt1, salt2):
                    break
                offsets.add((page - 1) * page_size)
                fh.seek(page_size, 1)
    except FileNotFoundError:
        return None
    return page_size, offsets
