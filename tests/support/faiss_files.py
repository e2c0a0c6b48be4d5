"""A published FAISS store read from its files (the docstore and the index), as the store format defines them."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import faiss
import numpy as np

from care_retriever.stores.faiss import FaissStore, index_ids
from care_retriever.stores.faiss.files import DOCSTORE, INDEX


def published_faiss_state(folder: Path) -> dict[str, np.ndarray]:
    """id -> vector of a published FAISS store, after checking that its files hold exactly one vector per document
    (the docstore's row ids are the index's ids: no tombstone, no orphan) and that ``verify`` passes."""
    with closing(sqlite3.connect(f"file:{folder / DOCSTORE}?mode=ro", uri=True)) as db:
        rows = dict(db.execute("SELECT id, row_id FROM documents"))
    index = faiss.read_index(str(folder / INDEX))
    store = FaissStore(folder)
    try:
        assert store.count() == len(rows) == index.ntotal
        assert sorted(index_ids(index).tolist()) == sorted(rows.values())
        ids = sorted(rows)
        state = dict(zip(ids, store.vectors(ids), strict=True))  # IndexIDMap: no reconstruct by id of its own
        assert store.verify() == len(ids)
    finally:
        store.close()
    return state


def as_docstore_hashed_whole(folder: Path) -> None:
    """Rewrite a store's manifest as stores wrote it while the docstore was hashed whole (one SHA-256 of the file)."""
    import hashlib
    import json

    from care_retriever.stores.faiss.files import MANIFEST
    from care_retriever.stores.manifest import MANIFEST_DIGEST, manifest_bytes

    data = json.loads((folder / MANIFEST).read_text("utf-8"))
    data.pop(MANIFEST_DIGEST)
    del data["block_checksums"][DOCSTORE]
    data["checksums"][DOCSTORE] = hashlib.sha256((folder / DOCSTORE).read_bytes()).hexdigest()
    (folder / MANIFEST).write_bytes(manifest_bytes(data))
