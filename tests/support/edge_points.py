"""Points for the Qdrant Edge adapter's tests: uuids, random vectors, a payload and a sparse vector each."""

from __future__ import annotations

import numpy as np

from care_retriever.stores.qdrant import edge

DIM = 16


def edge_point_ids(n: int, start: int = 0) -> list[str]:
    return [f"00000000-0000-0000-0000-{i:012d}" for i in range(start, start + n)]


def edge_points(n: int, start: int = 0, seed: int = 0) -> list[edge.EdgePoint]:
    vectors = np.random.default_rng(seed).normal(size=(n, DIM)).astype(np.float32)
    return [
        edge.EdgePoint(
            pid, v.tolist(), {"doc_id": f"d{start + i}", "group": (start + i) % 3}, ([1, 100 + start + i], [0.5, 1.0])
        )
        for i, (pid, v) in enumerate(zip(edge_point_ids(n, start), vectors, strict=True))
    ]
