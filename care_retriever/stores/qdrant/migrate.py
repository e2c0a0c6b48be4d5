"""Converting a qdrant-client local-mode collection of an earlier release into a Qdrant Edge store
(``care-retriever migrate``): ids, dense vectors, payloads, the settings and the model's fingerprint carried over,
the BM25 side rebuilt with the recorded parameters and compared with the old sparse vectors, counts verified. The
old folder is only read."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from care_retriever.documents import Document
from care_retriever.errors import InputError, StoreError
from care_retriever.stores.qdrant.edge_store import EdgeStore
from care_retriever.stores.qdrant.legacy import LocalModeReader

logger = logging.getLogger("care_retriever")


@dataclass(frozen=True)
class Migrated:
    """What a conversion did: the documents the target holds, and how many an earlier run had carried over."""

    documents: int
    already: int  # found in the target with the same content: an earlier run (stopped, or finished) wrote them

    def describe(self) -> str:
        if not self.already:
            return f"{self.documents} documents"
        return f"{self.documents} documents ({self.already} of them already there from an earlier run)"


def migrate_local(
    old: Path, new: Path, collection: str = "care", *, progress: Callable[[int], None] | None = None
) -> Migrated:
    """Convert a local-mode collection into a new Qdrant Edge store.

    Every payload is checked before anything is written (:func:`legacy.document_of_point`: converted, or refused
    in one line naming the point, with no target created). Resumable: points already in the target with the same
    content hash are skipped, and counted as such. Refuses a target of another model, or one holding a document
    the old store has not. The old folder is only read."""
    from care_retriever.sparse.tokenizer import tokenize, tokenizer_spec
    from care_retriever.stores.config import QdrantCollectionConfig

    if old.resolve() == new.resolve():
        raise InputError(f"qdrant:{old}: the new store must be another folder (the old one is kept as it is)")
    source = LocalModeReader(old, collection)
    try:
        held = source.document_ids()
        target = EdgeStore(str(new), collection)
    except BaseException:
        source.close()
        raise
    try:
        manifest = source.manifest
        config = QdrantCollectionConfig.from_manifest(manifest.index).local_mode()
        _check_target_holds_only(target, held, source.describe)
        target.prepare(manifest.dim, manifest.space_fingerprint, manifest.model_name, config, metric=manifest.metric)
        target_manifest = target.require_manifest()
        carry_sparse = bool(manifest.sparse) and manifest.sparse.get("tokenizer") == tokenizer_spec()
        if carry_sparse:
            target_manifest.sparse = dict(manifest.sparse)  # the same avgdl, k1, b: the same sparse vectors
        moved = already = 0
        for batch in source.batches():
            have = target.content_hashes([d.id for d, _, _ in batch])
            todo = [(d, v, s) for d, v, s in batch if have.get(d.id) != d.content_hash()]
            already += len(batch) - len(todo)
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
        return Migrated(moved, already)
    finally:
        target.close()
        source.close()


def _check_target_holds_only(target: EdgeStore, held: set[str], source: str) -> None:
    """Refuse, before any write, a target holding a document the old store has not (``held``: its document ids):
    the conversion would merge the two stores, then fail its count check with the target changed."""
    for records in target.scroll(["doc_id"], False):
        extra = next((r.payload.get("doc_id") for r in records if r.payload.get("doc_id") not in held), None)
        if extra is not None:
            raise InputError(
                f"{target.describe()}: holds {extra!r}, which {source} has not; "
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
