"""Quantized stores (format 3): the full-precision vectors in vectors.f32, memory-mapped, and the rescoring of
the candidates that the compressed codes return with exact inner products read from that file.

vectors.f32 holds float32 rows at offset row id x 4 x dim; rows are written at their offsets (pwrite) and
made durable before the docstore commits them, so every committed row has its vector.
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


class VectorFile:
    """The read side: vectors.f32 memory-mapped read-only, rows = row ids; remapped when it grew."""

    def __init__(self) -> None:
        self._vecs: np.ndarray | None = None
        self._folder: Path | None = None

    def forget(self) -> None:
        """Drop the mapping (the file may have grown or been replaced): the next read maps it again."""
        self._vecs, self._folder = None, None

    def read(self, folder: Path, dim: int, rows: np.ndarray) -> np.ndarray:
        """Full-precision vectors of ``rows`` (row ids) from ``folder``'s vectors.f32."""
        top = int(rows.max()) if len(rows) else -1
        if self._vecs is None or self._folder != folder or top >= len(self._vecs):
            # (Re)mapped when rows were written past the mapped length (writes extend the file).
            count = (folder / VECTORS).stat().st_size // (4 * dim)
            self._vecs = (
                np.memmap(folder / VECTORS, dtype=np.float32, mode="r", shape=(count, dim))
                if count
                else np.zeros((0, dim), dtype=np.float32)
            )
            self._folder = folder
            if top >= count:
                raise StoreError(f"{folder / VECTORS}: row {top} is past the end of the file; the file is truncated")
        return np.asarray(self._vecs[rows])


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
