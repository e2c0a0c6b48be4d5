"""Faults of the file system a write meets, said in one line: disk full, I/O error, permission denied,
read-only file system; free space checked before long work; path arguments of the wrong kind.

Every writer (FAISS and Qdrant stores, training saves, ``export``, ``init``) runs its writes inside
:func:`writing`, which turns the operating system's error (an ``OSError``, SQLite's ``OperationalError``
"database or disk is full" or FAISS's ``RuntimeError`` from ``fwrite``) into a :class:`WriteError` naming
the file and what was being written. Errors that are not a fault of the file system go on as they were.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from care_retriever.errors import InputError, WriteError

# errno -> what the user is told
REASONS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EFBIG: "the file is too large for the file system",
    errno.EIO: "an I/O error (the disk failed to write)",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EROFS: "the file system is read-only",
    # a path of the wrong kind met while writing
    errno.ENOTDIR: "a file is in the way where a folder is wanted",
    errno.EISDIR: "a folder is in the way where a file is wanted",
    errno.EEXIST: "a file is in the way where a folder is wanted",
    errno.EBUSY: "the folder cannot be renamed (a mount point, or busy)",
}
# SQLite's messages (sqlite3.OperationalError carries no errno) -> what the user is told
SQLITE_REASONS = {
    "database or disk is full": REASONS[errno.ENOSPC],
    "disk i/o error": REASONS[errno.EIO],
    "attempt to write a readonly database": "the database is read-only (permission denied or a read-only file system)",
    "unable to open database file": "the database file cannot be opened (permission denied or a missing folder)",
}
# FAISS's fwrite/fopen failures arrive as RuntimeError whose text ends with strerror(errno)
FAISS_MARKERS = ("fwrite", "fopen", "could not open", "write error", "ret == (n)")


def reason_of(exc: BaseException) -> str | None:
    """The one-line cause of a file-system fault, or None when ``exc`` is not one."""
    if isinstance(exc, OSError) and exc.errno in REASONS:
        return REASONS[exc.errno]
    if isinstance(exc, sqlite3.OperationalError):
        text = str(exc).lower()
        for marker, reason in SQLITE_REASONS.items():
            if marker in text:
                return reason
        return None
    if isinstance(exc, RuntimeError):  # FAISS
        text = str(exc)
        if any(m in text.lower() for m in FAISS_MARKERS):
            for code, reason in REASONS.items():
                if os.strerror(code) in text:
                    return reason
            return "the file could not be written"
    return None


def filename_of(exc: BaseException) -> str | None:
    name = getattr(exc, "filename", None)
    return str(name) if isinstance(name, (str, os.PathLike)) and str(name) else None  # not a file descriptor


@contextlib.contextmanager
def writing(path: object, what: str, *, unchanged: str = "") -> Iterator[None]:
    """Run a write of ``what`` into ``path``; a file-system fault becomes a one-line :class:`WriteError`.

    ``unchanged``: what the message promises is left as it was ("the published store is unchanged").
    """
    try:
        yield
    except WriteError:
        raise
    except (OSError, sqlite3.OperationalError, RuntimeError) as exc:
        reason = reason_of(exc)
        if reason is None:
            raise
        raise write_error(path, what, exc, reason, unchanged) from exc


def write_error(path: object, what: str, exc: BaseException, reason: str, unchanged: str = "") -> WriteError:
    where = filename_of(exc) or str(path)
    tail = f"; {unchanged}" if unchanged else ""
    head = f"{where}: " if where else ""
    return WriteError(f"{head}cannot write {what}: {reason}{tail}", path=where, reason=reason)


# ---------------------------------------------------------------------------------------- free space
def free_bytes(path: Path) -> int:
    """Bytes free on the file system that holds ``path`` (or its nearest existing parent)."""
    probe = Path(path).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def check_free_space(path: Path, needed: int, what: str) -> None:
    """Refuse, in one line, work that will write ``needed`` bytes under ``path`` when the disk cannot hold them."""
    free = free_bytes(path)
    if needed > free:
        raise WriteError(
            f"{path}: not enough free space for {what}: about {human(needed)} needed, {human(free)} free; "
            "free some space or write elsewhere",
            path=path,
            reason=REASONS[errno.ENOSPC],
        )


def folder_size(path: Path) -> int:
    """Bytes of the regular files under ``path`` (0 when it does not exist)."""
    if not path.is_dir():
        return 0
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ---------------------------------------------------------------------------------------- path kinds
def require_folder(path: Path, what: str, *, writable: bool = False) -> None:
    """``path`` must be a folder or not exist yet (then its parent decides); one line otherwise, the path untouched."""
    if path.exists() and not path.is_dir():
        raise InputError(f"{path}: {what} must be a folder, but this is a file")
    if writable:
        _require_writable(path if path.exists() else _nearest_existing(path.parent), what)


def require_output_file(path: Path, what: str) -> None:
    """``path`` can become a file: not a folder, below a folder that exists (or can be made) and takes writes; one
    line otherwise, before the work whose result it is meant to hold."""
    if path.is_dir():
        raise InputError(f"{path}: {what} must be a file, but this is a folder")
    _require_writable(_nearest_existing(path.parent), what)  # the folders missing below it are made when written


def _require_writable(probe: Path, what: str) -> None:
    """``probe``, the path itself or the nearest folder of it that exists, is a folder that takes writes; one line
    otherwise."""
    if probe.exists() and not probe.is_dir():
        raise InputError(f"{probe}: {what} must be inside a folder, but this is a file")
    if not os.access(probe, os.W_OK | os.X_OK):
        reason = REASONS[errno.EROFS] if _read_only_fs(probe) else REASONS[errno.EACCES]
        raise InputError(f"{probe}: cannot write {what} here: {reason}")


def require_file(path: Path, what: str) -> None:
    """``path`` must be a readable file; one line otherwise."""
    if not path.exists():
        raise InputError(f"{path}: {what} not found")
    if path.is_dir():
        raise InputError(f"{path}: {what} must be a file, but this is a folder")
    if not os.access(path, os.R_OK):
        raise InputError(f"{path}: cannot read {what}: {REASONS[errno.EACCES]}")


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _read_only_fs(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False
