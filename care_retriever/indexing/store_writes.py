"""The index writer's store writes on a thread of their own, in order, while the next slice encodes."""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence

import numpy as np

from care_retriever.documents import Document
from care_retriever.stores.capabilities import WriteRuns

__all__ = ["StoreWrites"]


class StoreWrites:
    """A window's slices written to the store on a thread of their own, in order, while the calling thread encodes
    the next slice: the store side (docstore rows and their content hashes, the index add, the checkpoint) overlaps
    encoding instead of following it. At most ``depth`` encoded slices wait (their vectors held), beside the one being
    written.

    A checkpoint still follows the upsert it covers, on the same thread, so it records only what is written. The
    first error stops the writes (nothing after it is upserted or checkpointed, as when the loop ran inline) and is
    raised in the calling thread, the same exception, at the next :meth:`submit` or at :meth:`finish`."""

    _END = None

    def __init__(self, store: WriteRuns, depth: int = 1) -> None:
        self.store = store
        self._queue: queue.Queue[tuple[list[Document], np.ndarray, Sequence[list[str]] | None, bool] | None] = (
            queue.Queue(maxsize=max(1, depth))
        )
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="care-store-writes", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (item := self._queue.get()) is not self._END:
            if self._error is not None:  # after an error nothing more is written (the caller raises it)
                continue
            documents, vectors, tokens, checkpoint = item
            try:
                self.store.upsert(documents, vectors, sparse_tokens=tokens)
                if checkpoint:
                    self.store.commit()
            except BaseException as exc:  # raised in the calling thread
                self._error = exc

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def submit(
        self, documents: list[Document], vectors: np.ndarray, tokens: Sequence[list[str]] | None, checkpoint: bool
    ) -> None:
        """Queue one slice's upsert (then a checkpoint); blocks while ``depth`` slices already wait."""
        self._raise_error()
        self._queue.put((documents, vectors, tokens, checkpoint))

    def finish(self, raise_error: bool = True) -> None:
        """Wait for every queued write; raise the first error (``raise_error``: not while the caller already
        raises one of its own, which goes on instead)."""
        self._queue.put(self._END)
        self._thread.join()
        if raise_error:
            self._raise_error()
