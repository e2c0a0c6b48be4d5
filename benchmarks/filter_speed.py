"""How fast and how exact are filtered searches run inside each engine, against the widening post-filter they
replace? N synthetic unit vectors with a ``bucket`` field; range filters matching 50%, 5%, 0.5% and 0.05% of the
documents; FAISS flat / HNSW / sq8 and Qdrant Edge HNSW / int8 through the product's stores. For each: queries/s
(one query a call) and recall@10 against exact filtered search (numpy over the matching rows); beside it the
widening path (search 10 unfiltered, keep the hits whose metadata match, widen x4 until 10 match or the store is
exhausted).

    python -m benchmarks.filter_speed --n 100000 [--json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from care_retriever.documents import Document
from care_retriever.stores import open_store
from care_retriever.stores.base import Hit, VectorStore
from care_retriever.stores.config import FaissIndexConfig, QdrantCollectionConfig
from care_retriever.stores.filter_matching import matches
from care_retriever.stores.filters import parse_filters

BUCKETS = 20_000
SELECTIVITIES = (0.5, 0.05, 0.005, 0.0005)
TOP_K = 10
ENGINES: dict[str, tuple[str, Any]] = {
    "faiss flat": ("faiss", FaissIndexConfig()),
    "faiss hnsw": ("faiss", FaissIndexConfig(index_type="hnsw")),
    "faiss sq8": ("faiss", FaissIndexConfig(quantize="sq8")),
    "edge hnsw": ("qdrant", QdrantCollectionConfig()),
    "edge int8": ("qdrant", QdrantCollectionConfig(quantize="sq8")),
}


def _unit(rows: int, dim: int, seed: int) -> np.ndarray:
    vectors = np.random.default_rng(seed).normal(size=(rows, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def _build(kind: str, config: Any, folder: Path, vectors: np.ndarray) -> VectorStore:
    store = open_store(f"{kind}:{folder}")
    store.prepare(vectors.shape[1], "synthetic", "synthetic", config)
    for start in range(0, len(vectors), 5000):
        rows = range(start, min(start + 5000, len(vectors)))
        store.upsert(
            [Document(f"d{i}", "x", metadata={"bucket": i % BUCKETS}) for i in rows], vectors[rows[0] : rows[-1] + 1]
        )
    store.finalize()
    return store


def _widening(store: VectorStore, query: np.ndarray, filters: dict[str, Any], total: int) -> list[Hit]:
    node, k = parse_filters(filters), TOP_K
    while True:
        hits = store.search(query, k)[0]
        kept = [h for h in hits if matches(node, h.metadata)]
        if len(kept) >= TOP_K or len(hits) < k or k >= total:
            return kept[:TOP_K]
        k = min(total, k * 4)


def _measure(
    search: Callable[[np.ndarray], list[Hit]], queries: np.ndarray, truth: list[set[str]], budget: float
) -> dict[str, float]:
    found, done, start = 0, 0, time.perf_counter()
    for query, want in zip(queries, truth, strict=True):
        hits = search(query[None, :])
        found += len({h.id for h in hits} & want)
        done += 1
        if time.perf_counter() - start > budget:
            break
    elapsed = time.perf_counter() - start
    wanted = sum(len(t) for t in truth[:done])
    return {"qps": done / elapsed, "recall": found / wanted if wanted else 1.0, "queries": done}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100_000, help="stored vectors")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--budget", type=float, default=10.0, help="seconds at most per measured cell")
    parser.add_argument("--engines", default=",".join(ENGINES), help="comma-separated: " + ", ".join(ENGINES))
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args(argv)
    vectors, queries = _unit(args.n, args.dim, 0), _unit(args.queries, args.dim, 1)
    buckets = np.arange(args.n) % BUCKETS
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.engines.split(","):
            kind, config = ENGINES[name]
            start = time.perf_counter()
            store = _build(kind, config, Path(tmp) / name.replace(" ", "-"), vectors)
            build = time.perf_counter() - start
            for fraction in SELECTIVITIES:
                bound = max(1, round(BUCKETS * fraction))
                filters = {"field": "meta.bucket", "operator": "<", "value": bound}
                allowed = np.flatnonzero(buckets < bound)
                scores = queries @ vectors[allowed].T
                top = np.argsort(-scores, axis=1)[:, :TOP_K]
                truth = [{f"d{allowed[j]}" for j in row} for row in top]
                pushed = _measure(lambda q: store.search(q, TOP_K, filters)[0], queries, truth, args.budget)  # noqa: B023
                widened = _measure(lambda q: _widening(store, q, filters, args.n), queries, truth, args.budget)  # noqa: B023
                rows.append(
                    {
                        "engine": name,
                        "selectivity": fraction,
                        "matching": len(allowed),
                        "build_s": round(build, 1),
                        "qps": round(pushed["qps"], 1),
                        "recall": round(pushed["recall"], 4),
                        "widening_qps": round(widened["qps"], 2),
                        "widening_recall": round(widened["recall"], 4),
                        "widening_queries": widened["queries"],
                    }
                )
            store.close()
    if args.json:
        print(json.dumps({"n": args.n, "dim": args.dim, "rows": rows}))
        return 0
    print(f"N={args.n} dim={args.dim}, recall@{TOP_K} against exact filtered search")
    print("| engine | matching | in-engine q/s | recall@10 | widening q/s | widening recall@10 |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['engine']} | {r['selectivity']:.2%} ({r['matching']}) | {r['qps']} | {r['recall']} | "
            f"{r['widening_qps']} | {r['widening_recall']} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
