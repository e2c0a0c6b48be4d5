"""A filter that allows a fraction of an Edge store's points, searched through its HNSW graph (more points than the
full-scan threshold), still finds the exact filtered top 10: the graph walk must not lose the allowed neighbours
that only refused points link to."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("qdrant_edge")

from care_retriever.documents import Document
from care_retriever.stores import open_store
from care_retriever.stores.config import QdrantCollectionConfig
from care_retriever.stores.qdrant import edge

N, DIM, QUERIES, K = 3000, 32, 30, 10


def test_a_filter_allowing_a_fifth_of_the_points_keeps_recall(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(edge, "FULL_SCAN_KB", 1)  # filters of more than a few points search the graph
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(N, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    store = open_store(f"qdrant:{tmp_path / 's'}")
    config = QdrantCollectionConfig(m=4, ef_construct=16, ef_search=32, indexing_threshold=10)
    store.prepare(DIM, "fp", "model", config)
    store.upsert([Document(f"d{i}", "x", metadata={"bucket": i % 100}) for i in range(N)], vectors)
    store.finalize()
    queries = vectors[rng.choice(N, QUERIES, replace=False)] + 0.1 * rng.normal(size=(QUERIES, DIM)).astype(np.float32)
    allowed = np.flatnonzero(np.arange(N) % 100 < 20)
    filters = {"field": "meta.bucket", "operator": "<", "value": 20}
    found = 0
    for query, hits in zip(queries, store.search(queries, K, filters), strict=True):
        best = allowed[np.argsort(-(vectors[allowed] @ query))[:K]]
        found += len({h.id for h in hits} & {f"d{i}" for i in best})
    store.close()
    # a small graph and ef, so that a walk losing allowed neighbours shows (about 0.79 then, 0.95 with them kept)
    assert found / (QUERIES * K) >= 0.9
