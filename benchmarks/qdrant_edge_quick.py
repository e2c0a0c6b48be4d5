"""A quick check of Qdrant Edge (``qdrant:PATH``) on synthetic vectors: build time, latency, recall@10 against exact
search, at a few search ``ef`` values. ``python -m benchmarks.qdrant_edge_quick`` (20,000 x 768, ~1 minute)."""

from __future__ import annotations

import tempfile
import time

import numpy as np

from care_retriever.documents import Document
from care_retriever.stores.config import QdrantCollectionConfig
from care_retriever.stores.qdrant import EdgeStore


def main(n: int = 20000, d: int = 768) -> None:
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(200, d)).astype(np.float32)
    X = centres[rng.integers(0, 200, n)] + 0.5 * rng.normal(size=(n, d)).astype(np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    Q = X[rng.choice(n, 100, replace=False)] + 0.3 * rng.normal(size=(100, d)).astype(np.float32)
    Q /= np.linalg.norm(Q, axis=1, keepdims=True)
    exact = np.argsort(-(Q @ X.T), axis=1)[:, :10]
    docs = [Document(id=f"d{i}", text="x") for i in range(n)]
    print("| quantize | ef_search | upsert (s) | build incl. optimize (s) | ms/query | recall@10 |")
    print("|---|---|---|---|---|---|")
    for quant, ef in (("none", None), ("none", 100), ("none", 128), ("sq8", None)):
        store = EdgeStore(tempfile.mkdtemp() + "/q")
        start = time.perf_counter()
        options = {"quantize": quant, **({"ef_search": ef} if ef else {})}
        store.prepare(d, "fp", "m", QdrantCollectionConfig.from_manifest(options))
        for i in range(0, n, 2000):
            store.upsert(docs[i : i + 2000], X[i : i + 2000])
        upserted = time.perf_counter() - start
        store.finalize()
        built = time.perf_counter() - start
        start = time.perf_counter()
        hits = [store.search(q, 10, payload=False)[0] for q in Q]
        per_query = (time.perf_counter() - start) / len(Q)
        recall = np.mean(
            [len({h.id for h in hs} & {f"d{j}" for j in e}) / 10 for hs, e in zip(hits, exact, strict=True)]
        )
        print(f"| {quant} | {ef or 'default'} | {upserted:.1f} | {built:.1f} | {per_query * 1000:.2f} | {recall:.3f} |")
        store.close()


if __name__ == "__main__":
    main()
