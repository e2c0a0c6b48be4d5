"""``DocumentStoreWriter``: corpus -> document tower -> store.

Documents stream through in chunks (a corpus larger than memory goes through) and are upserted by id; unchanged
documents (same content hash) are skipped before encoding. The store is checkpointed every ``checkpoint_every``
documents, so a killed run resumes from its last checkpoint. The BM25 tokens of a chunk are inserted with its
documents, in the same transaction; store writes may run on a thread of their own (:class:`StoreWrites`) while the
next slice encodes. Encoding is pluggable (``encoder=``), so torchrun's scatter over ranks
(:mod:`care_retriever.indexing.distributed`) shares the checkpointing, resume and skipping.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from care_retriever.documents import Document
from care_retriever.errors import InputError, ModelError
from care_retriever.indexing.checks import chunks, validated
from care_retriever.indexing.config import SPARSE, EncodeConfig
from care_retriever.indexing.report import WriteReport
from care_retriever.indexing.store_writes import StoreWrites
from care_retriever.model.encoding import BatchLimits, auto_batch_limits
from care_retriever.model.protocols import DocumentEncoder
from care_retriever.runtime.batch_limits import DOCUMENT_BATCH_SIZE
from care_retriever.runtime.forward import prepare_encoder_forward
from care_retriever.sparse.background import BackgroundTokenizer
from care_retriever.stores import VectorStore, open_store
from care_retriever.stores.capabilities import (
    IndexBuilding,
    SparseSearch,
    StoredIteration,
    WriteRuns,
)
from care_retriever.stores.config import (
    StoreKind,
    StoreOptions,
    store_config,
)
from care_retriever.stores.runs import RunTag

__all__ = ["DocumentStoreWriter", "Encoder"]

# texts -> (len(texts), dim) float32 unit rows, in input order
Encoder = Callable[[list[str]], np.ndarray]

logger = logging.getLogger("care_retriever")


class DocumentStoreWriter:
    """Encode documents with the document tower and write them into a FAISS or Qdrant store.

    Documents are upserted by id; unchanged ones (same content hash) are skipped before encoding, and a stopped run
    resumes from its last checkpoint when run again.

    Usage example:
    ```python
    from care_retriever import AsymmetricEmbedder, DocumentStoreWriter, read_corpus

    embedder = AsymmetricEmbedder.from_pretrained("models/care", load="document")
    writer = DocumentStoreWriter(embedder, "faiss:stores/notes", show_progress=False)
    report = writer.write(read_corpus("corpus.jsonl"))
    assert report.count == report.added > 0
    ```

    :param embedder: the document side of a model (:class:`~care_retriever.model.protocols.DocumentEncoder`).
    :param store: the store, as a spec (``faiss:DIR``, ``qdrant:PATH``, ``qdrant:http://host:port``) or opened.
    :param collection: the Qdrant collection (None: the spec's, else the default).
    :param encode: how the document tower encodes (:class:`~care_retriever.indexing.config.EncodeConfig`; None: the
        defaults of ``care-retriever index``).
    :param index: the store's settings (:class:`~care_retriever.stores.config.FaissIndexConfig`,
        :class:`~care_retriever.stores.config.QdrantCollectionConfig` or a dict of their fields; None: an existing
        store's own, a new one's defaults).
    :param show_progress: draw a progress bar.
    :param encoder: encode with this function instead of the document tower (texts -> unit rows; torchrun's
        scatter over ranks passes one).
    :param sparse: also write the BM25 side, as ``care-retriever index`` does unless ``--no-sparse``.
    :param background_tokenizer: compute the BM25 tokens in a child process while a chunk encodes (None: where
        the tower runs on an accelerator).
    :param overlap_writes: write to the store on a thread of its own while the next slice encodes (None: for a
        FAISS store without an encoder of its own).
    """

    def __init__(
        self,
        embedder: DocumentEncoder,
        store: str | VectorStore,
        *,
        collection: str | None = None,
        encode: EncodeConfig | None = None,
        index: StoreOptions = None,
        show_progress: bool = True,
        encoder: Encoder | None = None,
        sparse: bool = SPARSE,
        background_tokenizer: bool | None = None,
        overlap_writes: bool | None = None,
    ) -> None:
        self.embedder = embedder
        # a store that writes in runs (checkpoints, a publish, a rollback) is what a resumable bulk write needs
        self.store = WriteRuns.require(open_store(store, collection=collection), "the index writer")
        self.encode = encode or EncodeConfig()
        self.index = store_config(self.store.backend, index)
        # texts and padded tokens per forward pass; halved on out-of-memory and kept lowered for the run. "auto" and
        # None are resolved once the first write starts (auto_batch_limits: from the GPU's free memory).
        tokens = self.encode.max_batch_tokens
        self.limits = BatchLimits(
            self.encode.batch_size or DOCUMENT_BATCH_SIZE, tokens if isinstance(tokens, int) else None
        )
        self._limits_resolved = False
        self._since_checkpoint = 0
        self._first_slice = False
        self.show_progress = show_progress
        self.encoder = encoder
        self.sparse = sparse  # also write the BM25 side (care_retriever.sparse), in the same transactions
        # The document tower this writer runs, or None: an encoder of its own (torchrun's scatter, vectors computed
        # elsewhere) batches for itself, and its model may hold no document tower.
        self._document_tower = embedder.document_model if encoder is None else None
        if self._document_tower is not None:  # packed / compiled / fp8 passes, decided once per tower
            prepare_encoder_forward(
                embedder, self.encode.forward, self.encode.compile, self.encode.dtype, norms=self.encode.norms
            )
        # BM25 tokens in a child process while a chunk encodes: only where the tower runs on an accelerator; on a
        # CPU, torch's threads already take every core.
        if background_tokenizer is None:
            tower = self._document_tower
            background_tokenizer = tower is not None and str(tower.device).split(":")[0] not in ("cpu", "")
        self.background_tokenizer = background_tokenizer
        # Store writes on a thread of their own while the next slice encodes (StoreWrites): by default for a FAISS
        # store, whose writes take a large share of a CPU run. Not with an encoder of its own (torchrun's rank 0,
        # whose encoder runs the job's collectives): those writes stay inline, the path tested under torchrun.
        if overlap_writes is None:
            overlap_writes = self.store.backend == StoreKind.FAISS and encoder is None
        self.overlap_writes = overlap_writes
        self._writes: StoreWrites | None = None

    def write(
        self,
        documents: Iterable[Document],
        *,
        total: int | None = None,
        prune_ids_not_in: bool = False,
        source: str | None = None,
    ) -> WriteReport:
        """Upsert ``documents`` and publish them; with ``prune_ids_not_in``, also delete stored ids the input lacks.

        A run that stops on a bad document keeps its last checkpoint staged, unpublished, and its error says so.

        :param documents: the documents (:func:`~care_retriever.indexing.corpus.read_corpus` streams a corpus).
        :param total: how many there are, for the progress bar (None: unknown).
        :param prune_ids_not_in: delete the stored documents whose ids ``documents`` lacks.
        :param source: where the documents come from (``index`` gives the corpus file), recorded with a staged
            write: a stopped run is resumed only by the same run (same source, model and settings).
        :returns: what the write did (:class:`~care_retriever.indexing.report.WriteReport`).
        :raises InputError: a document cannot be stored (the line names it and what the run left behind).
        """
        embedder = self.embedder
        # A new FAISS store that trains its index on its first vectors (IVF, quantization) gets the corpus's first
        # documents first, not its longest (:meth:`_flush`).
        self._first_slice = isinstance(self.store, IndexBuilding) and self.store.trains_on_first_vectors(self.index)
        self.store.claim_run(self._run_tag("index", source, sparse=self.sparse, prune=prune_ids_not_in))
        self.store.prepare(
            embedder.dim,
            embedder.space_fingerprint,
            embedder.document_model_name,
            self.index,
            metric=embedder.similarity,
        )
        if self.sparse:
            sparse = SparseSearch.require(self.store, "index --sparse")
            sparse.enable_sparse(show_progress=self.show_progress)
        self._resolve_limits()
        report = WriteReport(store=self.store.describe())
        seen: set[str] = set()
        start = time.perf_counter()
        stats: dict[str, int] = {}
        # Documents to encode, by id (the last of a repeated id wins), with whether the store held the id.
        pending: dict[str, tuple[Document, bool]] = {}
        self._since_checkpoint = 0
        try:
            self._write_all(documents, total, prune_ids_not_in, report, seen, stats, pending)
        except InputError as exc:  # a bad document mid-run: said with what the run leaves behind
            raise InputError(f"{exc}; {self.store.left_behind(report.encoded, 'fix the input')}") from exc
        if prune_ids_not_in:
            report.deleted = self._prune(seen)
        self.store.finalize()
        report.seconds = time.perf_counter() - start
        report.count = self.store.count()
        report.truncated = stats.get("truncated", 0)
        report.tokens = stats.get("tokens", 0)
        report.padded_tokens = stats.get("padded_tokens", 0)
        if report.truncated:
            logger.warning(
                "%d of %d encoded documents reached the document tower's max length and were truncated",
                report.truncated,
                report.encoded,
            )
        return report

    def _run_tag(self, command: str, source: str | None, **options: Any) -> RunTag:
        """This run, as a staged write records it (the store's settings, asked or default, among its options)."""
        embedder = self.embedder
        settings = dataclasses.asdict(self.index) if self.index is not None else None
        return RunTag(
            command=command,
            corpus=source,
            space_fingerprint=embedder.space_fingerprint,
            model_name=embedder.document_model_name,
            options={"index": settings, **options},
        )

    def _write_all(
        self,
        documents: Iterable[Document],
        total: int | None,
        prune_ids_not_in: bool,
        report: WriteReport,
        seen: set[str],
        stats: dict[str, int],
        pending: dict[str, tuple[Document, bool]],
    ) -> None:
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
            for raw in chunks(documents, self.encode.chunk_size):
                chunk = validated(raw)
                bar.update(len(raw) - len(chunk))
                if prune_ids_not_in:
                    seen.update(d.id for d in chunk)
                for doc in chunk:  # a newer version of a document still waiting replaces it
                    if pending.pop(doc.id, None) is not None:
                        bar.update(1)
                stored = self.store.content_hashes([d.id for d in chunk])
                # (an id the store does not hold is encoded whatever its hash: hashed only when written)
                todo = [d for d in chunk if d.id not in stored or stored[d.id] != d.content_hash()]
                report.unchanged += len(chunk) - len(todo)
                bar.update(len(chunk) - len(todo))
                pending.update((d.id, (d, d.id in stored)) for d in todo)
                if len(pending) >= self.encode.sort_window:
                    self._flush(list(pending.values()), report, bar, stats, tokenizer)
                    pending.clear()
            if pending:
                self._flush(list(pending.values()), report, bar, stats, tokenizer)

    def _resolve_limits(self) -> None:
        """``max_batch_tokens="auto"``: a token budget sized from the free memory of the GPU the document tower is
        on (none on CPU), and a larger text cap there (:func:`care_retriever.model.encoding.auto_batch_limits`)."""
        if self._limits_resolved:
            return
        self._limits_resolved = True
        resolved = auto_batch_limits(self._document_tower, self.encode.batch_size, self.encode.max_batch_tokens)
        self.limits.texts, self.limits.tokens = resolved.texts, resolved.tokens

    def _flush(
        self,
        items: list[tuple[Document, bool]],
        report: WriteReport,
        bar: tqdm,
        stats: dict[str, int],
        tokenizer: BackgroundTokenizer | None,
    ) -> None:
        """Encode and upsert a window of documents, longest first (so a batch pads little over the whole window),
        a slice at a time; the store is checkpointed every ``checkpoint_every`` documents. Where a new store trains
        its index on its first vectors (IVF, quantization), the run's first ``chunk_size`` documents go first, as
        read: it trains on the corpus's first documents, as before, not on its longest. With ``overlap_writes`` a
        slice is written while the next one encodes, and every write is done (or its error raised) on return."""
        size = max(self.encode.chunk_size, self.encode.checkpoint_every)
        # The window's writes are all done before it returns: the next chunks' content hashes are read after them.
        self._writes = StoreWrites(self.store) if self.overlap_writes else None
        try:
            if self._first_slice:
                head, items = items[: self.encode.chunk_size], items[self.encode.chunk_size :]
                self._first_slice = False
                self._write_slice(head, report, bar, stats, tokenizer)
            lengths = np.fromiter((len(doc.embedding_text()) for doc, _ in items), dtype=np.int64, count=len(items))
            order = np.argsort(-lengths, kind="stable")
            for begin in range(0, len(items), size):
                self._write_slice([items[i] for i in order[begin : begin + size]], report, bar, stats, tokenizer)
        except BaseException:
            # the slices already encoded are still written (as when each was written before the next encoded); the
            # caller's error goes on
            if self._writes is not None:
                self._writes.finish(raise_error=False)
            raise
        finally:
            writes, self._writes = self._writes, None
        if writes is not None:
            writes.finish()

    def _write_slice(
        self,
        items: list[tuple[Document, bool]],
        report: WriteReport,
        bar: tqdm,
        stats: dict[str, int],
        tokenizer: BackgroundTokenizer | None,
    ) -> None:
        if not items:
            return
        todo = [doc for doc, _ in items]
        texts = [d.embedding_text() for d in todo]
        if tokenizer is not None:  # the slice's BM25 tokens, computed while it encodes
            tokenizer.submit(texts)
        vectors = self._encode(texts, bar, stats)
        tokens = tokenizer.result() if tokenizer is not None else None
        self._since_checkpoint += len(todo)
        checkpoint = self._since_checkpoint >= self.encode.checkpoint_every
        if checkpoint:
            self._since_checkpoint = 0
        if self._writes is not None:
            self._writes.submit(todo, vectors, tokens, checkpoint)
        else:
            self.store.upsert(todo, vectors, sparse_tokens=tokens)
            if checkpoint:
                self.store.commit()
        report.updated += sum(1 for _, held in items if held)
        report.added += sum(1 for _, held in items if not held)

    def _encode(self, texts: list[str], bar: tqdm, stats: dict[str, int]) -> np.ndarray:
        if self.encoder is None:  # the embedder applies its document prompt, as embed_documents does anywhere
            return self.embedder.embed_documents(texts, limits=self.limits, progress=bar, stats=stats)
        # a copy: the store writes it on another thread while the encoder may reuse its buffer for the next slice
        vectors = np.array(self.encoder(texts), dtype=np.float32)
        if vectors.shape != (len(texts), self.embedder.dim):
            raise ModelError(
                f"encoder returned shape {vectors.shape} for {len(texts)} texts of a {self.embedder.dim}-dim model"
            )
        bar.update(len(texts))
        return vectors

    def delete(self, ids: Sequence[str]) -> int:
        """Delete documents by id and publish the change.

        :param ids: the ids to delete (an id the store lacks is no error).
        :returns: how many of them the store held.
        """
        embedder = self.embedder
        self.store.claim_run(self._run_tag("delete", None))
        self.store.prepare(embedder.dim, embedder.space_fingerprint, "", self.index, metric=embedder.similarity)
        removed = self.store.delete(list(ids))
        self.store.finalize()
        return removed

    def _prune(self, keep: set[str]) -> int:
        stored = StoredIteration.require(self.store, "index --prune")
        stale = [d.id for d in stored.iter_documents() if d.id not in keep]
        return self.store.delete(stale) if stale else 0
