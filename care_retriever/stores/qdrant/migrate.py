"""Converting a qdrant-client local-mode collection of an earlier release into a Qdrant Edge store
(``care-retriever migrate``): ids, dense vectors, payloads, the settings and the model's fingerprint carried over,
the BM25 side rebuilt with the recorded parameters and compared with the old sparse vectors, counts verified. The
old folder is only read."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from care_retriever.documents import Document
from care_retriever.errors import InputError, StoreError
from care_retriever.stores.qdrant.edge_store import EdgeStore
from care_retriever.stores.qdrant.legacy import LocalModeReader

logger = logging.getLogger("care_retriever")


def migrate_local(
    old: Path, new: Path, collection: str = "care", *, progress: Callable[[int], None] | None = None
) -> int:
    """Convert a local-mode collection into a new Qdrant Edge store; returns the points carried over.

    Resumable: points already in the target with the same content hash are skipped. Refuses a target of another
    model. The old folder is only read."""
    from care_retriever.sparse.tokenizer import tokenize, tokenizer_spec
    from care_retriever.stores.config import QdrantCollectionConfig

    if old.resolve() == new.resolve():
        raise InputError(f"qdrant:{old}: the new store must be another folder (the old one is kept as it is)")
    source = LocalModeReader(old, collection)
    target = EdgeStore(str(new), collection)
    try:
        manifest = source.manifest
        config = QdrantCollectionConfig.from_manifest(manifest.index).local_mode()
        target.prepare(manifest.dim, manifest.space_fingerprint, manifest.model_name, config, metric=manifest.metric)
        _check_target_holds_only(target, source)
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


def _check_target_holds_only(target: EdgeStore, source: LocalModeReader) -> None:
    """Refuse, before any write, a target holding a document the old store has not: the conversion would merge the
    two stores, then fail its count check with the target changed."""
    for records in target.scroll(["doc_id"], False):
        missing = source.missing([str(r.id) for r in records])
        if missing:
            doc_id = next(r.payload.get("doc_id") for r in records if str(r.id) in missing)
            raise InputError(
                f"{target.describe()}: holds {doc_id!r}, which {source.describe} has not; "
                "migrate into another folder (an empty one, or one an earlier migrate of this store wrote)"
            )


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
