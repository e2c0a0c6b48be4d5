"""Stores written by earlier releases into qdrant-client's local mode, recognised and converted to Qdrant Edge.

A local-mode folder holds ``meta.json`` and ``collection/NAME/storage.sqlite`` (qdrant-client's layout); an Edge
store holds ``NAME/shard`` and ``NAME/manifest.json``. Opening a local-mode folder as ``qdrant:PATH`` says so in one
line naming the command; ``care-retriever migrate --from qdrant:OLD --to qdrant:NEW``
(:func:`care_retriever.stores.qdrant.migrate.migrate_local`) reads it with :class:`LocalModeReader`, qdrant-client's
local mode kept only as this reader.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from care_retriever.documents import Document
from care_retriever.errors import InputError, StoreError
from care_retriever.stores.base import Manifest

logger = logging.getLogger("care_retriever")

MIGRATE_COMMAND = "care-retriever migrate --from qdrant:{old} --to qdrant:NEW_FOLDER"


def is_local_mode(folder: Path, collection: str | None = None) -> bool:
    """Whether ``folder`` holds qdrant-client local-mode storage (of ``collection``, when named)."""
    if not (folder / "meta.json").is_file() or not (folder / "collection").is_dir():
        return False
    return collection is None or (folder / "collection" / collection).is_dir()


def refuse_foreign_folder(folder: Path, collection: str) -> None:
    """One line when ``folder`` or its ``collection`` is another kind of store, nothing touched: a FAISS store (a
    collection written in it is lost when the next bulk FAISS write swaps the folder for its new version), or a
    store of an earlier release (naming the conversion command)."""
    if (folder / "manifest.json").is_file():  # a FAISS store's; an Edge store keeps one per collection, NAME/
        raise InputError(f"qdrant:{folder} is a FAISS store (faiss:{folder}); a Qdrant store needs a folder of its own")
    inside = folder / collection  # a FAISS store there would get the collection's manifest written over its own
    if (inside / "index.faiss").exists() or (inside / "docstore.sqlite").exists():
        raise InputError(
            f"qdrant:{folder} collection {collection!r}: {inside} is a FAISS store (faiss:{inside}); "
            "name another collection"
        )
    if is_local_mode(folder) and not (folder / collection / "shard").is_dir():
        raise StoreError(
            f"qdrant:{folder} is a store of an earlier care-retriever (qdrant-client local mode); convert it to "
            f"Qdrant Edge, re-encoding nothing: {MIGRATE_COMMAND.format(old=folder)}"
            + (f" --collection {collection}" if collection != "care" else "")
        )


class LocalModeReader:
    """One collection of a local-mode folder, read through qdrant-client (its one remaining use for a path)."""

    def __init__(self, folder: Path, collection: str) -> None:
        from care_retriever.stores.qdrant.common import MANIFEST_KEY
        from care_retriever.stores.qdrant.server_settings import client

        if not is_local_mode(folder, collection):
            raise InputError(f"qdrant:{folder}: no qdrant-client local-mode collection {collection!r} there")
        self.describe = f"qdrant:{folder} (collection {collection}, qdrant-client local mode)"
        self.collection = collection
        self.client = client(str(folder))
        info = self.client.get_collection(collection)
        raw = (info.config.metadata or {}).get(MANIFEST_KEY)
        if raw is None:
            self.client.close()
            raise StoreError(f"{self.describe}: collection exists but was not written by care-retriever")
        self.manifest = Manifest.from_dict(raw, self.describe)

    def count(self) -> int:
        return int(self.client.count(self.collection, exact=True).count)

    def batches(self, size: int = 256) -> Iterator[list[tuple[Document, np.ndarray, Any]]]:
        """Every point as (document, dense vector, old sparse vector or None)."""
        from care_retriever.sparse.qdrant_sparse import VECTOR
        from care_retriever.stores.qdrant.common import dense_vector, document_of

        offset = None
        while True:
            points, offset = self.client.scroll(
                self.collection, limit=size, offset=offset, with_payload=True, with_vectors=True
            )
            yield [
                (
                    document_of(p.payload),
                    dense_vector(p.vector),
                    p.vector.get(VECTOR) if isinstance(p.vector, dict) else None,
                )
                for p in points
            ]
            if offset is None:
                return

    def missing(self, point_ids: list[str]) -> set[str]:
        """Which of ``point_ids`` this collection does not hold."""
        found = self.client.retrieve(self.collection, point_ids, with_payload=False, with_vectors=False)
        return set(point_ids) - {str(p.id) for p in found}

    def close(self) -> None:
        self.client.close()
