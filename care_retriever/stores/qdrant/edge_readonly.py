"""Reading a Qdrant Edge store whose disk is full.

Qdrant Edge has no read-only open: loading a shard writes a fresh 32 MiB segment of its write-ahead log, which a
full disk cannot take (a SIGBUS, see :mod:`edge_space`). So, for reads, the collection folder is copied (its holes
left holes) into a temporary folder on another disk with room, and the copy is opened; the store then refuses
every write in one line, and removes the copy when it closes. Where no other disk has room, opening is refused in
one line that says how to read the store.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import tempfile
from pathlib import Path

from care_retriever import faults
from care_retriever.errors import WriteError
from care_retriever.paths import temporary_folder
from care_retriever.stores.qdrant.edge_space import OPEN_SHARD, SPACE_MARGIN, folder_bytes, room_to_open

logger = logging.getLogger("care_retriever")


def _copy_sparse(source: str, target: str) -> str:
    """Copy a file's data extents only (a memory-mapped chunk of Edge is mostly a hole), then its size and times."""
    if not hasattr(os, "SEEK_DATA"):
        return shutil.copy2(source, target)
    with open(source, "rb") as src, open(target, "wb") as dst:
        size = os.fstat(src.fileno()).st_size
        offset = 0
        while offset < size:
            try:
                start = os.lseek(src.fileno(), offset, os.SEEK_DATA)
            except OSError:  # ENXIO: a hole up to the end
                break
            end = os.lseek(src.fileno(), start, os.SEEK_HOLE)
            src.seek(start)
            dst.seek(start)
            while start < end:
                chunk = src.read(min(end - start, 1 << 20))
                if not chunk:
                    break
                dst.write(chunk)
                start += len(chunk)
            offset = end
        dst.truncate(size)
    shutil.copystat(source, target)
    return target


def _no_room(location: str, collection: str, folder: Path, how: str) -> WriteError:
    return faults.write_error(
        f"qdrant:{location}",
        f"the write-ahead log Qdrant Edge opens for collection {collection}",
        OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(folder)),
        faults.REASONS[errno.ENOSPC],
        f"opening needs {OPEN_SHARD >> 20} MB free, even to read; nothing was changed; {how}",
    )


def read_copy(folder: Path, location: str, collection: str, owner: object) -> Path | None:
    """None where the disk of the collection ``folder`` has room to open its shard. Otherwise a temporary copy of
    the folder on another disk (``TMPDIR``, or the system's temporary folder) to read instead, removed with
    ``owner`` at the latest; one line where that disk lacks room too."""
    if room_to_open(folder):
        return None
    scratch = Path(tempfile.gettempdir())
    needed = folder_bytes(folder) + OPEN_SHARD + SPACE_MARGIN
    how = (
        f"to read it meanwhile, free space there, or set TMPDIR to a folder on a disk with {faults.human(needed)} "
        "free (reads then open a temporary copy)"
    )
    if scratch.stat().st_dev == folder.stat().st_dev or shutil.disk_usage(scratch).free < needed:
        raise _no_room(location, collection, folder, how)
    holder = temporary_folder(owner, "care-qdrant-read-")
    try:
        shutil.copytree(folder, holder / folder.name, symlinks=True, copy_function=_copy_sparse)
    except BaseException:
        shutil.rmtree(holder, ignore_errors=True)
        raise
    logger.warning(
        "qdrant:%s: the disk is full (opening needs %d MB free); reading a temporary copy in %s, which takes no writes",
        location,
        OPEN_SHARD >> 20,
        holder,
    )
    return holder / folder.name


def refuse_write(location: str, collection: str, what: str) -> WriteError:
    """The line for a write into a store read from its copy (:func:`read_copy`)."""
    return faults.write_error(
        f"qdrant:{location}",
        f"{what} into collection {collection}",
        OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), location),
        faults.REASONS[errno.ENOSPC],
        f"the store was opened for reading from a copy (opening it for writing needs {OPEN_SHARD >> 20} MB free); "
        "nothing was changed",
    )
