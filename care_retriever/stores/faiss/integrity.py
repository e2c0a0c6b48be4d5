"""Checksums that stay true: every write that changes a FAISS store's files records their checksums and sizes in
its manifest (the bulk write when it publishes, an in-place write after its commit), and ``verify`` checks every
file against them; the manifest carries its own checksum. Opening a store checks what is cheap (sizes, the
docstore's tables, counts and the manifest's fields against the files), never hashing a byte.

What each checksum covers (``Manifest.sizes[name]`` bytes from the start):

* ``index.faiss``: the whole file, hashed again by each write that changes it (a bulk write, a fold).
* ``docstore.sqlite``: one SHA-256 per block of :data:`PAGE_BLOCK` bytes (SQLite pages never straddle two). A
  small write hashes again the blocks holding the pages it changed, read from the docstore's write-ahead log
  before the log is folded (:mod:`docstore_pages`), the first block (its header) and whatever the file grew by.
* ``vectors.delta`` (its committed length) and ``vectors.f32`` grow by appending: hashed in blocks of
  :data:`BLOCK` bytes, so that a small write hashes the blocks it wrote, not the whole file. Bytes past the
  recorded size are an uncommitted write's, which the next writer overwrites.

A block's checksum is taken again only where a write changed it, so damage elsewhere stays caught by ``verify``.
Stores whose docstore was hashed whole (``Manifest.checksums``) verify so until their next write, which records
its blocks before it changes a byte.

``Manifest.sealed`` is the journal's bookkeeping (``care_meta``, committed with every write) that the checksums
describe. A writer killed after its commit and before its manifest leaves them describing the version before
it: the store is consistent, but a file that write changed no longer matches its checksum, and nothing tells a
changed file from a damaged one. ``verify`` then checks every file its checksum still vouches for and names the
others as not checked (one line, a non-zero exit), unless asked to record the checksums of the files as they are
(``verify --record-checksums``, after every other check has passed); the next write records them too. Stores
sealed before this bookkeeping existed keep their checksums as they are.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from pathlib import Path

import faiss

from care_retriever.errors import StoreError
from care_retriever.stores.base import Manifest
from care_retriever.stores.faiss import docstore, docstore_pages, files, journal
from care_retriever.stores.faiss.files import DELTA, DOCSTORE, INDEX, MANIFEST, MANIFEST_DIGEST, VECTORS

BLOCK = 64 << 20  # bytes hashed as one block of an appended file
PAGE_BLOCK = 256 << 10  # bytes hashed as one block of the docstore: a multiple of every SQLite page size
WHOLE = (INDEX,)  # hashed whole by each write that changes it
PAGED = (DOCSTORE,)  # hashed by blocks: a write hashes again the blocks of the pages it changed
APPENDED = (DELTA, VECTORS)  # hashed by blocks: a write hashes again from the first byte it wrote
READ = 1 << 20


def _hash_range(fh, length: int, path: Path) -> str:
    digest = hashlib.sha256()
    while length > 0:
        chunk = fh.read(min(READ, length))
        if not chunk:
            raise StoreError(f"{path}: truncated (shorter than the store recorded); the file is corrupted")
        digest.update(chunk)
        length -= len(chunk)
    return digest.hexdigest()


def prefix_sha256(path: Path, length: int) -> str:
    """SHA-256 of the first ``length`` bytes of ``path``."""
    with open(path, "rb") as fh:
        return _hash_range(fh, length, path)


# SQLite header fields that a change of journal mode rewrites outside any transaction (a writer stopped between
# the switch and its commit leaves them changed): the two format bytes (1: rollback journal, 2: WAL), the change
# counter and its copy. Their checksum leaves them out; :func:`check_sqlite_header` checks them for consistency.
JOURNAL_MODE = slice(18, 20)
CHANGE_COUNTER = slice(24, 28)
VALID_FOR = slice(92, 96)


def _masked_header(block: bytes) -> bytes:
    masked = bytearray(block)
    for field in (JOURNAL_MODE, CHANGE_COUNTER, VALID_FOR):
        masked[field] = bytes(field.stop - field.start)
    return bytes(masked)


def check_sqlite_header(path: Path) -> None:
    """The fields :func:`_masked_header` leaves out are consistent: both format bytes 1 or both 2, the change
    counter equal to its copy (so a flipped byte in either is caught)."""
    with open(path, "rb") as fh:
        header = fh.read(100)
    mode, counter, valid_for = header[JOURNAL_MODE], header[CHANGE_COUNTER], header[VALID_FOR]
    if len(header) < 100 or mode not in (b"\x01\x01", b"\x02\x02") or counter != valid_for:
        raise StoreError(f"{path}: SQLite header damaged (its format bytes or change counter); the file is corrupted")


def block_size(name: str) -> int:
    """Bytes per checksum block of the store file ``name``."""
    return PAGE_BLOCK if name in PAGED else BLOCK


def block_sha256(
    path: Path,
    length: int,
    known: list[str] | None = None,
    start: int = 0,
    *,
    size: int = BLOCK,
    changed: set[int] | None = None,
    sqlite: bool = False,
) -> list[str]:
    """SHA-256 of each block of ``size`` bytes of the first ``length`` bytes. A block keeps its ``known`` digest
    when it lies wholly before ``start`` (the first byte written since ``known`` was taken) and holds none of
    the byte offsets in ``changed``. ``sqlite``: the first block's digest leaves out the header fields a change
    of journal mode rewrites (:func:`check_sqlite_header`)."""
    known = known or []
    touched = {offset // size for offset in changed or ()}
    digests = []
    with open(path, "rb") as fh:
        for number, offset in enumerate(range(0, length, size)):
            if offset + size <= start and number < len(known) and number not in touched:
                digests.append(known[number])
                continue
            fh.seek(offset)
            if number == 0 and sqlite:
                block = fh.read(min(size, length))
                if len(block) < min(size, length):
                    raise StoreError(f"{path}: truncated (shorter than the store recorded); the file is corrupted")
                digests.append(hashlib.sha256(_masked_header(block)).hexdigest())
                continue
            digests.append(_hash_range(fh, min(size, length - offset), path))
    return digests


def _lengths(folder: Path, meta: dict[str, int]) -> dict[str, int]:
    """The bytes of each store file that the checksums cover."""
    lengths = {name: (folder / name).stat().st_size for name in (INDEX, DOCSTORE, VECTORS) if (folder / name).exists()}
    if meta.get("delta_bytes"):  # its committed records (a failed write may have appended to an empty one)
        lengths[DELTA] = int(meta["delta_bytes"])
    return lengths


def stale(manifest: Manifest, meta: dict[str, int]) -> bool:
    """Whether the manifest's checksums describe another version than the committed one (a writer killed between
    its commit and its manifest). Checksums recorded before ``sealed`` existed describe the published files."""
    if not manifest.sealed:
        return not manifest.checksums
    return manifest.sealed != meta


def seal(
    folder: Path,
    manifest: Manifest,
    meta: dict[str, int],
    written: dict[str, int] | None = None,
    pages: set[int] | None = None,
) -> None:
    """Record in ``manifest`` the checksums and sizes of ``folder``'s files as the commit ``meta`` left them.

    ``written``: file name -> first byte a write changed since the manifest's checksums were taken (files not
    named are unchanged); None: every file is hashed from its first byte. ``pages``: the byte offsets of the
    docstore pages the write changed (None: unknown, every block is hashed)."""
    lengths = _lengths(folder, meta)
    checksums, blocks = {}, {}
    for name, length in lengths.items():
        changed = written is None or name in written or manifest.sizes.get(name) != length
        if name in WHOLE:
            known = manifest.checksums.get(name)
            checksums[name] = prefix_sha256(folder / name, length) if changed or known is None else known
            continue
        before = manifest.sizes.get(name, 0)
        if written is None or (name in PAGED and pages is None and name in written):  # pages unknown: all
            start, offsets = 0, None
        elif name in PAGED:  # its header block always: a change of journal mode rewrites it outside the log
            start, offsets = min(before, length), {0} | (pages or set())
        else:
            start, offsets = min(written.get(name, length), before), None
        hashed, size, sqlite = manifest.block_checksums.get(name), block_size(name), name in PAGED
        blocks[name] = block_sha256(folder / name, length, hashed, start, size=size, changed=offsets, sqlite=sqlite)
    manifest.checksums, manifest.block_checksums, manifest.sizes = checksums, blocks, lengths
    manifest.sealed = dict(meta)
    manifest.updated_at = time.time()


def seal_published(db: sqlite3.Connection, folder: Path, manifest: Manifest, written: dict[str, int] | None) -> None:
    """After an in-place commit (``db``: the writer's connection): note the docstore pages its write-ahead log
    holds, fold the log into the file and return the docstore to its rollback journal, then record the
    checksums and write the manifest."""
    logged = docstore_pages.logged_pages(folder / DOCSTORE)
    busy = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    if busy is not None and busy[0]:  # a reader holds WAL pages: the file's bytes are not final yet
        manifest.updated_at = time.time()  # the checksums stay stale; the next write records them
    else:
        docstore_pages.leave_wal(db)
        seal(folder, manifest, journal.read_meta(db, folder), written, None if logged is None else logged[1])
    files.write_manifest(folder, manifest)


def seal_staged(folder: Path, manifest: Manifest) -> None:
    """A bulk write, before it publishes: every file of the staging ``folder`` hashed (its docstore closed)."""
    db = docstore.open_published(folder / DOCSTORE, writable=False)
    try:
        meta = journal.read_meta(db, folder)
    finally:
        db.close()
    seal(folder, manifest, meta)
    files.write_manifest(folder, manifest)


def reseal_if_stale(db: sqlite3.Connection, folder: Path, manifest: Manifest, *, force: bool = False) -> None:
    """Before an in-place write: checksums left stale by a killed writer (or ``force``: a format-1 store whose
    docstore just took the journal's table) are recorded again, so that this write's own are true."""
    if force or stale(manifest, journal.read_meta(db, folder)):
        seal_published(db, folder, manifest, None)
    else:
        hash_docstore_by_blocks(folder, manifest)


def hash_docstore_by_blocks(folder: Path, manifest: Manifest) -> None:
    """A docstore hashed whole takes block checksums before a write enters the write-ahead log: that switch
    rewrites header bytes its whole-file checksum covers, so a writer killed after it would leave an intact
    docstore failing ``verify``. Recorded only where the whole checksum still matches (damage stays caught)."""
    moved = False
    for name in PAGED:
        recorded, length = manifest.checksums.get(name), manifest.sizes.get(name)
        if recorded is None or length is None or prefix_sha256(folder / name, length) != recorded:
            continue
        manifest.block_checksums[name] = block_sha256(folder / name, length, size=block_size(name), sqlite=True)
        del manifest.checksums[name]
        moved = True
    if moved:
        files.write_manifest(folder, manifest)


# ------------------------------------------------------------------ checks
def check_on_open(db: sqlite3.Connection, folder: Path, manifest: Manifest, meta: dict[str, int]) -> None:
    """Cheap checks of a published store (no byte hashed): the journal's table where the format has one, the
    docstore's size and the manifest's count against the committed version."""
    if not meta and manifest.format_version >= 2:
        raise StoreError(
            f"{folder / DOCSTORE}: the docstore has no journal table (care_meta) although {MANIFEST} says "
            f"format {manifest.format_version}; it is not this store's docstore: restore it or re-index"
        )
    if stale(manifest, meta) or not manifest.sealed:
        return
    # Inside a read transaction: no writer commits (and changes the file) between the meta read and the stat.
    opened = not db.in_transaction
    if opened:
        db.execute("BEGIN")
    try:
        now = journal.read_meta(db, folder)
        size = (folder / DOCSTORE).stat().st_size
    finally:
        if opened:
            db.rollback()
    if now == manifest.sealed and DOCSTORE in manifest.sizes and size != manifest.sizes[DOCSTORE]:
        raise StoreError(
            f"{folder / DOCSTORE}: size mismatch ({size} bytes, {MANIFEST} records {manifest.sizes[DOCSTORE]}); "
            "the file is truncated, replaced or corrupted"
        )
    if now == manifest.sealed and "count" in now and manifest.count != now["count"]:
        raise StoreError(
            f"{folder / MANIFEST}: field 'count' is {manifest.count}, the docstore records {now['count']} documents; "
            "the manifest is damaged"
        )


def check_index(folder: Path, manifest: Manifest, index: faiss.Index) -> None:
    """The index read from ``folder`` holds vectors of the manifest's width."""
    if index.d != manifest.dim:
        raise StoreError(
            f"{folder / MANIFEST}: field 'dim' is {manifest.dim}, but {INDEX} holds {index.d}-dim vectors; "
            "the manifest is damaged"
        )


def check_manifest(path: Path) -> None:
    """The manifest file is byte for byte what care-retriever wrote (its own checksum, :data:`MANIFEST_DIGEST`)."""
    raw = path.read_bytes()
    try:
        data = json.loads(raw)
    except ValueError as exc:  # not UTF-8, not JSON: changed since the store opened
        raise StoreError(f"{path}: unreadable manifest ({exc})") from exc
    if not isinstance(data, dict):
        raise StoreError(f"{path}: malformed manifest (a JSON object expected)")
    if MANIFEST_DIGEST not in data:
        if data.get("sealed"):
            raise StoreError(f"{path}: field {MANIFEST_DIGEST!r} is missing; the manifest was edited or damaged")
        return  # written before the manifest had its own checksum
    if files.manifest_bytes(data) != raw:
        raise StoreError(
            f"{path}: checksum mismatch (field {MANIFEST_DIGEST!r}): the manifest was changed after it was written"
        )


def check_files(folder: Path, manifest: Manifest, meta: dict[str, int]) -> list[str]:
    """Every store file against the manifest's checksums (a mismatch raises); returns the files that could not
    be checked: where the checksums describe an earlier version (a writer stopped between its commit and its
    manifest: see the module docstring), those whose bytes differ from what they describe; [] otherwise."""
    if stale(manifest, meta):
        unchecked = []
        for name in sorted(set(_lengths(folder, meta)) | set(manifest.checksums) | set(manifest.block_checksums)):
            try:
                if manifest.sizes.get(name) != _lengths(folder, meta).get(name):
                    raise StoreError(f"{folder / name}: size changed")
                _check_file(folder, name, manifest)
            except StoreError:
                unchecked.append(name)
        return unchecked
    if manifest.sealed:  # every file present has its checksum
        for name in _lengths(folder, meta):
            if name not in manifest.checksums and name not in manifest.block_checksums:
                raise StoreError(f"{folder / MANIFEST}: no checksum for {name}; the manifest was edited or damaged")
    for name in [*manifest.checksums, *manifest.block_checksums]:
        _check_file(folder, name, manifest)
    return []


def _check_file(folder: Path, name: str, manifest: Manifest) -> None:
    """One file against its checksum (whole or by blocks) over the size the manifest records."""
    path = folder / name
    if not path.exists():
        raise StoreError(f"{path}: missing; the store is incomplete")
    if name in manifest.checksums:
        length = manifest.sizes.get(name, path.stat().st_size)
        if prefix_sha256(path, length) != manifest.checksums[name]:
            raise StoreError(f"{path}: checksum mismatch with {MANIFEST}; the file is corrupted")
        return
    expected_blocks = manifest.block_checksums.get(name)
    if expected_blocks is None:
        raise StoreError(f"{folder / MANIFEST}: no checksum for {name}")
    size = block_size(name)
    if name in PAGED:
        check_sqlite_header(path)
    found = block_sha256(path, manifest.sizes.get(name, 0), size=size, sqlite=name in PAGED)
    for number, (got, want) in enumerate(zip(found, expected_blocks, strict=False)):
        if got != want:
            first = number * size
            raise StoreError(
                f"{path}: checksum mismatch with {MANIFEST} in bytes {first}-{first + size - 1}; the file is corrupted"
            )
    if len(found) != len(expected_blocks):
        raise StoreError(f"{path}: checksum mismatch with {MANIFEST} (size); the file is corrupted")
