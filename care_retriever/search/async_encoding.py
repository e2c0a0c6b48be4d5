"""Encoding from an event loop: every forward pass in a worker thread, concurrent queries in one batch.

The framework adapters' async methods (Haystack ``run_async``, LangChain ``aembed_query``) call
:class:`AsyncEncoder`, so an async service never runs a tower on its event loop:

- :meth:`AsyncEncoder.embed_queries` queues the texts on the calling loop's
  :class:`~care_retriever.search.batching.QueryBatcher` (the HTTP service's batcher): queries submitted while
  a forward pass runs, or in the same turn of the loop (``asyncio.gather``), are encoded together in the next
  one, up to ``max_batch_size`` queries. ``max_wait_s`` (default 0) is how long a batch waits for company
  once it has one query; 0 adds no latency and batches only what is already waiting.
- :meth:`AsyncEncoder.embed_documents` runs the document tower in a worker thread (a document batch is already
  a batch; nothing is gained by merging two callers' batches, and a long one would hold the other back).

The tower itself comes from a zero-argument callable (e.g. :meth:`TowerLoader.query
<care_retriever.integrations.common.TowerLoader.query>`), called in the worker thread, so loading a tower
on first use does not block the loop either. Each loop gets its own batcher (a batcher's workers live on
one loop); batchers of loops that have closed are dropped.

This module uses asyncio only; no framework is imported.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from care_retriever.search.batching import Job, QueryBatcher

if TYPE_CHECKING:
    from care_retriever.model.protocols import DocumentEncoder, QueryEncoder

# Queries that may wait for a forward pass on one loop. A library caller has no 503 to answer with, so the
# limit only guards against an unbounded queue; the batcher raises Overloaded beyond it.
DEFAULT_MAX_QUEUE = 100_000
DEFAULT_MAX_BATCH_SIZE = 32


@dataclass(frozen=True)
class EncoderStats:
    """What an :class:`AsyncEncoder` has run so far (all loops together)."""

    query_batches: int = 0  # forward passes of the query tower (one per instruction in a batch)
    queries: int = 0  # queries encoded
    document_calls: int = 0  # document-tower calls (each of ``batch_size`` documents per forward pass)
    documents: int = 0


class AsyncEncoder:
    """Async query and document encoding over sync towers, off the event loop.

    :param query_encoder: returns the query side (called in a worker thread, so it may load the tower).
    :param document_encoder: returns the document side (likewise); None: :meth:`embed_documents` is refused.
    :param max_batch_size: most queries in one forward pass.
    :param max_wait_s: how long a batch waits for more queries once it has one (0: batch only what waits).
    :param max_queue: most queries waiting on one loop (:class:`~care_retriever.search.batching.Overloaded` beyond).
    """

    def __init__(
        self,
        query_encoder: Callable[[], QueryEncoder] | None = None,
        document_encoder: Callable[[], DocumentEncoder] | None = None,
        *,
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
        max_wait_s: float = 0.0,
        max_queue: int = DEFAULT_MAX_QUEUE,
    ) -> None:
        if max_batch_size < 1 or max_wait_s < 0 or max_queue < 1:
            raise ValueError(
                f"max_batch_size and max_queue must be >= 1 and max_wait_s >= 0, got {max_batch_size}, "
                f"{max_queue} and {max_wait_s}"
            )
        self.query_encoder = query_encoder
        self.document_encoder = document_encoder
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self.max_queue = max_queue
        self._batchers: dict[asyncio.AbstractEventLoop, QueryBatcher] = {}
        self._lock = threading.Lock()  # loops of several threads may share one encoder
        self._stats = EncoderStats()

    @property
    def stats(self) -> EncoderStats:
        """Forward passes and texts encoded so far (a snapshot)."""
        return self._stats

    def _count(self, **added: int) -> None:
        with self._lock:
            current = self._stats
            self._stats = EncoderStats(
                **{k: getattr(current, k) + added.get(k, 0) for k in EncoderStats.__annotations__}
            )

    # ------------------------------------------------------------------ queries
    def _run_batch(self, jobs: Sequence[Job]) -> list[Any]:
        """One batch (in a worker thread): one forward pass per instruction, each job's rows back to it."""
        if self.query_encoder is None:
            raise RuntimeError("AsyncEncoder has no query encoder")
        encoder = self.query_encoder()
        by_instruction: dict[str | None, list[int]] = {}
        for n, job in enumerate(jobs):
            by_instruction.setdefault(job.params.get("instruction"), []).append(n)
        results: list[Any] = [None] * len(jobs)
        for instruction, members in by_instruction.items():
            texts = [q for n in members for q in jobs[n].queries]
            try:
                vectors = encoder.embed_queries(texts, instruction=instruction, batch_size=len(texts))
            except Exception as exc:  # this instruction's jobs get the error, the others their vectors
                for n in members:
                    results[n] = exc
                continue
            self._count(query_batches=1, queries=len(texts))
            start = 0
            for n in members:
                size = len(jobs[n].queries)
                results[n] = np.asarray(vectors[start : start + size])
                start += size
        return results

    def _batcher(self, loop: asyncio.AbstractEventLoop) -> QueryBatcher:
        with self._lock:
            for closed in [known for known in self._batchers if known.is_closed()]:
                del self._batchers[closed]  # its workers were cancelled with the loop
            batcher = self._batchers.get(loop)
            if batcher is None:
                batcher = QueryBatcher(
                    self._run_batch,
                    max_batch_size=self.max_batch_size,
                    max_wait_s=self.max_wait_s,
                    max_queue=self.max_queue,
                )
                self._batchers[loop] = batcher
            return batcher

    async def embed_queries(self, texts: Sequence[str], instruction: str | None = None) -> np.ndarray:
        """The query vectors of ``texts`` (rows in order), encoded in a worker thread with the queries other
        coroutines of this loop submit meanwhile."""
        texts = list(texts)
        if self.query_encoder is None:
            raise RuntimeError("AsyncEncoder has no query encoder")
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        batcher = self._batcher(asyncio.get_running_loop())
        return await batcher.submit(texts, {"instruction": instruction})

    # ------------------------------------------------------------------ documents
    def _encode_documents(self, texts: list[str], batch_size: int, show_progress: bool) -> np.ndarray:
        if self.document_encoder is None:
            raise RuntimeError("AsyncEncoder has no document encoder")
        vectors = self.document_encoder().embed_documents(texts, batch_size=batch_size, show_progress=show_progress)
        self._count(document_calls=1, documents=len(texts))
        return vectors

    async def embed_documents(
        self, texts: Sequence[str], *, batch_size: int, show_progress: bool = False
    ) -> np.ndarray:
        """The document vectors of ``texts``, encoded in a worker thread (the loop keeps running meanwhile)."""
        return await asyncio.to_thread(self._encode_documents, list(texts), batch_size, show_progress)

    async def aclose(self) -> None:
        """Stop this loop's batch worker (other loops' stop with their loop)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            batcher = self._batchers.pop(loop, None)
        if batcher is not None:
            await batcher.aclose()
