"""A filter selecting few rows of an HNSW store returns the exact best of those rows (an HNSW graph search restricted
to a few allowed rows loses neighbours), the same as a flat store's."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from care_retriever.documents import Document
from care_retriever.stores import open_store
from care_retriever.stores.config import FaissIndexConfig

N, DIM = 3000, 32


def test_a_selective_filter_on_hnsw_finds_the_exact_best(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(N, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    docs = [Document(f"d{i}", "x", metadata={"bucket": i % 300}) for i in range(N)]
    store = open_store(f"faiss:{tmp_path / 's'}")
    store.prepare(DIM, "fp", "model", FaissIndexConfig(index_type="hnsw", m=4, ef_construction=8, ef_search=8))
    store.upsert(docs, vectors)
    store.finalize()
    queries = rng.normal(size=(20, DIM)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    filters = {"field": "meta.bucket", "operator": "<", "value": 2}  # 20 of 3000 rows
    allowed = np.flatnonzero(np.arange(N) % 300 < 2)
    hits = store.search(queries, 5, filters)
    for query, found in zip(queries, hits, strict=True):
        best = allowed[np.argsort(-(vectors[allowed] @ query))[:5]]
        assert [h.id for h in found] == [f"d{i}" for i in best]
    store.close()
