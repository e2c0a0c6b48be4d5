"""Micro-batching of concurrent requests: many small requests, one forward pass.

Requests are :class:`Job` s (a few queries plus the parameters of their search). A worker takes the
oldest job, then keeps taking waiting jobs until the batch holds ``max_batch_size`` queries or
``max_wait_s`` has passed since it took the first one, and runs the whole batch with one call of
``run`` in a thread. ``run`` returns one result (or exception) per job, in the batch's order; each
goes back to the request that submitted that job. A job is never split across batches, so a request
with more queries than ``max_batch_size`` forms a batch of its own; ``max_batch_size=1`` turns
batching off (one request per forward pass, ``workers`` of them at once).

At most ``max_queue`` queries wait for a worker: beyond that :meth:`QueryBatcher.submit` raises
:class:`Overloaded` at once (the service answers 503 with Retry-After) instead of letting latency grow
without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio


class Overloaded(Exception):
    """The queue is full: the caller should retry after ``retry_after`` seconds."""

    def __init__(self, depth: int, max_queue: int, retry_after: int = 1) -> None:
        super().__init__(f"server busy: {depth} queries queued (limit {max_queue}); retry after {retry_after} s")
        self.retry_after = retry_after


@dataclass
class Job:
    """One request's share of a batch: its queries and the parameters of its search."""

    queries: list[str]
    params: dict[str, Any]
    future: asyncio.Future = field(repr=False)
    submitted: float = field(default_factory=time.perf_counter)


# Runs one batch (in a worker thread): one result or exception per job, in order.
BatchRunner = Callable[[Sequence[Job]], list[Any]]
BatchObserver = Callable[[int, float, Sequence[float]], None]


class QueryBatcher:
    """Collects concurrent jobs into batches of at most ``max_batch_size`` queries and runs them."""

    def __init__(
        self,
        run: BatchRunner,
        *,
        max_batch_size: int,
        max_wait_s: float,
        max_queue: int,
        workers: int = 1,
        observe: BatchObserver | None = None,
    ) -> None:
        self.run = run
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self.max_queue = max_queue
        self.workers = workers
        self.observe = observe  # (queries in the batch, seconds it ran, each job's seconds in the queue)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: deque[Job] = deque()
        self._arrived = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._depth = 0

    @property
    def depth(self) -> int:
        """Queries submitted and not yet taken by a worker."""
        return self._depth

    async def submit(self, queries: list[str], params: dict[str, Any]) -> Any:
        """Queue ``queries`` and wait for their result (what ``run`` returned for this job)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._start(loop)
        if self._depth + len(queries) > self.max_queue:
            raise Overloaded(self._depth, self.max_queue)
        job = Job(list(queries), params, loop.create_future())
        self._pending.append(job)
        self._depth += len(job.queries)
        self._arrived.set()
        return await job.future

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        # Workers live on the loop that serves requests. A test client that runs each request on a
        # fresh loop gets fresh workers; the old ones were cancelled when their loop closed.
        self._loop = loop
        self._pending = deque()
        self._arrived = asyncio.Event()
        self._depth = 0
        self._tasks = [loop.create_task(self._work()) for _ in range(self.workers)]

    async def aclose(self) -> None:
        """Stop the workers (after the server has finished its in-flight requests)."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        self._loop = None

    async def _next_batch(self) -> list[Job]:
        while not self._pending:
            self._arrived.clear()
            await self._arrived.wait()
        loop = asyncio.get_running_loop()
        batch = [self._pending.popleft()]
        size = len(batch[0].queries)
        deadline = loop.time() + self.max_wait_s
        while size < self.max_batch_size:
            if self._pending:
                if size + len(self._pending[0].queries) > self.max_batch_size:
                    break
                batch.append(self._pending.popleft())
                size += len(batch[-1].queries)
                continue
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except TimeoutError:
                break
        self._depth -= size
        return batch

    async def _work(self) -> None:
        while True:
            batch = [job for job in await self._next_batch() if not job.future.done()]  # done: client gone
            if not batch:
                continue
            started = time.perf_counter()
            try:
                results = await anyio.to_thread.run_sync(self.run, batch)
                if len(results) != len(batch):
                    raise RuntimeError(f"batch runner returned {len(results)} results for {len(batch)} jobs")
            except Exception as exc:  # the runner failed as a whole: every job in it gets the error
                results = [exc] * len(batch)
            if self.observe is not None:
                self.observe(
                    sum(len(j.queries) for j in batch),
                    time.perf_counter() - started,
                    [started - j.submitted for j in batch],
                )
            for job, result in zip(batch, results, strict=True):
                if job.future.done():
                    continue
                if isinstance(result, BaseException):
                    job.future.set_exception(result)
                else:
                    job.future.set_result(result)
