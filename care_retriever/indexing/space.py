"""What an ``index`` run will write, estimated before it encodes, so that a disk that cannot hold it is said in
one line instead of failing hours later (:func:`care_retriever.faults.check_free_space`).

The estimate is an upper bound of what the run adds: every document of the corpus the store does not hold yet,
its vector (``dim`` float32, twice for a quantized store's rescoring file), its row in the docstore (text,
title, metadata, content hash: about the corpus's bytes per document plus a fixed overhead), the BM25 side
where asked (about the text again), and for a FAISS store the staging copy of the published store plus one
checkpoint's temporary index beside the staged one.
"""

from __future__ import annotations

from pathlib import Path

from care_retriever import faults

ROW_OVERHEAD = 256  # bytes per docstore row beyond the corpus's own: row id, content hash, keys, SQLite pages
SPARSE_FACTOR = 1.5  # the BM25 postings, per byte of text
QDRANT_FACTOR = 2.0  # local Qdrant's pickled points hold the vector and payload with their Python overhead


def estimate_index_bytes(
    *,
    new_documents: int,
    corpus_bytes_per_document: float,
    dim: int,
    backend: str,
    published_bytes: int = 0,
    quantized: bool = False,
    sparse: bool,
) -> int:
    """Bytes an ``index`` run may write for ``new_documents`` documents (see the module's docstring)."""
    vector = dim * 4
    row = corpus_bytes_per_document + ROW_OVERHEAD
    per_document = vector * (2 if quantized else 1) + row + (corpus_bytes_per_document * SPARSE_FACTOR if sparse else 0)
    if backend == "qdrant":
        return int(new_documents * per_document * QDRANT_FACTOR)
    index_bytes = new_documents * vector  # the staged index.faiss grows by this, and a checkpoint writes it again
    return int(published_bytes + new_documents * per_document + index_bytes + published_bytes)


def check_index_space(
    store_path: Path,
    *,
    total: int,
    stored: int,
    corpus_bytes: int,
    dim: int,
    backend: str,
    published_bytes: int = 0,
    quantized: bool = False,
    sparse: bool,
) -> int:
    """Refuse in one line an ``index`` run whose estimate exceeds the free space where ``store_path`` lives;
    returns the estimate."""
    new = max(total - stored, 0)
    needed = estimate_index_bytes(
        new_documents=new,
        corpus_bytes_per_document=corpus_bytes / max(total, 1),
        dim=dim,
        backend=backend,
        published_bytes=published_bytes,
        quantized=quantized,
        sparse=sparse,
    )
    faults.check_free_space(store_path, needed, f"indexing {new} new documents into {store_path}")
    return needed


def check_store_space(store: object, *, total: int, corpus: Path, dim: int, sparse: bool, options: object) -> None:
    """:func:`check_index_space` for an opened store (FAISS, or Qdrant's local mode; a server's disk is its own)."""
    from care_retriever.stores.config import Quantize, StoreKind, as_faiss_config

    backend = str(getattr(store, "backend", ""))
    if backend == StoreKind.FAISS:
        path = Path(store.path)  # type: ignore[attr-defined]
        quantized = as_faiss_config(options).quantization is not Quantize.NONE  # type: ignore[arg-type]
        published = faults.folder_size(path)
    else:
        location = str(getattr(store, "location", ""))
        if location == ":memory:" or "://" in location:
            return
        path, quantized, published = Path(location), False, 0
    check_index_space(
        path,
        total=total,
        stored=store.count(),  # type: ignore[attr-defined]
        corpus_bytes=corpus.stat().st_size,
        dim=dim,
        backend=backend,
        published_bytes=published,
        quantized=quantized,
        sparse=sparse,
    )
