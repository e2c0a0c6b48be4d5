"""What an ``index`` run will write, estimated before it encodes, so that a disk that cannot hold it is said in
one line instead of failing hours later (:func:`care_retriever.faults.check_free_space`).

The estimate is an upper bound of what the run adds: every document of the corpus the store does not hold yet,
its vector (``dim`` float32, twice for a quantized store's rescoring file), its row in the docstore (text,
title, metadata, content hash: about the corpus's bytes per document plus a fixed overhead), the BM25 side
where asked (about the text again), and for a FAISS store the staging copy of the published store plus one
checkpoint's temporary index beside the staged one. Where the store lives and what it copies and doubles is the
store's to say (:meth:`~care_retriever.stores.capabilities.IndexBuilding.local_footprint`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import care_retriever.faults as faults

if TYPE_CHECKING:
    from care_retriever.stores.base import VectorStore
    from care_retriever.stores.config import StoreConfig

ROW_OVERHEAD = 256  # bytes per docstore row beyond the corpus's own: row id, content hash, keys, SQLite pages
SPARSE_FACTOR = 1.5  # the BM25 postings, per byte of text
QDRANT_FACTOR = 2.0  # local Qdrant's pickled points hold the vector and payload with their Python overhead


@dataclass(frozen=True)
class WriteShape:
    """What each new document of a run costs on disk, besides its corpus bytes: the one list of what the
    estimate reads."""

    dim: int
    backend: str
    sparse: bool
    published_bytes: int = 0
    quantized: bool = False

    def estimate(self, new_documents: int, corpus_bytes_per_document: float) -> int:
        """Bytes a run may write for ``new_documents`` documents (see the module's docstring)."""
        vector = self.dim * 4
        row = corpus_bytes_per_document + ROW_OVERHEAD
        sparse = corpus_bytes_per_document * SPARSE_FACTOR if self.sparse else 0
        per_document = vector * (2 if self.quantized else 1) + row + sparse
        if self.backend == "qdrant":
            return int(new_documents * per_document * QDRANT_FACTOR)
        index_bytes = new_documents * vector  # the staged index.faiss grows by this, and a checkpoint writes it again
        return int(self.published_bytes + new_documents * per_document + index_bytes + self.published_bytes)


def check_index_space(store_path: Path, shape: WriteShape, *, total: int, stored: int, corpus_bytes: int) -> int:
    """Refuse in one line an ``index`` run whose estimate exceeds the free space where ``store_path`` lives;
    returns the estimate."""
    new = max(total - stored, 0)
    needed = shape.estimate(new, corpus_bytes / max(total, 1))
    faults.check_free_space(store_path, needed, f"indexing {new} new documents into {store_path}")
    return needed


def check_store_space(
    store: VectorStore, *, total: int, corpus: Path, dim: int, sparse: bool, index: StoreConfig
) -> None:
    """:func:`check_index_space` for an opened store, written with ``index`` (FAISS, or Qdrant's local mode; a
    server's disk is its own)."""
    from care_retriever.stores.capabilities import IndexBuilding

    # a store that builds no index on this machine has no local disk to check
    footprint = store.local_footprint(index) if isinstance(store, IndexBuilding) else None
    if footprint is None:
        return
    shape = WriteShape(
        dim=dim,
        backend=store.backend,
        sparse=sparse,
        published_bytes=footprint.published_bytes,
        quantized=footprint.quantized,
    )
    # a saved dataset is a folder of files: its bytes are theirs
    size = sum(f.stat().st_size for f in corpus.rglob("*") if f.is_file()) if corpus.is_dir() else corpus.stat().st_size
    check_index_space(footprint.path, shape, total=total, stored=store.count(), corpus_bytes=size)
