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


def document_of_point(point: Any, payload: Any, source: str) -> Document:
    """The document a local-mode point's payload holds. Converted: a numeric ``doc_id`` to its decimal string, a
    null or missing title to ``""``, null or missing metadata to ``{}``. Refused in one line naming the point: no
    payload, no ``doc_id``, no string ``text``, a title that is no string, metadata that is no JSON object."""

    def refuse(why: str) -> StoreError:
        return StoreError(f"{source}: point {point} {why}; nothing was converted (fix or remove it in the old store)")

    if not isinstance(payload, dict):
        raise refuse("has no payload")
    doc_id = payload.get("doc_id")
    if isinstance(doc_id, int) and not isinstance(doc_id, bool):
        doc_id = str(doc_id)
    if not isinstance(doc_id, str) or not doc_id:
        raise refuse(f"has no doc_id (a non-empty string or an integer; it holds {doc_id!r})")
    text, title, metadata = payload.get("text"), payload.get("title") or "", payload.get("metadata") or {}
    if not isinstance(text, str):
        raise refuse(f"({doc_id!r}) has no text (a string; it holds {text!r})")
    if not isinstance(title, str):
        raise refuse(f"({doc_id!r}) has a title that is no string ({title!r})")
    if not isinstance(metadata, dict):
        raise refuse(f"({doc_id!r}) has metadata that is no JSON object (a {type(metadata).__name__})")
    return Document(id=doc_id, text=text, title=title, metadata=metadata)


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
        """Every point as (document, dense vector, old sparse vector or None); a payload that is no document is
        one line naming the point (:func:`document_of_point`)."""
        from care_retriever.sparse.qdrant_sparse import VECTOR
        from care_retriever.stores.qdrant.common import dense_vector

        for points in self._scroll(size, vectors=True):
            yield [
                (
                    document_of_point(p.id, p.payload, self.describe),
                    dense_vector(p.vector),
                    p.vector.get(VECTOR) if isinstance(p.vector, dict) else None,
                )
                for p in points
            ]

    def document_ids(self, size: int = 1024) -> set[str]:
        """The id of every document, each payload checked first (read without the vectors): one line naming the
        first point that is no document, or the second point of an id that two carry."""
        seen: dict[str, Any] = {}
        for points in self._scroll(size, vectors=False):
            for point in points:
                doc_id = document_of_point(point.id, point.payload, self.describe).id
                if doc_id in seen:
                    raise StoreError(
                        f"{self.describe}: points {seen[doc_id]} and {point.id} both carry doc_id {doc_id!r}; "
                        "nothing was converted (remove one of them from the old store, or re-index the corpus)"
                    )
                seen[doc_id] = point.id
        return set(seen)

    def _scroll(self, size: int, *, vectors: bool) -> Iterator[list[Any]]:
        offset = None
        while True:
            points, offset = self.client.scroll(
                self.collection, limit=size, offset=offset, with_payload=True, with_vectors=vectors
            )
            yield points
            if offset is None:
                return

    def close(self) -> None:
        self.client.close()
