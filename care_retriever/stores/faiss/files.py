"""The files of a FAISS store folder: their names, durable atomic writes, checksums, the writer lock and
the staging folder that a bulk write fills and then swaps into place."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import IO, Any

import faiss

from care_retriever.errors import StoreError
from care_retriever.stores.base import Manifest
from care_retriever.stores.manifest import MANIFEST_DIGEST as MANIFEST_DIGEST
from care_retriever.stores.manifest import manifest_bytes as manifest_bytes

MANIFEST = "manifest.json"
INDEX = "index.faiss"
DOCSTORE = "docstore.sqlite"
DELTA = "vectors.delta"
NEXT_INDEX = "index.faiss.next"  # a fold's new index, renamed over INDEX once the docstore records it
VECTORS = "vectors.f32"  # quantized stores: full-precision vectors by row id, the rescoring source


def staging_path(path: Path) -> Path:
    """Where a bulk write builds the next version of the store at ``path`` (beside it: same file system)."""
    return path.with_name(f".{path.name}.staging")


def old_path(path: Path) -> Path:
    """Where the previous version waits between the two renames of :func:`publish`."""
    return path.with_name(f".{path.name}.old")


def lock_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.lock")


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    with open(path, "rb+") as fh:
        os.fsync(fh.fileno())


def copy_durably(source: Path, target: Path) -> None:
    shutil.copy2(source, target)
    fsync_file(target)


def empty_folder(path: Path) -> None:
    """``path`` as a new empty folder (whatever was there is removed)."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)


def discard(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        remove_quietly(tmp)  # a failed write leaves no half file behind (the disk may be full)
        raise


def remove_quietly(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


def write_index_file(index: faiss.Index, path: Path) -> None:
    """Write ``index`` to ``path`` through a Python file, durably.

    FAISS's own file writer buffers with fwrite and reports a failed close only on stderr: on a full disk it
    leaves a truncated file and raises nothing. Through a Python file every failed write raises its OSError.
    """
    with open(path, "wb") as fh:
        writer = faiss.PyCallbackIOWriter(fh.write)
        try:
            faiss.write_index(index, writer)
        finally:
            del writer  # flushes its buffer into fh (raising what fh.write raises)
        fh.flush()
        os.fsync(fh.fileno())


def write_index_atomic(index: faiss.Index, path: Path) -> None:
    """Write ``index`` beside ``path``, make it durable, then rename it over ``path`` (a checkpoint)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        write_index_file(index, tmp)
        os.replace(tmp, path)
    except BaseException:
        remove_quietly(tmp)  # a failed checkpoint leaves the previous one, and no half file beside it
        raise


def read_manifest(path: Path, *, checkpoint_of: Path | None = None) -> Manifest:
    """The manifest at ``path``; ``checkpoint_of``: the staging folder it belongs to (named in the error)."""
    try:
        data = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError) as exc:  # unreadable, not UTF-8, not JSON
        if checkpoint_of is None:
            raise StoreError(f"{path}: unreadable manifest ({exc})") from exc
        raise StoreError(f"{path}: unreadable checkpoint manifest ({exc}); remove {checkpoint_of}") from exc
    return Manifest.from_dict(data, str(path))


def write_manifest(folder: Path, manifest: Manifest) -> None:
    write_atomic(folder / MANIFEST, manifest_bytes(manifest.to_dict()))
    fsync_dir(folder)


def publish(staging: Path, path: Path) -> None:
    """Swap the staging folder into place: readers see the old version or the new one, never a mix.

    A writer killed between the two renames leaves the old version at :func:`old_path` and the new one
    staged; the store serves the old one until the writer runs again.
    """
    old = old_path(path)
    shutil.rmtree(old, ignore_errors=True)
    if path.exists():
        path.rename(old)
    try:
        staging.rename(path)
    except BaseException:
        if old.exists() and not path.exists():  # put the previous version back: the store serves it unchanged
            old.rename(path)
        raise
    fsync_dir(path.parent)
    shutil.rmtree(old, ignore_errors=True)


class WriterLock:
    """One writer per store: an exclusive, non-blocking flock on ``.DIR.lock`` beside the store.

    Held until :meth:`release`; a dead writer's lock is freed by the OS.
    """

    def __init__(self, store_path: Path, owner: str) -> None:
        self.path = lock_path(store_path)
        self.owner = owner  # the store as named in the error
        self._fh: IO[Any] | None = None

    def acquire(self) -> None:
        if self._fh is not None:
            return
        try:
            import fcntl
        except ImportError:  # no flock (Windows): single-writer is then the caller's duty
            return
        import care_retriever.faults as faults

        with faults.writing(self.path, "the writer lock", unchanged="nothing was written"):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fh = open(self.path, "a+")  # noqa: SIM115 - held open while writing
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            fh.close()
            raise StoreError(
                f"{self.owner}: another writer is indexing into this store (lock {self.path}); wait for it to finish"
            ) from exc
        self._fh = fh

    def release(self) -> None:
        if self._fh is not None:
            with contextlib.suppress(OSError):
                self._fh.close()  # closing the file releases the flock
            self._fh = None
