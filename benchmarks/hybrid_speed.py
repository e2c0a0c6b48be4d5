"""Hybrid vs dense-only on a FAISS store: query latency (batch 1) and index wall time, side by side.

    python -m benchmarks.hybrid_speed --model MODEL [--data ../shared/data] [--queries 200]

Corpus: kuake-qtr-retrieval's 32,176 page titles; queries: its dev queries. Indexes the corpus dense-only
and then adds the BM25 side to that store (``index --sparse-only``), timing both back to back; then times
``CareRetriever.search`` one query at a time, dense, hybrid and sparse taking turns per query so all see
the same machine load. Targets:
hybrid latency <= 1.3x dense; index with the sparse side <= 1.1x dense-only. Writes docs/hybrid_speed.json
(read by benchmarks/hybrid_eval.py into docs/hybrid.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from care_retriever.documents import Document
from care_retriever.evaluation.tasks import load_task
from care_retriever.indexing.config import EncodeConfig
from care_retriever.indexing.writer import DocumentStoreWriter
from care_retriever.model.embedder import AsymmetricEmbedder
from care_retriever.search.retriever import CareRetriever
from care_retriever.stores import open_store


def index_seconds(embedder, docs, spec: str, sparse: bool) -> float:
    """Wall seconds of one full build of the store."""
    writer = DocumentStoreWriter(
        embedder, spec, sparse=sparse, show_progress=False, encode=EncodeConfig(chunk_size=4096)
    )
    t0 = time.perf_counter()
    writer.write(docs)
    total = time.perf_counter() - t0
    writer.store.close()
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--out", type=Path, default=Path("docs/hybrid_speed.json"))
    args = parser.parse_args()
    task = load_task(args.data / "tasks" / "kuake-qtr-retrieval")
    # Its rows are page titles with an empty text field: the text the harness reads (title) is the document.
    docs = [Document(id=i, text=t) for i, t in zip(task.corpus_ids, task.corpus_texts, strict=True)]
    queries = [task.queries[q] for q in task.query_ids][: args.queries]
    embedder = AsymmetricEmbedder.from_pretrained(args.model)
    root = Path(tempfile.mkdtemp(prefix="hybrid-speed-"))
    try:
        # The index cost of the BM25 side, measured back to back on one store: D = a dense-only build, S =
        # `index --sparse-only` adding the BM25 side to it (tokenising every stored text again, so S is an
        # upper bound on what the side adds inside one `index` run). Index with the side = D + S.
        # (Two full builds, dense then hybrid, measured a load change on this shared machine, not the side.)
        spec = f"faiss:{root / 'store'}"
        dense_s = index_seconds(embedder, docs, spec, sparse=False)
        t0 = time.perf_counter()
        store = open_store(spec)
        manifest = store.require_manifest()
        store.prepare(manifest.dim, manifest.space_fingerprint, manifest.model_name)
        store.enable_sparse()
        store.finalize()
        store.close()
        sparse_s = time.perf_counter() - t0
        hybrid_s = dense_s + sparse_s
        retriever = CareRetriever(spec, embedder)
        for q in queries[:10]:  # warm up both paths (SQLite pages, torch kernels)
            retriever.search(q, 10)
            retriever.search(q, 10, mode="hybrid")
        timings: dict[str, list[float]] = {"dense": [], "hybrid": [], "sparse": []}
        for q in queries:
            for mode in ("dense", "hybrid", "sparse"):
                t0 = time.perf_counter()
                retriever.search(q, 10, mode=mode)
                timings[mode].append((time.perf_counter() - t0) * 1000)
        retriever.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = {m: statistics.median(v) for m, v in timings.items()}
    p95 = {m: sorted(v)[int(0.95 * (len(v) - 1))] for m, v in timings.items()}
    latency_ratio, index_ratio = med["hybrid"] / med["dense"], hybrid_s / dense_s
    rows = [
        "| measure | dense only | with BM25 side | ratio | target | verdict |",
        "|---|---|---|---|---|---|",
        f"| query latency, median ms (batch 1, {len(queries)} queries, top 10) | {med['dense']:.2f} | "
        f"{med['hybrid']:.2f} | {latency_ratio:.2f}x | <= 1.3x | {'met' if latency_ratio <= 1.3 else 'missed'} |",
        f"| query latency, p95 ms | {p95['dense']:.2f} | {p95['hybrid']:.2f} | {p95['hybrid'] / p95['dense']:.2f}x | "
        "| |",
        f"| index wall time, s ({len(docs)} documents; with the side: D + S) | {dense_s:.1f} | "
        f"{hybrid_s:.1f} | {index_ratio:.2f}x | "
        f"<= 1.1x | {'met' if index_ratio <= 1.1 else 'missed'} |",
        f"| BM25 only (`--mode sparse`), median ms | | {med['sparse']:.2f} | | | |",
        f"| S: adding the BM25 side to the dense store, s | | {sparse_s:.1f} | | | |",
    ]
    load = os.getloadavg()[0]
    table = "\n".join(rows) + (
        f"\n\nModel `{args.model}`; {os.cpu_count()} CPUs, load average {load:.2f} at the end; "
        f"`python -m benchmarks.hybrid_speed --model {args.model}`."
    )
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "median_ms": med,
                "p95_ms": p95,
                "index_seconds": {"dense": dense_s, "sparse_side": sparse_s, "hybrid": hybrid_s},
                "table": table,
            },
            indent=2,
        ),
        encoding="utf-8",
    )


if __name__ == "__main__":
    main()
