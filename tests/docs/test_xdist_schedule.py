"""Under ``-n 2`` the two xdist workers share the ``slow`` tests that run first, and finish together.

xdist's own load scheduler runs here on a suite shaped like ours (the slow tests first, many short ones after),
with two simulated workers that take each test's time; only the workers are simulated.
"""

from __future__ import annotations

import heapq
from types import SimpleNamespace

import pytest
from xdist.scheduler.load import LoadScheduling

from tests.support.scheduling import XDIST_CHUNK

SLOW, FAST = 50, 1500  # the suite's counts, in round figures
SLOW_SECONDS, FAST_SECONDS = 20.0, 0.3


class Worker:
    """What the scheduler sees of an xdist worker: it is sent test indices, and later told to shut down."""

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.queue: list[int] = []
        self.ran: list[int] = []
        self.clock = 0.0

    def send_runtest_some(self, indices: list[int]) -> None:
        self.queue.extend(indices)

    def shutdown(self) -> None:
        self.shutting_down = True


def run_suite(chunk: int | None) -> list[Worker]:
    """Two workers run the suite as the load scheduler hands it out; each test takes its seconds."""
    collection = [f"slow{i}" for i in range(SLOW)] + [f"fast{i}" for i in range(FAST)]
    seconds = [SLOW_SECONDS] * SLOW + [FAST_SECONDS] * FAST
    options = {"maxschedchunk": chunk, "tx": ["popen", "popen"], "numprocesses": 2, "dist": "load"}
    config = SimpleNamespace(getoption=options.get, getvalue=options.get)
    scheduler = LoadScheduling(config, log=SimpleNamespace(loadsched=lambda *args: None))  # type: ignore[arg-type]
    workers = [Worker("gw0"), Worker("gw1")]
    for worker in workers:
        scheduler.add_node(worker)  # type: ignore[arg-type]
        scheduler.add_node_collection(worker, collection)  # type: ignore[arg-type]
    scheduler.schedule()
    running: list[tuple[float, int]] = []
    for n, worker in enumerate(workers):
        heapq.heappush(running, (seconds[worker.queue[0]], n))
    while running:
        done_at, n = heapq.heappop(running)
        worker = workers[n]
        index = worker.queue.pop(0)
        worker.clock = done_at
        worker.ran.append(index)
        scheduler.mark_test_complete(worker, index, seconds[index])  # type: ignore[arg-type]
        for m, other in enumerate(workers):
            if other.queue and all(busy != m for _, busy in running):
                other.clock = max(other.clock, done_at)
                heapq.heappush(running, (other.clock + seconds[other.queue[0]], m))
    assert sorted(i for worker in workers for i in worker.ran) == list(range(SLOW + FAST))
    return workers


def test_both_workers_run_slow_tests_and_finish_together() -> None:
    workers = run_suite(XDIST_CHUNK)
    slow_runs = [sum(i < SLOW for i in worker.ran) for worker in workers]
    assert min(slow_runs) >= SLOW // 3, slow_runs
    total = SLOW * SLOW_SECONDS + FAST * FAST_SECONDS
    assert max(worker.clock for worker in workers) <= total / 2 + SLOW_SECONDS, [w.clock for w in workers]


def test_the_suite_runs_with_that_chunk(pytestconfig: pytest.Config) -> None:
    """Where xdist is loaded (CI's ``-n 2``), tests/conftest.py set the chunk the simulation above runs with."""
    if pytestconfig.pluginmanager.hasplugin("xdist"):
        assert pytestconfig.getoption("maxschedchunk") == XDIST_CHUNK
    assert XDIST_CHUNK < SLOW // 4  # a few slow tests per hand-out, so the first one does not take them all
