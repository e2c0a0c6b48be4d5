"""A 10-document write into a large Qdrant Edge store, its commit (and the file checksums it records) included.

    python -m benchmarks.edge_small_writes --build /tmp/edge100k --n 100000     # once: builds and optimizes it
    python -m benchmarks.edge_small_writes --time /tmp/edge100k --calls 10 --json

``--build`` writes ``n`` random unit vectors (``--dim`` wide) with short Chinese texts and runs ``finalize`` (the
engine's optimizer). ``--time`` opens the store and times ``upsert`` of 10 documents followed by ``commit``, ``calls``
times after one untimed call (which warms the page cache and, on a store written without file checksums, records
them all), and prints the median and the range in ms, the median time the commit spent recording the shard files'
checksums (``small_write_checksum_ms``; absent where the code has none), and the verify time of the whole store.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from care_retriever.documents import Document
from care_retriever.stores.qdrant.edge_store import EdgeStore


def _vectors(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    vectors = rng.normal(size=(n, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def build(folder: Path, n: int, dim: int) -> None:
    rng = np.random.default_rng(0)
    with EdgeStore(str(folder)) as store:
        store.prepare(dim, "bench" * 8, "bench")
        for start in range(0, n, 20_000):
            size = min(20_000, n - start)
            documents = [
                Document(id=f"d{i}", text=f"高血压患者第{i}号文档，低盐饮食，规律服药。", metadata={"g": i % 7})
                for i in range(start, start + size)
            ]
            store.upsert(documents, _vectors(rng, size, dim))
            store.commit()
        store.finalize()


def _timing_file_checksums(spent: list[float]) -> None:
    """Time each recording of the shard files' checksums (code that records none: nothing to time)."""
    try:
        from care_retriever.stores.qdrant import edge_files
    except ImportError:
        return
    record = edge_files.record

    def timed(*args: object) -> int:
        start = time.perf_counter()
        try:
            return record(*args)  # type: ignore[arg-type]
        finally:
            spent.append(time.perf_counter() - start)

    edge_files.record = timed  # type: ignore[assignment]


def time_writes(folder: Path, calls: int) -> dict[str, float | int]:
    rng = np.random.default_rng(int(time.time()))
    times: list[float] = []
    recording: list[float] = []
    _timing_file_checksums(recording)
    with EdgeStore(str(folder)) as store:
        dim = store.require_manifest().dim
        for call in range(calls + 1):
            tag = f"{time.time_ns()}-{call}"
            documents = [Document(id=f"new-{tag}-{j}", text=f"新文档 {tag}-{j}：咳嗽发热") for j in range(10)]
            vectors = _vectors(rng, 10, dim)
            start = time.perf_counter()
            store.upsert(documents, vectors)
            store.commit()
            if call:  # the first call warms caches (and records what an older store lacks): not timed
                times.append(time.perf_counter() - start)
            else:
                recording.clear()
        count = store.count()
        start = time.perf_counter()
        store.verify()
        verify_s = time.perf_counter() - start
    checksums = {"small_write_checksum_ms": round(1000 * statistics.median(recording), 1)} if recording else {}
    return {
        "n": count,
        "small_write_ms": round(1000 * statistics.median(times), 1),
        "small_write_min_ms": round(1000 * min(times), 1),
        "small_write_max_ms": round(1000 * max(times), 1),
        **checksums,
        "verify_s": round(verify_s, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", type=Path, help="build a store in this folder")
    parser.add_argument("--time", type=Path, help="time small writes into the store in this folder")
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()
    if args.build:
        build(args.build, args.n, args.dim)
    if args.time:
        result = time_writes(args.time, args.calls)
        if args.json:
            print(json.dumps(result))
        else:
            print(f"{result['n']} points: a 10-document write and commit takes {result['small_write_ms']} ms (median)")


if __name__ == "__main__":
    main()
