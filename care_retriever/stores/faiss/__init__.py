"""The embedded default store: a folder with a FAISS index, a SQLite docstore and a manifest.

``store`` holds :class:`FaissStore`; the folder layout and the write paths are described there.
"""

from __future__ import annotations

from care_retriever.stores.faiss.store import (
    DELTA,
    DOCSTORE,
    INDEX,
    MANIFEST,
    NEXT_INDEX,
    QUANTIZE,
    VECTORS,
    FaissStore,
    index_ids,
)

__all__ = ["DELTA", "DOCSTORE", "INDEX", "MANIFEST", "NEXT_INDEX", "QUANTIZE", "VECTORS", "FaissStore", "index_ids"]
