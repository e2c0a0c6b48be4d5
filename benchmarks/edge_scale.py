"""Qdrant Edge at scale, in the large layout: vectors on disk (memory-mapped), int8 codes always in RAM, and
optionally segments of at most ``--max-segment-size`` KB (built one at a time by ``optimize()``).

    python -m benchmarks.edge_scale --work /work/runs/edge-large --n 100000,250000,500000 --json
    flock /work/heavy.lock python -m benchmarks.edge_scale --work /work/runs/edge-large --n 1000000 --segment-kb 1000000

Each size runs in its own process (``--cell``), so its peak RSS (VmHWM) is that build's: the writes, ``finalize``
(Edge's ``optimize()``: HNSW graphs and int8 codes), then searches from 1 and 8 threads, recall@10 against exact
search, a 10-document write (upsert + commit) and ``verify``. Data: :mod:`benchmarks.store_scale`'s synthetic
clustered 768-d vectors. A finished size is kept under ``--work/edge-results`` and a re-run skips it. The table is
written into benchmarks/results/scale.md between its ``edge_scale`` markers; ``--json`` prints one line per size.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.marked_sections import write_marked
from benchmarks.store_scale import recall_against, synthetic_dataset
from benchmarks.store_scale_cell import disk_bytes, peak_rss, row_blocks, row_documents, rss_now, search_pass

DOC = Path(__file__).resolve().parent / "results" / "scale.md"
SECTION = "edge_scale"  # <!-- edge_scale:start --> ... <!-- edge_scale:end --> of DOC
BLOCK = 10_000


def build_and_measure(dataset: Path, folder: Path, segment_kb: int | None, k: int, search_s: float) -> dict[str, Any]:
    """One Edge store built from ``dataset`` at ``folder`` in the large layout, then measured."""
    from care_retriever.documents import Document
    from care_retriever.stores import open_store
    from care_retriever.stores.config import QdrantCollectionConfig

    vectors = np.load(dataset / "vectors.npy", mmap_mode="r")
    n, dim = vectors.shape
    del vectors
    queries = np.load(dataset / "queries.npy")
    documents = row_documents(dataset)
    config = QdrantCollectionConfig(on_disk=True, quantize="sq8", always_ram=True, max_segment_size=segment_kb)
    load_start = os.getloadavg()
    started = time.perf_counter()
    progress = folder.with_name(folder.name + ".progress.json")  # what a stopped size had reached

    def note(phase: str, points: int) -> None:
        seconds = time.perf_counter() - started
        progress.write_text(json.dumps({"phase": phase, "points": points, "s": seconds, "peak_rss": peak_rss()}))

    store = open_store(f"qdrant:{folder}")
    store.prepare(dim, "bench-space", "bench-model", config)
    written = 0
    for block in row_blocks(dataset / "vectors.npy", BLOCK):
        store.upsert(documents(written, len(block)), block)
        written += len(block)
        store.commit()  # as `index` checkpoints; past max_segment_size this optimizes the segment written
        note("write", written)
    upsert_s = time.perf_counter() - started
    note("finalize (optimize)", written)
    store.finalize()
    note("search", written)
    build_s = time.perf_counter() - started
    result: dict[str, Any] = {
        "n": int(n),
        "dim": int(dim),
        "segment_kb": segment_kb,
        "upsert_s": upsert_s,
        "build_s": build_s,
        "peak_build_rss_bytes": peak_rss(),
        "disk_bytes": disk_bytes(folder),
        "built": {key: value for key, value in store.collection_settings().items() if key != "segment_indexes"},
    }
    for threads in (1, 8):
        measured = search_pass(store, queries, k, threads, search_s, 6 * search_s)
        found = measured.pop("found")
        result[f"search_{threads}"] = measured
        result.setdefault("found", found)
    result["rss_serving_bytes"] = rss_now()
    rng = np.random.default_rng(1)
    fresh = rng.standard_normal((10, dim)).astype(np.float32)
    fresh /= np.linalg.norm(fresh, axis=1, keepdims=True)
    started = time.perf_counter()
    store.upsert([Document(id=f"new{i}", text=f"new document {i}") for i in range(10)], fresh)
    store.commit()
    result["small_write_ms"] = (time.perf_counter() - started) * 1000
    started = time.perf_counter()
    result["verified"] = store.verify()
    result["verify_s"] = time.perf_counter() - started
    store.close()
    result["peak_rss_bytes"] = peak_rss()
    result["load_start"], result["load_end"] = list(load_start), list(os.getloadavg())
    result["cores"] = os.cpu_count()
    return result


def cell_name(n: int, segment_kb: int | None) -> str:
    return f"edge-large-{n}-" + (f"seg{segment_kb}kb" if segment_kb else "one-segment")


def run_size(work: Path, n: int, args: argparse.Namespace) -> dict[str, Any]:
    """The size ``n`` in its own process; its result kept (a kept one is returned without a run)."""
    name = cell_name(n, args.segment_kb)
    kept = work / "edge-results" / f"{name}.json"
    if kept.is_file():
        return dict(json.loads(kept.read_text()))
    dataset = synthetic_dataset(work, n, args.dim, args.queries, args.k)
    store, raw = work / "stores" / name, work / "edge-results" / f"{name}.raw.json"
    shutil.rmtree(store, ignore_errors=True)
    raw.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "benchmarks.edge_scale", "--cell", str(dataset), "--store", str(store)]
    cmd += ["--raw", str(raw), "--k", str(args.k), "--search-s", str(args.search_s)]
    cmd += ["--segment-kb", str(args.segment_kb)] if args.segment_kb else []
    env = {"OMP_WAIT_POLICY": "PASSIVE", **os.environ, "PYTHONWARNINGS": "ignore"}
    subprocess.run(cmd, env=env, cwd=Path(__file__).resolve().parent.parent, check=True)
    result: dict[str, Any] = json.loads(raw.read_text())
    found = result.pop("found")
    ids = [f"d{i}" for i in range(n)]
    result["recall"], result["recall_queries"] = recall_against(found, np.load(dataset / "truth.npy"), ids, args.k)
    result["date"] = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    result["command"] = "python -m benchmarks.edge_scale " + shlex.join(sys.argv[1:])
    kept.write_text(json.dumps(result))
    raw.unlink()
    shutil.rmtree(store, ignore_errors=True)  # gigabytes each: one store on disk at a time
    return result


def _mib(value: float) -> str:
    return f"{value / 2**20:,.0f}"


def row(r: dict[str, Any]) -> str:
    segments = f"{r['segment_kb']:,} KB" if r["segment_kb"] else "one (Qdrant's default)"
    built = r["built"]
    return (
        f"| {r['n']:,} | {segments} | {r['build_s']:,.0f} ({r['upsert_s']:,.0f}) | {_mib(r['disk_bytes'])} "
        f"| {_mib(r['peak_build_rss_bytes'])} | {_mib(r['rss_serving_bytes'])} | {r['search_1']['qps']:,.0f} "
        f"| {r['search_8']['qps']:,.0f} | {r['recall']:.3f} ({r['recall_queries']}) | {r['small_write_ms']:,.0f} "
        f"| {r['verify_s']:,.1f} | {built['indexed_vectors']:,} indexed, {built['segments']} segments "
        f"| {r['load_start'][0]:.1f} / {r['load_end'][0]:.1f} |"
    )


def table(results: list[dict[str, Any]]) -> str:
    dates = sorted(r["date"] for r in results)
    commands = sorted({r["command"] for r in results})
    return (
        "\n".join(
            [
                f"Measured {dates[0]} to {dates[-1]} on {results[0]['cores']} shared CPU cores (load average at "
                "start / end in each row): Qdrant Edge, vectors on disk + int8 codes in RAM, by:",
                "",
                *[f"    {c}" for c in commands],
                "",
                "| points | segments | build s (writes s) | disk MiB | peak RSS building MiB | RSS serving MiB "
                "| q/s, 1 thread | q/s, 8 threads | recall@10 vs exact (queries) | 10-doc write ms | verify s "
                "| what was built | load avg |",
                "|" + "---|" * 13,
                *[row(r) for r in results],
            ]
        )
        + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, help="datasets, stores and results (outside the repo)")
    parser.add_argument("--n", default="", help="sizes, comma-separated")
    parser.add_argument("--segment-kb", type=int, default=None, help="Edge's max_segment_size (KB); default: none")
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--search-s", type=float, default=10.0, help="seconds of queries per thread count (at least)")
    parser.add_argument("--json", action="store_true", help="one JSON line per size")
    parser.add_argument("--cell", type=Path, help=argparse.SUPPRESS)  # a dataset: run one size in this process
    parser.add_argument("--store", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--raw", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.cell is not None:
        result = build_and_measure(args.cell, args.store, args.segment_kb, args.k, args.search_s)
        args.raw.write_text(json.dumps(result))
        return 0
    if args.work is None:
        parser.error("--work is required")
    for n in (int(x) for x in args.n.split(",") if x):
        result = run_size(args.work, n, args)
        if args.json:
            print(json.dumps({key: value for key, value in result.items() if key != "built"}), flush=True)
    results = sorted(
        (json.loads(p.read_text()) for p in (args.work / "edge-results").glob("*[!w].json")),
        key=lambda r: (r["n"], r["segment_kb"] or 0),
    )
    if results:
        text = table(results)
        print(text)
        write_marked(DOC, SECTION, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
