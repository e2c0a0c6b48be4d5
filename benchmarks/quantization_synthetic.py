"""The synthetic part of ``benchmarks.quantization``: memory, latency and recall of each setting on clustered unit
vectors (:mod:`benchmarks.large_index`'s generator) written through the real ``FaissStore``, one worker process per
setting (``python -m benchmarks.quantization --worker SETTING``: a fresh heap for each, and its index's RAM read by
a fresh process again).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.large_index import exact_neighbours, generate, make_queries
from benchmarks.quantization_settings import CHUNK, REPO, store_options
from care_retriever.stores.config import FaissIndexConfig


def dir_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def build_store(folder: Path, vectors: np.ndarray, options: FaissIndexConfig, fingerprint: str) -> float:
    """Write ``vectors`` (ids = row numbers) into a new FAISS store; seconds taken, publish included."""
    from care_retriever.documents import Document
    from care_retriever.stores.faiss import FaissStore

    start = time.perf_counter()
    store = FaissStore(folder)
    store.prepare(vectors.shape[1], fingerprint, fingerprint, options)
    for i in range(0, len(vectors), CHUNK):
        block = np.ascontiguousarray(vectors[i : i + CHUNK], dtype=np.float32)
        store.upsert([Document(id=str(j), text=str(j)) for j in range(i, i + len(block))], block)
    store.finalize()
    store.close()
    return time.perf_counter() - start


def search_ids(store: Any, queries: np.ndarray, k: int) -> np.ndarray:
    rows = store.search(queries, k, payload=False)
    out = np.full((len(queries), k), -1, dtype=np.int64)
    for i, row in enumerate(rows):
        out[i, : len(row)] = [int(h.id) for h in row]
    return out


def recall(found: np.ndarray, truth: np.ndarray, k: int) -> float:
    return float(np.mean([len(set(f[:k]) & set(t[:k])) / k for f, t in zip(found, truth, strict=True)]))


RAM_PROBE = """
import faiss
from benchmarks.large_index import rss_anon
before = rss_anon()
index = faiss.read_index({path!r})
print(rss_anon() - before)
"""


def index_ram(path: Path) -> int:
    """Anonymous memory a fresh process adds by reading ``path`` whole (what a searching process holds): not
    measured in the building process, whose freed memory the reader would reuse."""
    code = RAM_PROBE.format(path=str(path))
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    return int(done.stdout.split()[-1])


def synthetic_worker(args: argparse.Namespace) -> None:
    from care_retriever.stores.faiss import INDEX, FaissStore

    data = np.load(args.data, mmap_mode="r")
    queries = make_queries(data, args.queries, args.seed)
    truth = np.load(args.truth)
    folder = Path(args.workdir_store)
    build = build_store(folder, data, store_options(args.worker, args, data.shape[1]), "synthetic")
    ram = index_ram(folder / INDEX)
    result: dict[str, Any] = {
        "setting": args.worker,
        "n": len(data),
        "build_s": build,
        "ram_bytes_per_doc": ram / len(data),
        "index_file_bytes_per_doc": (folder / INDEX).stat().st_size / len(data),
        "disk_bytes_per_doc": dir_bytes(folder) / len(data),
    }
    store = FaissStore(folder)
    result["oversample"] = store.require_manifest().index.get("oversample")
    for q in queries[:5]:  # warm: a flat store's mapped vectors are read into the page cache once
        store.search(q[None, :], 10, payload=False)
    times = []
    for q in queries[: args.latency_queries]:
        t = time.perf_counter()
        store.search(q[None, :], 10, payload=False)
        times.append((time.perf_counter() - t) * 1000)
    result["p50_ms"], result["p99_ms"] = float(np.percentile(times, 50)), float(np.percentile(times, 99))
    result["recall_at_10"] = recall(search_ids(store, queries, 10), truth, 10)
    result["recall_at_100"] = recall(search_ids(store, queries, 100), truth, 100)
    if args.worker != "none":
        sweep = {}
        for value in [float(x) for x in args.oversample_sweep.split(",") if x.strip()]:
            store.oversample = value
            t = time.perf_counter()
            found = search_ids(store, queries, 10)
            sweep[f"{value:g}"] = {
                "recall_at_10": recall(found, truth, 10),
                "batch_ms_per_query": (time.perf_counter() - t) * 1000 / len(queries),
            }
        result["oversample_sweep"] = sweep
    store.close()
    Path(args.result).write_text(json.dumps(result))


def run_synthetic(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    data_path = tmp / "vectors.npy"
    t = time.perf_counter()
    generate(data_path, args.n, args.dim, args.clusters, args.seed)
    print(f"generated {args.n:,} x {args.dim} in {time.perf_counter() - t:.0f}s", file=sys.stderr)
    data = np.load(data_path, mmap_mode="r")
    truth = exact_neighbours(data, make_queries(data, args.queries, args.seed), 100)
    del data
    np.save(tmp / "truth.npy", truth)
    rows = []
    for setting in args.settings.split(","):
        result_path = tmp / f"{setting}.json"
        cmd = [
            sys.executable,
            "-m",
            "benchmarks.quantization",
            "--worker",
            setting,
            "--data",
            str(data_path),
            "--truth",
            str(tmp / "truth.npy"),
        ]
        cmd += ["--result", str(result_path), "--workdir-store", str(tmp / f"store-{setting}")]
        cmd += [
            "--queries",
            str(args.queries),
            "--latency-queries",
            str(args.latency_queries),
            "--seed",
            str(args.seed),
        ]
        cmd += ["--pq-m", str(args.pq_m or 0), "--oversample-sweep", args.oversample_sweep]
        print(f"synthetic: {setting} ...", file=sys.stderr)
        env = {"OMP_WAIT_POLICY": "PASSIVE", **os.environ, "PYTHONWARNINGS": "ignore"}
        if subprocess.run(cmd, env=env, cwd=REPO).returncode != 0:
            print(f"{setting}: failed", file=sys.stderr)
            continue
        row = json.loads(result_path.read_text())
        print(json.dumps({k: v for k, v in row.items() if k != "oversample_sweep"}), file=sys.stderr)
        rows.append(row)
        subprocess.run(["rm", "-rf", str(tmp / f"store-{setting}")], check=False)  # disk: one store at a time
    return {
        "n": args.n,
        "dim": args.dim,
        "queries": args.queries,
        "latency_queries": args.latency_queries,
        "clusters": args.clusters,
        "measured": time.strftime("%Y-%m-%d"),
        "cpu_cores": os.cpu_count(),
        "rows": rows,
    }
