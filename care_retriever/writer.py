"""``DocumentStoreWriter``: corpus -> document tower -> store.

Documents stream through in chunks (a corpus larger than memory goes through), are encoded by the
document tower only, and are upserted by id: unchanged documents (same content hash) are skipped
before encoding, so re-indexing the same corpus costs one read and adds nothing, and ``update``
re-encodes only new or changed documents. The store is checkpointed every ``checkpoint_every``
documents; a killed run resumes from the last checkpoint when the same command is run again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from itertools import islice
from typing import Any

from tqdm.auto import tqdm

from care_retriever.corpus import Document
from care_retriever.encoding import encode_texts
from care_retriever.stores import VectorStore, open_store

logger = logging.getLogger("care_retriever")


@dataclass
class WriteReport:
    store: str
    added: int = 0
    updated: int = 0
    unchanged: int = 0
    deleted: int = 0
    count: int = 0
    seconds: float = 0.0

    @property
    def encoded(self) -> int:
        return self.added + self.updated

    @property
    def docs_per_second(self) -> float:
        return self.encoded / self.seconds if self.seconds else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "docs_per_second": round(self.docs_per_second, 2)}


def _chunks(items: Iterable[Document], size: int) -> Iterator[list[Document]]:
    it = iter(items)
    while chunk := list(islice(it, size)):
        yield chunk


class DocumentStoreWriter:
    """Encode documents with the document tower and write them into a FAISS or Qdrant store."""

    def __init__(
        self,
        embedder: Any,
        store: str | VectorStore,
        *,
        collection: str | None = None,
        batch_size: int = 16,
        chunk_size: int = 1024,
        checkpoint_every: int = 8192,
        index_options: dict[str, Any] | None = None,
        show_progress: bool = True,
    ) -> None:
        self.embedder = embedder
        self.store = open_store(store, collection=collection)
        self.batch_size = batch_size
        self.chunk_size = chunk_size
        self.checkpoint_every = checkpoint_every
        self.index_options = index_options
        self.show_progress = show_progress

    def write(self, documents: Iterable[Document], *, total: int | None = None,
              prune_ids_not_in: bool = False) -> WriteReport:
        """Upsert ``documents``; with ``prune_ids_not_in``, also delete stored ids the input lacks."""
        embedder = self.embedder
        model_name = embedder.config.document.base_model or "" if hasattr(embedder, "config") else ""
        self.store.prepare(embedder.dim, embedder.space_fingerprint, model_name, self.index_options)
        report = WriteReport(store=self.store.describe())
        seen: set[str] = set()
        since_checkpoint = 0
        start = time.perf_counter()
        tower = embedder.document_model
        with tqdm(total=total, desc="Indexing", unit="doc", disable=not self.show_progress,
                  dynamic_ncols=True, smoothing=0.05) as bar:
            for chunk in _chunks(documents, self.chunk_size):
                if prune_ids_not_in:
                    seen.update(d.id for d in chunk)
                stored = self.store.content_hashes([d.id for d in chunk])
                todo = [d for d in chunk if stored.get(d.id) != d.content_hash()]
                report.unchanged += len(chunk) - len(todo)
                bar.update(len(chunk) - len(todo))
                if todo:
                    vectors = encode_texts(tower, [d.embedding_text() for d in todo], batch_size=self.batch_size,
                                           desc="Encoding documents", progress=bar)
                    self.store.upsert(todo, vectors)
                    report.updated += sum(1 for d in todo if d.id in stored)
                    report.added += sum(1 for d in todo if d.id not in stored)
                    since_checkpoint += len(todo)
                if since_checkpoint >= self.checkpoint_every:
                    self.store.commit()
                    since_checkpoint = 0
        if prune_ids_not_in:
            report.deleted = self._prune(seen)
        self.store.finalize()
        report.seconds = time.perf_counter() - start
        report.count = self.store.count()
        return report

    def delete(self, ids: Sequence[str]) -> int:
        """Delete documents by id and publish the change."""
        embedder = self.embedder
        self.store.prepare(embedder.dim, embedder.space_fingerprint, "", self.index_options)
        removed = self.store.delete(list(ids))
        self.store.finalize()
        return removed

    def _prune(self, keep: set[str]) -> int:
        from care_retriever.stores.faiss_store import FaissStore

        if not isinstance(self.store, FaissStore):
            logger.warning("pruning is only supported for FAISS stores; skipped")
            return 0
        stale = [d.id for d in self.store.iter_documents() if d.id not in keep]
        return self.store.delete(stale) if stale else 0
