"""Stores written by earlier releases into qdrant-client's local mode, recognised and converted to Qdrant Edge.

A local-mode folder holds ``meta.json`` and ``collection/NAME/storage.sqlite`` (qdrant-client's layout); an Edge
store holds ``NAME/shard`` and ``NAME/manifest.json``. Opening a local-mode folder as ``qdrant:PATH`` says so in one
line naming the command; ``care-retriever migrate --from qdrant:OLD --to qdrant:NEW`` (:func:`migrate_local`)
reads it with qdrant-client's local mode (kept only as this reader) and writes every point into a new Edge store:
ids, dense vectors, payloads and the model's fingerprint carried over, the BM25 side rebuilt with the recorded
parameters (its sparse vectors compared with the old ones), counts verified. The old folder is left as it was.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from care_retriever.documents import Document
from care_retriever.errors import InputError, StoreError
from care_retriever.stores.base import Manifest

if TYPE_CHECKING:
    from care_retriever.stores.qdrant.edge_store import EdgeStore

logger = logging.getLogger("care_retriever")

MIGRATE_COMMAND = "care-retriever migrate --from qdrant:{old} --to qdrant:NEW_FOLDER"


def is_local_mode(folder: Path, collection: str | None = None) -> bool:
    """Whether ``folder`` holds qdrant-client local-mode storage (of ``collection``, when named)."""
    if not (folder / "meta.json").is_file() or not (folder / "collection").is_dir():
        return False
    return collection is None or (folder / "collection" / collection).is_dir()


def refuse_local_mode(folder: Path, collection: str) -> None:
    """One line naming the conversion command when ``folder`` is a store of an earlier release (nothing touched)."""
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

    def close(self) -> None:
        self.client.close()


def migrate_local(
    old: Path, new: Path, collection: str = "care", *, progress: Callable[[int], None] | None = None
) -> int:
    """Convert a local-mode collection into a new Qdrant Edge store; returns the points carried over.

    Resumable: points already in the target with the same content hash are skipped. Refuses a target of another
    model. The old folder is only read."""
    from care_retriever.sparse.tokenizer import tokenize, tokenizer_spec
    from care_retriever.stores.config import QdrantCollectionConfig
    from care_retriever.stores.qdrant.edge_store import EdgeStore

    if old.resolve() == new.resolve():
        raise InputError(f"qdrant:{old}: the new store must be another folder (the old one is kept as it is)")
    source = LocalModeReader(old, collection)
    target = EdgeStore(str(new), collection)
    try:
        manifest = source.manifest
        config = QdrantCollectionConfig.from_manifest(manifest.index).local_mode()
        target.prepare(manifest.dim, manifest.space_fingerprint, manifest.model_name, config, metric=manifest.metric)
        target_manifest = target.require_manifest()
        carry_sparse = bool(manifest.sparse) and manifest.sparse.get("tokenizer") == tokenizer_spec()
        if carry_sparse:
            target_manifest.sparse = dict(manifest.sparse)  # the same avgdl, k1, b: the same sparse vectors
        moved = 0
        for batch in source.batches():
            have = target.content_hashes([d.id for d, _, _ in batch])
            todo = [(d, v, s) for d, v, s in batch if have.get(d.id) != d.content_hash()]
            if todo:
                documents = [d for d, _, _ in todo]
                tokens = tokenize([d.embedding_text() for d in documents]) if carry_sparse else None
                target.upsert(documents, np.stack([v for _, v, _ in todo]), sparse_tokens=tokens)
                if carry_sparse:
                    _check_sparse(target, todo, source.describe)
            moved += len(batch)
            if progress is not None:
                progress(len(batch))
        if manifest.sparse and not carry_sparse:
            logger.warning("%s: its BM25 side was built with another tokenizer; rebuilt with this one", source.describe)
            target.enable_sparse(rebuild=True)
        target.finalize()
        expected, found, verified = source.count(), target.count(), target.verify()
        if not expected == found == verified:
            raise StoreError(
                f"{target.describe()}: {found} points after the conversion ({verified} verified); "
                f"{source.describe} holds {expected}"
            )
        return moved
    finally:
        target.close()
        source.close()


def _check_sparse(target: EdgeStore, written: list[tuple[Document, np.ndarray, Any]], source: str) -> None:
    """The rebuilt sparse vectors are the old ones (ids and weights), else one line."""
    from care_retriever.stores.qdrant.common import point_id

    ids = [point_id(d.id) for d, _, _ in written]
    records = {r.id: r.sparse for r in target.require_shard().retrieve(ids, ["doc_id"], True)}
    for (document, _, old), pid in zip(written, ids, strict=True):
        new = records.get(pid)
        if old is None:
            continue
        if new is None or list(old.indices) != new[0] or not np.allclose(old.values, new[1], rtol=1e-6):
            raise StoreError(f"{source}: the BM25 vector of {document.id!r} differs once converted")
