"""Quantized stores (format 3): the full-precision vectors in vectors.f32, on disk, and the rescoring of
the candidates that the compressed codes return with exact inner products read from that file.

vectors.f32 holds float32 rows at offset row id x 4 x dim; rows are written at their offsets (pwrite) and
made durable before the docstore commits them, so every committed row has its vector; they are read back with
positional reads (pread), not a memory map.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from care_retriever.errors import StoreError
from care_retriever.stores.faiss.files import VECTORS

QUANTIZED_FORMAT_VERSION = 3
RESCORE_BLOCK = 65536  # candidate rows read and scored at a time: bounded memory for large filtered sets


def check_vectors_file(folder: Path, dim: int, rows: np.ndarray, recorded: int | None, quantize: str) -> None:
    """A quantized store's rescoring vectors must exist and hold every row (never codes-only scores).

    ``rows``: the row ids the index holds; ``recorded``: the file's size in the manifest, if it has one."""
    path = folder / VECTORS
    if not path.is_file():
        raise StoreError(
            f"{path}: missing; this store keeps compressed codes ({quantize}) and "
            "rescores every search from these full-precision vectors: restore the file or re-index"
        )
    size, row_bytes = path.stat().st_size, 4 * dim
    need = (int(rows.max()) + 1) * row_bytes if len(rows) else 0
    if size < need or (recorded is not None and size < recorded):  # rows past it: an uncommitted write's
        raise StoreError(
            f"{path}: truncated ({size} bytes; the store's rows need {max(need, recorded or 0)}); "
            "restore the file or re-index"
        )


class _ReadOnly:
    """A file descriptor open for reading, closed when the last reader drops it."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_RDONLY)

    def __del__(self) -> None:
        os.close(self.fd)


class VectorFile:
    """The read side: rows of vectors.f32 (rows = row ids) read with positional reads, one per run of consecutive
    rows. The rows go through the page cache into the caller's array: unlike a memory map, the file's pages never
    count in this process's resident memory, which stays the codes' however many rows searches rescore."""

    def __init__(self) -> None:
        self._file: tuple[Path, _ReadOnly] | None = None

    def forget(self) -> None:
        """Drop the open file (it may have been replaced): the next read opens it again. A read under way keeps
        the file it holds."""
        self._file = None

    def read(self, folder: Path, dim: int, rows: np.ndarray) -> np.ndarray:
        """Full-precision vectors of ``rows`` (row ids) from ``folder``'s vectors.f32."""
        held = self._file
        if held is None or held[0] != folder:
            held = self._file = (folder, _ReadOnly(folder / VECTORS))
        fd, row_bytes = held[1].fd, 4 * dim
        rows = np.asarray(rows, dtype=np.int64)
        out = np.empty((len(rows), dim), dtype=np.float32)
        if len(rows) and int(rows.max()) >= os.fstat(fd).st_size // row_bytes:
            raise StoreError(
                f"{folder / VECTORS}: row {int(rows.max())} is past the end of the file; the file is truncated"
            )
        # runs of consecutive row ids: [starts[i], ends[i]) in ``rows``
        breaks = np.flatnonzero(np.diff(rows) != 1) + 1
        starts, ends = np.concatenate([[0], breaks]), np.concatenate([breaks, [len(rows)]])
        view = out.reshape(-1).view(np.uint8).data
        for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
            if start < end:
                want = (end - start) * row_bytes
                got = os.preadv(fd, [view[start * row_bytes : end * row_bytes]], int(rows[start]) * row_bytes)
                if got != want:
                    raise StoreError(f"{folder / VECTORS}: short read at row {int(rows[start])}; the file is truncated")
        return out


class VectorWriter:
    """The write side: a folder's vectors.f32 open for writing rows at their offsets."""

    def __init__(self) -> None:
        self._fd: int | None = None

    @property
    def is_open(self) -> bool:
        return self._fd is not None

    def open(self, folder: Path) -> None:
        self.close()
        self._fd = os.open(folder / VECTORS, os.O_RDWR | os.O_CREAT, 0o644)

    def write(self, first_row: int, vectors: np.ndarray) -> None:
        """Rows ``first_row, first_row + 1, ...`` at their offsets (durable after :meth:`sync`)."""
        if self._fd is not None:
            os.pwrite(self._fd, vectors.tobytes(), first_row * 4 * vectors.shape[1])

    def sync(self) -> None:
        """Every row written is on disk: called before the docstore commits those rows."""
        if self._fd is not None:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def candidates_wanted(top_k: int, tombstones: int, oversample: float, ntotal: int) -> int:
    """How many candidates to take from the codes: ``top_k x oversample`` (plus tombstones), at most the index."""
    return min(max(top_k + tombstones, math.ceil(top_k * oversample) + tombstones), ntotal)


def rescore(
    queries: np.ndarray,
    candidates: Sequence[np.ndarray],
    read: Callable[[np.ndarray], np.ndarray],
    want: int,
) -> list[list[tuple[int, float]]]:
    """Each query's best ``want`` (row id, exact inner product) among its candidate rows; ``read`` gives
    the full-precision vectors of sorted row ids."""
    out = []
    for query, rows in zip(queries, candidates, strict=True):
        rows = np.sort(rows)  # ascending offsets: sequential reads of the memory-mapped file
        scores = np.concatenate(
            [read(rows[i : i + RESCORE_BLOCK]) @ query for i in range(0, len(rows), RESCORE_BLOCK)] or [np.zeros(0)]
        )
        order = np.argsort(-scores, kind="stable")[:want]
        out.append([(int(rows[i]), float(scores[i])) for i in order])
    return out
