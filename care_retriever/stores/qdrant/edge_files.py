"""The checksums of a Qdrant Edge shard's files, recorded in the store's manifest at each commit and checked by
``verify``: part of the store (:mod:`edge_store`), kept in a file of its own.

The engine's bookkeeping (id trackers, segment metadata, payload indexes, HNSW graphs, quantized codes, the
write-ahead log) carries no checksum of its own, and a changed byte there can pass every per-point check
(:mod:`edge_verify`) or crash the engine as it loads the shard. So each commit records, for every file of the
shard, a checksum, its size and its modification time (``checksums``, ``sizes`` and ``sealed`` of the manifest,
keyed by the path under the collection folder). Only files whose size or modification time changed since the last
record are hashed again: the segments an optimize() built are written again only where points are deleted, so a
small write hashes the few files of the segment it appends to.

A checksum covers a file's content as read, not its layout on disk: blocks of zeros are skipped (a hole is read as
zeros), and the engine preallocates its files (32 MiB pages and logs), so hashing reads the data extents only
(``SEEK_DATA``) and a small write into a mostly empty page costs what it wrote. A copy that fills the holes with
zeros keeps the same checksums.

``care-retriever verify`` checks every file before the engine opens the shard (:mod:`edge_opening`), so that a
damaged file is named in one line rather than met by the engine. The engine also changes files as it opens a shard
(it replays and removes the journals of its trackers, completes ``edge_config.json``, rewrites an optimized
segment's ``id_tracker.versions`` after deletions, touches others): each open records what it changed, where the
file was as the last commit left it (its size and modification time as recorded), and hashes, before the engine
reads it, a file written since the last commit (:mod:`edge_opening`).
"""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from stat import S_ISREG

from care_retriever.errors import StoreError
from care_retriever.stores.base import Manifest
from care_retriever.stores.qdrant.edge import TEMP_SEGMENTS

BLOCK = 1 << 16  # the unit of the zero-skipping hash
_ZEROS = bytes(BLOCK)
LOG_BLOCK = 1 << 20  # a log segment's blocks, each with its checksum in the manifest's block_checksums
_LOG_ZEROS = bytes(LOG_BLOCK)
ZERO_BLOCK = hashlib.sha256(_LOG_ZEROS).hexdigest()
SHARD_FOLDER = "shard"  # the shard's folder inside the collection's
OPENED = "opened.json"  # in the shard's folder: what opens changed since the last commit (edge_opening)
# The stored texts and dense vectors: each point's bytes there are checked against its content hash and vector
# checksum (edge_verify), which name its document, and the engine reads them point by point, not as it opens.
POINT_DATA = ("payload_storage/page_*.dat", "vector_storage/vectors/chunk_*.mmap")
LOG_TEMPORARY = "tmp-"  # in wal/: a segment the log is making (renamed open-N when made)
LOG_MAGIC = b"wal\0"  # a log segment's first bytes; its header ends with a 4-byte seed, then come its entries
LOG_HEADER = 8


def file_checksum(path: Path) -> str:
    """SHA-256 of a file's size and of each non-zero block with its offset: the content as read, holes and
    zeros alike skipped."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        digest.update(size.to_bytes(8, "little"))
        for start, end in _data_extents(fh.fileno(), size):
            offset = start - start % BLOCK
            fh.seek(offset)
            while offset < end:
                block = fh.read(BLOCK)
                if not block:
                    break
                if block != _ZEROS[: len(block)]:
                    digest.update(offset.to_bytes(8, "little"))
                    digest.update(block)
                offset += len(block)
    return digest.hexdigest()


def _is_log(name: str) -> bool:
    """An open segment of the write-ahead log: written by appending only."""
    parts = name.split("/")
    return len(parts) == 3 and parts[1] == "wal" and parts[2].startswith("open-")


def log_blocks(path: Path, previous: list[str] | None = None) -> list[str]:
    """The SHA-256 of each :data:`LOG_BLOCK` of a log segment (of a block of zeros: :data:`ZERO_BLOCK`; holes are
    not read). The log is written by appending, so, given the blocks recorded before (``previous``) of the same
    segment (its size and first block unchanged), only the last of them that held data and those after are read."""
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        count = -(-size // LOG_BLOCK)
        with_data = {i for s, e in _data_extents(fh.fileno(), size) for i in range(s // LOG_BLOCK, -(-e // LOG_BLOCK))}

        def block(index: int) -> str:
            if index not in with_data:
                return ZERO_BLOCK
            fh.seek(index * LOG_BLOCK)
            data = fh.read(LOG_BLOCK)
            return ZERO_BLOCK if data == _LOG_ZEROS[: len(data)] else hashlib.sha256(data).hexdigest()

        blocks = list(previous or [])
        if len(blocks) != count or not blocks or block(0) != blocks[0]:
            blocks = []
        start = max((i for i, b in enumerate(blocks) if b != ZERO_BLOCK), default=0)
        return blocks[:start] + [block(i) for i in range(start, count)]


def _log_root(blocks: list[str], size: int) -> str:
    """The checksum of a log segment: of its size and its blocks' checksums."""
    return hashlib.sha256(size.to_bytes(8, "little") + "".join(blocks).encode()).hexdigest()


def checksum_of(shard: Path, name: str) -> str:
    """The checksum of the shard file ``name`` (its path under the collection folder), read whole."""
    path = shard.parent / name
    if _is_log(name):
        return _log_root(log_blocks(path), path.stat().st_size)
    return file_checksum(path)


def current_checksum(shard: Path, name: str, manifest: Manifest) -> str:
    """The checksum of ``name`` now, a log segment read from the last block with data ``manifest`` records (an
    open never writes the log: damage before that block stays a difference for ``verify``, which reads it whole)."""
    return _recorded(shard, name, manifest.block_checksums.get(name))[0]


def _recorded(shard: Path, name: str, previous: list[str] | None) -> tuple[str, list[str]]:
    """The checksum of ``name`` to record, and its blocks where it is a log segment (read from the last block
    recorded with data: :func:`log_blocks`)."""
    path = shard.parent / name
    if not _is_log(name):
        return file_checksum(path), []
    blocks = log_blocks(path, previous)
    return _log_root(blocks, path.stat().st_size), blocks


def _data_extents(descriptor: int, size: int) -> Iterator[tuple[int, int]]:
    """The (start, end) of each data extent, its end rounded up to a block (each block is read once); the rest of
    the file at once where the file system cannot say."""
    if not hasattr(os, "SEEK_DATA"):
        yield 0, size
        return
    offset = 0
    while offset < size:
        try:
            start = os.lseek(descriptor, offset, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # no SEEK_DATA on this file system: read the rest
                yield offset, size
            return  # ENXIO: a hole up to the end
        end = os.lseek(descriptor, start, os.SEEK_HOLE)
        end += -end % BLOCK
        yield start, min(end, size)
        offset = end


def shard_files(shard: Path) -> dict[str, os.stat_result]:
    """Every file of the shard (but a build an optimize() left, which the next open removes, ``opened.json``, and
    a log segment still being made, ``wal/tmp-*``): its path under the collection folder -> its stat, in path
    order. The log makes its next segment ahead, on a thread of its own, as ``tmp-open-N`` renamed ``open-N``
    (and removes a ``tmp-`` file as it opens), so such a file can come and go at any moment while the shard is
    open."""
    found = {}
    for folder, subfolders, names in os.walk(shard):
        at_top = folder == str(shard)
        subfolders[:] = [d for d in subfolders if not (at_top and d == TEMP_SEGMENTS)]
        prefix = Path(folder).relative_to(shard.parent).as_posix()
        in_log = prefix.endswith("/wal") and prefix.count("/") == 1
        for name in names:
            if (at_top and name.startswith(OPENED)) or (in_log and name.startswith(LOG_TEMPORARY)):
                continue
            try:
                info = os.stat(os.path.join(folder, name))
            except FileNotFoundError:  # renamed since the listing: the log's next segment, listed by name next time
                continue
            if S_ISREG(info.st_mode):
                found[f"{prefix}/{name}"] = info
    return dict(sorted(found.items()))


def made_ahead(shard: Path, name: str) -> bool:
    """Whether ``name`` is a log segment that holds no entry: the segment the log made ahead of need (its header,
    then zeros). It may appear after a commit listed the shard's files, and carries nothing to replay."""
    if not _is_log(name):
        return False
    path = shard.parent / name
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if fh.read(len(LOG_MAGIC)) != LOG_MAGIC:
                return False
            for start, end in _data_extents(fh.fileno(), size):
                offset = max(start, LOG_HEADER)
                fh.seek(offset)
                while offset < end:
                    block = fh.read(min(BLOCK, end - offset))
                    if not block:
                        break
                    if block.strip(b"\0"):
                        return False
                    offset += len(block)
    except FileNotFoundError:
        return False
    return True


def segment_of(name: str) -> str | None:
    parts = name.split("/")
    return "/".join(parts[:3]) if len(parts) > 3 and parts[1] == "segments" else None


def written_in_place(manifest: Manifest, shard: Path, files: dict[str, os.stat_result]) -> set[str]:
    """The files whose size and modification time may not show a write: the engine writes through memory maps,
    and a file system need not update the time of such a write (tmpfs does not). They are: the shard's settings,
    its open log segments, every ``segment.json``, the files of the appendable segments (those with a mutable id
    tracker) and of every segment whose ``segment.json`` changed (its version: it took a write, a deletion)."""
    found: set[str] = set()
    for name in files:
        parts = name.split("/")
        if len(parts) < 4 or parts[1] != "segments":
            if not (len(parts) == 3 and parts[1] == "wal" and parts[2].startswith("closed-")):
                found.add(name)  # a closed log segment is never written again
            continue
        segment = "/".join(parts[:3])
        if f"{segment}/mutable_id_tracker.mappings" in files or parts[-1] == "segment.json":
            found.add(name)
    changed = {
        name.rsplit("/", 1)[0]
        for name in found
        if name.endswith("/segment.json") and checksum_of(shard, name) != manifest.checksums.get(name)
    }
    return found | {name for name in files if "/".join(name.split("/")[:3]) in changed}


def record(manifest: Manifest, shard: Path) -> int:
    """Record each shard file's checksum, size and modification time in ``manifest``, hashing only the files
    changed since the last record (:func:`written_in_place`: always); returns how many were hashed."""
    files = shard_files(shard)
    in_place = written_in_place(manifest, shard, files)
    checksums, sizes, stamps = {}, {}, {}
    hashed = 0
    for name, stat in files.items():
        previous = manifest.checksums.get(name)
        if (
            previous
            and name not in in_place
            and (manifest.sizes.get(name), manifest.sealed.get(name)) == stamp_of(stat)
        ):
            checksums[name] = previous
        else:
            checksums[name], blocks = _recorded(shard, name, manifest.block_checksums.get(name))
            if blocks:
                manifest.block_checksums[name] = blocks
            hashed += 1
        sizes[name], stamps[name] = stat.st_size, stat.st_mtime_ns
    manifest.checksums, manifest.sizes, manifest.sealed = checksums, sizes, stamps
    manifest.block_checksums = {n: b for n, b in manifest.block_checksums.items() if n in files and _is_log(n)}
    (shard / OPENED).unlink(missing_ok=True)  # what opens changed is recorded now
    return hashed


def first_damage(
    manifest: Manifest,
    shard: Path,
    opened_damage: str | None = None,
    *,
    skip: tuple[str, ...] = (),
    unwritten: bool = False,
) -> str | None:
    """The first shard file that differs from what the last commit recorded (missing, added, resized or with
    another checksum), in words, those written since the record first; None when every file matches.
    ``opened_damage``: what :func:`opened` found in the files the engine changed as it opened the shard; ``skip``:
    patterns of files left out; ``unwritten``: only the files not written since the record."""
    if opened_damage is not None:
        return opened_damage
    files = shard_files(shard)

    def written_since(name: str) -> bool:  # checked first: where a change is likeliest
        stat = files.get(name)
        return stat is None or stamp_of(stat) != (manifest.sizes.get(name), manifest.sealed.get(name))

    for name in sorted(set(manifest.checksums) | set(files), key=lambda n: (not written_since(n), n)):
        if any(PurePosixPath(name).match(pattern) for pattern in skip) or (unwritten and written_since(name)):
            continue
        if name not in files:
            return f"{name} is missing (recorded at the last commit)"
        if name not in manifest.checksums:
            if made_ahead(shard, name):
                continue  # the log's next segment, made after the commit listed the files
            return f"{name} was not written by a commit of this store"
        if manifest.sizes.get(name) != files[name].st_size:
            return f"{name} has {files[name].st_size} bytes; the last commit recorded {manifest.sizes.get(name)}"
        if checksum_of(shard, name) != manifest.checksums[name]:
            return f"{name} no longer matches the checksum its last commit recorded"
    return None


def stamp_of(stat: os.stat_result) -> tuple[int, int]:
    return stat.st_size, stat.st_mtime_ns


def damaged(source: str, found: str) -> StoreError:
    """The line for a shard that differs from what its last commit recorded."""
    return StoreError(
        f"{source}: {found}: the shard changed after its last commit, damaged or by a writer that stopped before "
        "committing; not checked: what changed since (`care-retriever verify --record-checksums` records it as it "
        "is once every point passes; the same `index` again commits it)"
    )
