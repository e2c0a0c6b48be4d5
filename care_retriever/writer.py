"""``DocumentStoreWriter``: corpus -> document tower -> store.

Documents stream through in chunks (a corpus larger than memory goes through), are encoded by the
document tower only, and are upserted by id: unchanged documents (same content hash) are skipped
before encoding, so re-indexing the same corpus costs one read and adds nothing, and ``update``
re-encodes only new or changed documents. The store is checkpointed every ``checkpoint_every``
documents; a killed run resumes from the last checkpoint when the same command is run again.

With ``sparse`` and the document tower on a GPU, each chunk's BM25 tokens are computed in a child process
while the chunk encodes (:mod:`care_retriever.sparse.background`); either way they are inserted with the
chunk's documents, in the same transaction.

Encoding is pluggable (``encoder=``): :mod:`care_retriever.index` passes one that scatters each chunk
over the ranks of a torch.distributed job, so checkpointing, resume and skipping stay in one place.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from itertools import islice
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from care_retriever.corpus import Document
from care_retriever.embedder_protocol import DocumentEncoder
from care_retriever.encoding import BatchLimits, check_unicode
from care_retriever.errors import InputError, ModelError
from care_retriever.sparse.background import BackgroundTokenizer
from care_retriever.stores import VectorStore, open_store

# texts -> (len(texts), dim) float32 unit rows, in input order
Encoder = Callable[[list[str]], np.ndarray]

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
    truncated: int = 0

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


def _validated(chunk: list[Document]) -> list[Document]:
    """Check each document is storable, and keep the last of repeated ids (upsert semantics).

    Two rows with one id in a chunk would otherwise both be inserted (FAISS docstore: UNIQUE violation);
    text that is not valid Unicode would fail deep inside the tokenizer or SQLite.
    """
    latest: dict[str, Document] = {}
    for doc in chunk:
        if not isinstance(doc, Document):
            raise InputError(f"expected care_retriever.corpus.Document, got {type(doc).__name__}")
        if not isinstance(doc.id, str) or not doc.id:
            raise InputError(f"document id must be a non-empty str, got {doc.id!r}")
        for name in ("id", "text", "title"):
            value = getattr(doc, name)
            if not isinstance(value, str):
                raise InputError(f"document {doc.id!r}: {name} must be a str, got {type(value).__name__}")
            check_unicode(value, f"document {doc.id!r} {name}")
        try:
            check_unicode(json.dumps(doc.metadata, ensure_ascii=False), f"document {doc.id!r} metadata")
        except TypeError as exc:
            raise InputError(f"document {doc.id!r}: metadata is not JSON-serialisable ({exc})") from exc
        latest.pop(doc.id, None)
        latest[doc.id] = doc
    return list(latest.values())


class DocumentStoreWriter:
    """Encode documents with the document tower and write them into a FAISS or Qdrant store."""

    def __init__(
        self,
        embedder: DocumentEncoder,
        store: str | VectorStore,
        *,
        collection: str | None = None,
        batch_size: int = 16,
        max_batch_tokens: int | None = None,
        chunk_size: int = 1024,
        checkpoint_every: int = 8192,
        index_options: dict[str, Any] | None = None,
        show_progress: bool = True,
        encoder: Encoder | None = None,
        sparse: bool = False,
        background_tokenizer: bool | None = None,
    ) -> None:
        self.embedder = embedder
        self.store = open_store(store, collection=collection)
        self.batch_size = batch_size
        # texts and padded tokens per forward pass; halved on out-of-memory and kept lowered for the run
        self.limits = BatchLimits(batch_size, max_batch_tokens)
        self.chunk_size = chunk_size
        self.checkpoint_every = checkpoint_every
        self.index_options = index_options
        self.show_progress = show_progress
        self.encoder = encoder
        self.sparse = sparse  # also write the BM25 side (care_retriever.sparse), in the same transactions
        # The BM25 side's tokens computed in a child process while the chunk encodes (sparse.background). None:
        # where the document tower runs on an accelerator. On CPU torch's threads already take every core, so
        # the child only competes with them (measured on 2 cores: no gain, and slower under load; docs/scale.md).
        if background_tokenizer is None:
            background_tokenizer = str(getattr(embedder, "device", "cpu")).split(":")[0] not in ("cpu", "")
        self.background_tokenizer = background_tokenizer

    def write(
        self, documents: Iterable[Document], *, total: int | None = None, prune_ids_not_in: bool = False
    ) -> WriteReport:
        """Upsert ``documents``; with ``prune_ids_not_in``, also delete stored ids the input lacks."""
        embedder = self.embedder
        self.store.prepare(
            embedder.dim,
            embedder.space_fingerprint,
            embedder.document_model_name,
            self.index_options,
            metric=getattr(embedder, "similarity", "cosine"),
        )
        if self.sparse:
            self.store.enable_sparse(show_progress=self.show_progress)
        report = WriteReport(store=self.store.describe())
        seen: set[str] = set()
        since_checkpoint = 0
        start = time.perf_counter()
        stats: dict[str, int] = {}
        with (
            tqdm(
                total=total,
                desc="Indexing",
                unit="doc",
                disable=not self.show_progress,
                dynamic_ncols=True,
                smoothing=0.05,
            ) as bar,
            BackgroundTokenizer() if self.sparse and self.background_tokenizer else nullcontext() as tokenizer,
        ):
            for raw in _chunks(documents, self.chunk_size):
                chunk = _validated(raw)
                bar.update(len(raw) - len(chunk))
                if prune_ids_not_in:
                    seen.update(d.id for d in chunk)
                stored = self.store.content_hashes([d.id for d in chunk])
                todo = [d for d in chunk if stored.get(d.id) != d.content_hash()]
                report.unchanged += len(chunk) - len(todo)
                bar.update(len(chunk) - len(todo))
                if todo:
                    texts = [d.embedding_text() for d in todo]
                    if tokenizer is not None:  # the chunk's BM25 tokens, computed while it encodes
                        tokenizer.submit(texts)
                    vectors = self._encode(texts, bar, stats)
                    tokens = tokenizer.result() if tokenizer is not None else None
                    self.store.upsert(todo, vectors, sparse_tokens=tokens)
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
        report.truncated = stats.get("truncated", 0)
        if report.truncated:
            logger.warning(
                "%d of %d encoded documents reached the document tower's max length and were truncated",
                report.truncated,
                report.encoded,
            )
        return report

    def _encode(self, texts: list[str], bar: tqdm, stats: dict[str, int]) -> np.ndarray:
        if self.encoder is None:  # the embedder applies its document prompt, as embed_documents does anywhere
            return self.embedder.embed_documents(texts, limits=self.limits, progress=bar, stats=stats)
        vectors = np.asarray(self.encoder(texts), dtype=np.float32)
        if vectors.shape != (len(texts), self.embedder.dim):
            raise ModelError(
                f"encoder returned shape {vectors.shape} for {len(texts)} texts of a {self.embedder.dim}-dim model"
            )
        bar.update(len(texts))
        return vectors

    def delete(self, ids: Sequence[str]) -> int:
        """Delete documents by id and publish the change."""
        embedder = self.embedder
        self.store.prepare(
            embedder.dim,
            embedder.space_fingerprint,
            "",
            self.index_options,
            metric=getattr(embedder, "similarity", "cosine"),
        )
        removed = self.store.delete(list(ids))
        self.store.finalize()
        return removed

    def _prune(self, keep: set[str]) -> int:
        stale = [d.id for d in self.store.iter_documents() if d.id not in keep]
        return self.store.delete(stale) if stale else 0
