"""One cell of the store scale table (:mod:`benchmarks.store_scale`): one store kind built from one set of
precomputed vectors through the product's store classes, then searched.

A dataset is a folder: ``vectors.npy`` (N x d float32 rows), ``queries.npy`` and, optionally, ``docs.jsonl`` (the
rows' ids and texts, one JSON object a line; without it row ``i`` is a document ``d{i}`` with no text). The cell
reads the rows in blocks with plain file reads (not a memory map, whose pages would count in this process's
RSS), writes them through the store's ``prepare`` / ``upsert`` / ``finalize`` with the options a user gives
(``--index-type hnsw``, ``--quantize sq8``: their config equivalents, everything else at the store's defaults),
then answers the queries one at a time, first from one thread, then from several, and returns the ids found.

Run as ``python -m benchmarks.store_scale_cell --kind K --dataset DIR --store DIR --result FILE`` by the driver
(one process per cell, so that its peak RSS is this cell's); the progress file it keeps is what the driver
reports when it stops a cell that ran past its time budget.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from care_retriever.documents import Document
from care_retriever.stores.base import VectorStore

BLOCK = 10_000  # rows per upsert call


@dataclass(frozen=True)
class Kind:
    label: str  # engine and settings, as the table shows them
    open: Callable[[Path], tuple[VectorStore, Any]]  # the store at a folder, and the index options to prepare with
    # commit after each block of BLOCK rows, as `index` checkpoints every 8,192 documents (the other kinds write
    # all their rows, then finalize: how their rows in benchmarks/results/scale.md were measured)
    commit_each_block: bool = False


def _faiss(options: dict[str, Any]) -> Callable[[Path], tuple[VectorStore, Any]]:
    def opener(folder: Path) -> tuple[VectorStore, Any]:
        from care_retriever.stores import open_store
        from care_retriever.stores.config import FaissIndexConfig

        return open_store(f"faiss:{folder}"), FaissIndexConfig(**options)

    return opener


def _edge(options: dict[str, Any]) -> Callable[[Path], tuple[VectorStore, Any]]:
    def opener(folder: Path) -> tuple[VectorStore, Any]:
        from care_retriever.stores import open_store
        from care_retriever.stores.config import QdrantCollectionConfig

        return open_store(f"qdrant:{folder}"), QdrantCollectionConfig(**options)

    return opener


def _local_mode(folder: Path) -> tuple[VectorStore, Any]:
    """The store of earlier releases at ``qdrant:PATH``: the Qdrant store over qdrant-client's local mode."""
    import warnings

    from care_retriever.stores.config import QdrantCollectionConfig
    from care_retriever.stores.qdrant import ServerStore
    from care_retriever.stores.qdrant.server_settings import client

    warnings.filterwarnings("ignore", message=".*Local mode is not recommended.*")
    folder.mkdir(parents=True, exist_ok=True)
    return ServerStore(str(folder), client=client(str(folder))), QdrantCollectionConfig()


KINDS: dict[str, Kind] = {
    "faiss-flat": Kind("FAISS flat (exact)", _faiss({})),
    "faiss-sq8": Kind("FAISS flat, sq8 codes + rescoring", _faiss({"quantize": "sq8"})),
    "faiss-hnsw": Kind("FAISS HNSW", _faiss({"index_type": "hnsw"})),
    "edge-hnsw": Kind("Qdrant Edge HNSW", _edge({})),
    "edge-int8": Kind("Qdrant Edge HNSW, int8 codes", _edge({"quantize": "sq8"})),
    # the original vectors memory-mapped (--on-disk-vectors): what optimize() peaks at with them out of RAM
    "edge-hnsw-on-disk": Kind("Qdrant Edge HNSW, vectors on disk", _edge({"on_disk": True})),
    # segments of at most 500,000 KB (about 167,000 768-d vectors): what optimize() peaks at one segment at a time
    "edge-hnsw-segments": Kind(
        "Qdrant Edge HNSW, 500 MB segments", _edge({"max_segment_size": 500_000}), commit_each_block=True
    ),
    # the same segments searched with a shorter candidate list in each (Edge's default ef is 512)
    "edge-hnsw-segments-ef128": Kind(
        "Qdrant Edge HNSW, 500 MB segments, ef 128",
        _edge({"max_segment_size": 500_000, "ef_search": 128}),
        commit_each_block=True,
    ),
    "local-mode": Kind("qdrant-client local mode (earlier releases)", _local_mode),
}


# ---------------------------------------------------------------------------------------------------- measuring
def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not found in /proc/self/status (Linux only)")


def rss_now() -> int:
    """Resident memory of this process now, bytes (VmRSS: anonymous and mapped pages)."""
    return _status_bytes("VmRSS")


def peak_rss() -> int:
    """This process's peak resident memory, bytes (VmHWM: its own; ``getrusage``'s ``ru_maxrss`` would carry the
    parent's peak across fork and exec)."""
    return _status_bytes("VmHWM")


def disk_bytes(folder: Path) -> int:
    """``du`` of the store's folder: the blocks its files take (sparse files count what is allocated)."""
    done = subprocess.run(["du", "-sk", str(folder)], capture_output=True, text=True, check=True)
    return int(done.stdout.split()[0]) * 1024


def row_blocks(path: Path, block: int = BLOCK) -> Iterator[np.ndarray]:
    """The rows of a ``.npy`` file, ``block`` at a time, by plain reads (no mapping kept in this process)."""
    with open(path, "rb") as fh:
        version = np.lib.format.read_magic(fh)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(fh)
        if fortran or len(shape) != 2:
            raise ValueError(f"{path}: expected a C-ordered 2-d array")
        for start in range(0, shape[0], block):
            count = min(block, shape[0] - start) * shape[1]
            yield np.fromfile(fh, dtype=dtype, count=count).reshape(-1, shape[1]).astype(np.float32, copy=False)


def row_documents(dataset: Path) -> Callable[[int, int], list[Document]]:
    docs = dataset / "docs.jsonl"
    if not docs.is_file():
        return lambda start, size: [Document(id=f"d{i}", text="") for i in range(start, start + size)]
    rows = [json.loads(line) for line in docs.read_text(encoding="utf-8").splitlines() if line.strip()]
    return lambda start, size: [Document(id=r["id"], text=r["text"]) for r in rows[start : start + size]]


def search_pass(
    store: VectorStore, queries: np.ndarray, k: int, threads: int, min_s: float, max_s: float
) -> dict[str, Any]:
    """Queries answered one per call from ``threads`` threads: the queries in order (again and again until
    ``min_s`` has passed; stopped at ``max_s``). Returns the rate and the ids found for each query's first answer."""
    found: list[list[str] | None] = [None] * len(queries)
    lock = threading.Lock()
    state = {"next": 0, "answered": 0}
    start = time.perf_counter()

    def work() -> None:
        while True:
            with lock:
                now = time.perf_counter() - start
                if now >= max_s or (state["next"] >= len(queries) and now >= min_s):
                    return
                i = state["next"] % len(queries)
                state["next"] += 1
            hits = store.search(queries[i : i + 1], k, payload=False)[0]
            with lock:
                state["answered"] += 1
                if found[i] is None:
                    found[i] = [h.id for h in hits]

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    elapsed = time.perf_counter() - start
    return {"qps": state["answered"] / elapsed, "answered": state["answered"], "seconds": elapsed, "found": found}


def run_cell(
    kind: str,
    dataset: Path,
    folder: Path,
    *,
    k: int = 10,
    threads: tuple[int, ...] = (1, 8),
    min_search_s: float = 5.0,
    max_search_s: float = 60.0,
    progress: Path | None = None,
) -> dict[str, Any]:
    """Build ``kind`` at ``folder`` from ``dataset``'s rows and search it with its queries: the cell's figures and,
    under ``found``, the ids of the first answer to each query (None where the passes stopped before it)."""

    def note(phase: str, points: int) -> None:
        if progress is not None:
            progress.write_text(json.dumps({"phase": phase, "points": points, "s": time.perf_counter() - started}))

    spec = KINDS[kind]
    header = np.load(dataset / "vectors.npy", mmap_mode="r")
    n, dim = header.shape
    del header
    queries = np.load(dataset / "queries.npy")
    documents = row_documents(dataset)
    load_start = os.getloadavg()
    started = time.perf_counter()
    store, options = spec.open(folder)
    store.prepare(dim, "bench-space", "bench-model", options)
    written = 0
    for block in row_blocks(dataset / "vectors.npy"):
        note("write", written)
        store.upsert(documents(written, len(block)), block)
        written += len(block)
        if spec.commit_each_block:
            store.commit()
    upsert_s = time.perf_counter() - started
    note("finalize (index build)", written)
    store.finalize()
    build_s = time.perf_counter() - started
    result: dict[str, Any] = {
        "kind": kind,
        "label": spec.label,
        "n": int(n),
        "dim": int(dim),
        "upsert_s": upsert_s,
        "build_s": build_s,
        "disk_bytes": disk_bytes(folder),
        "index": _index_settings(store),
    }
    for count in threads:
        note(f"search, {count} thread(s)", written)
        measured = search_pass(store, queries, k, count, min_search_s, max_search_s)
        found = measured.pop("found")
        result[f"search_{count}"] = measured
        if "found" not in result:
            result["found"] = found
    result["rss_serving_bytes"] = rss_now()
    store.close()
    result["peak_rss_bytes"] = max(peak_rss(), result["rss_serving_bytes"])  # VmHWM is updated lazily
    result["cores"] = os.cpu_count()
    result["load_start"], result["load_end"] = list(load_start), list(os.getloadavg())
    return result


def _index_settings(store: VectorStore) -> dict[str, Any]:
    """What the store reports it built (FAISS: its manifest's index options; Edge: segments and indexed vectors)."""
    settings = getattr(store, "collection_settings", None)
    if settings is not None:
        built = settings()
        keep = (
            "quantize",
            "m",
            "ef_construct",
            "ef_search",
            "points",
            "indexed_vectors",
            "segments",
            "segment_indexes",
        )
        found = {key: built[key] for key in keep if key in built}
        recorded = store.manifest.index if store.manifest is not None else {}
        if "ef_search" not in found and recorded.get("ef_search"):  # Edge's search setting is its manifest's
            found["ef_search"] = recorded["ef_search"]
        return found
    manifest = store.manifest
    return dict(manifest.index) if manifest is not None else {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=sorted(KINDS), required=True)
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--store", type=Path, required=True, help="the store's folder (created)")
    parser.add_argument("--result", type=Path, required=True)
    parser.add_argument("--progress", type=Path)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--threads", default="1,8")
    parser.add_argument("--min-search-s", type=float, default=5.0)
    parser.add_argument("--max-search-s", type=float, default=60.0)
    args = parser.parse_args(argv)
    result = run_cell(
        args.kind,
        args.dataset,
        args.store,
        k=args.k,
        threads=tuple(int(x) for x in args.threads.split(",")),
        min_search_s=args.min_search_s,
        max_search_s=args.max_search_s,
        progress=args.progress,
    )
    args.result.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
