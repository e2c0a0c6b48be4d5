"""The embedded default store: a folder with a FAISS index, a SQLite docstore and a manifest.

Layout (also read by the Haystack and LangChain adapters)::

    DIR/manifest.json      Manifest: model fingerprint, dim, metric, count, index type, versions, the checksums
                           and sizes of every file as the last write left them, its own checksum (last field)
    DIR/index.faiss        faiss.IndexIDMap (format 1: IndexIDMap2) over Flat (exact IP), HNSW or IVF; ids = row ids
    DIR/docstore.sqlite    documents(row_id INTEGER PRIMARY KEY, id TEXT UNIQUE, text, title, metadata JSON,
                           content_hash)

    DIR/vectors.delta      (format 2) vectors written in place since the last fold: fixed-size records
                           (op: 'A' add / 'D' delete, row id, vector), replayed on open
    DIR/vectors.f32        (format 3, index option ``quantize`` other than none) the full-precision vectors,
                           float32 at offset row id x 4 x dim, memory-mapped: index.faiss then holds compressed
                           codes (sq8, RaBitQ 1-bit or PQ) and every search rescores its oversampled candidates
                           with exact inner products read from this file
    docstore care_meta     (format 2) count, tombstones, committed delta length, index.faiss size

Modules, one concern each:

* ``files``: file names, durable atomic writes, the manifest file, the writer lock, the staging folder and its swap
* ``integrity``: the checksums every write records and ``verify`` checks, and the cheap checks of an open
* ``index_factory``: index options, the FAISS index built for them (vectors or codes), ids, search parameters
* ``rescoring``: vectors.f32 (memory-mapped read, offset writes) and the rescoring of oversampled candidates
* ``docstore``: the SQLite documents table
* ``journal``: the delta journal (vectors.delta and care_meta), its replay and fold
* ``sparse``: the BM25 side and the hybrid fusion on row ids
* ``pending``: the run tag of a staged write and the one-line refusal naming what is pending
* ``session``: a staged bulk write and an in-place transaction as session objects
* ``opening``: the read state: the published version opened and checked, and followed across other writers
* ``reading``: search (dense, rescored, BM25, hybrid), filters, documents and vectors by id, counts
* ``writing``: ``begin`` in place, upsert, delete, commit, publish, abort and the BM25 side of either write
* ``store``: :class:`FaissStore`, which ties them together (the folder, the bulk write's staging copy, verify)
"""

from __future__ import annotations

from care_retriever.stores.faiss.files import DELTA, DOCSTORE, INDEX, MANIFEST, NEXT_INDEX, VECTORS
from care_retriever.stores.faiss.index_factory import QUANTIZE, checked_options, index_ids
from care_retriever.stores.faiss.store import FaissStore

__all__ = [
    "DELTA",
    "DOCSTORE",
    "INDEX",
    "MANIFEST",
    "NEXT_INDEX",
    "QUANTIZE",
    "VECTORS",
    "FaissStore",
    "checked_options",
    "index_ids",
]
