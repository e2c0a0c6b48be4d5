"""Free space for Qdrant Edge's writes, checked before the engine runs them.

Edge writes through memory-mapped files (its log, vectors, payloads): a full disk there is a SIGBUS that ends the
process, not an error (verified with a filled tmpfs, docs/scale.md). So the store refuses a write the disk cannot
hold, in one line, before the engine runs it. A disk filled by another writer during the engine's call still ends
the process, like kill -9: the shard reopens with what its log holds.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

# free space kept beyond a write's own bytes: the engine's log and mapped files grow by whole pages and chunks
SPACE_MARGIN = 4 * 1024 * 1024
# Opening or creating a shard writes a 32 MiB log segment in full (measured on a tmpfs: a load with less free space
# dies of SIGBUS), besides ~3.2 MB of flag and doc_id index files: refused in one line below this
OPEN_SHARD = 40 * 1024 * 1024


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_blocks * 512 for f in folder.rglob("*") if f.is_file())


class SpaceRefused(OSError):
    """ENOSPC from :func:`require_space`: the write was refused before the engine ran it, so the open shard holds what
    its folder holds (nothing to reopen: reopening a shard on a full disk is itself a SIGBUS, see
    :func:`room_to_open`)."""


def require_space(folder: Path, needed: int) -> None:
    """A :class:`SpaceRefused` (an OSError, ENOSPC) unless ``folder``'s disk has ``needed`` bytes free beyond the
    margin."""
    if shutil.disk_usage(folder).free < needed + SPACE_MARGIN:
        raise SpaceRefused(errno.ENOSPC, os.strerror(errno.ENOSPC), str(folder))


def room_to_open(folder: Path) -> bool:
    """Whether ``folder``'s disk can take the log that opening a shard there writes (below it, a load can die of
    SIGBUS: a disk filled to the last byte ended a fault handler's reopen so; reads then open a copy,
    :mod:`edge_readonly`)."""
    return shutil.disk_usage(folder).free >= OPEN_SHARD
