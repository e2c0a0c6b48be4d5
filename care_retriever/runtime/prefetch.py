"""A background thread that runs an iterator a few items ahead: the next passes tokenised and collated while the
tower runs the current one (:class:`Prefetcher`)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


class Prefetcher:
    """Runs an iterator in a background thread, ``depth`` items ahead (tokenising and collating the next batches
    while the tower runs the current one). Exceptions are raised in the consumer; ``close`` stops the thread."""

    _END = object()

    def __init__(self, items: Iterator[Any], depth: int = 2) -> None:
        self._items = items
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="care-encoding-prefetch", daemon=True)
        self._thread.start()

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            for item in self._items:
                if not self._put(item):
                    return
        except BaseException as exc:  # handed to the consumer, raised there
            self._put(_Raised(exc))
            return
        self._put(self._END)

    def __iter__(self) -> Iterator[Any]:
        while True:
            item = self._queue.get()
            if item is self._END:
                return
            if isinstance(item, _Raised):
                raise item.exc
            yield item

    def close(self) -> None:
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._queue.get_nowait()
            except queue.Empty:
                self._thread.join(timeout=0.05)


@dataclass
class _Raised:
    exc: BaseException
