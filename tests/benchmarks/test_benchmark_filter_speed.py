"""The filter benchmark's data looks like embeddings: each query has stored rows close to it (uniform random
vectors have none, and make an HNSW index's recall look broken)."""

from __future__ import annotations

import numpy as np

from benchmarks.filter_speed import clustered

N, DIM, CLUSTERS, QUERIES = 4000, 64, 40, 20


def test_queries_have_near_neighbours_among_the_stored_rows() -> None:
    vectors, queries = clustered(N, DIM, CLUSTERS, QUERIES)
    assert vectors.shape == (N, DIM) and queries.shape == (QUERIES, DIM)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    best = np.sort(queries @ vectors.T, axis=1)[:, -10:]
    # random 64-d unit vectors: the 10th best of 4,000 cosines is about 0.3; here they share a cluster
    assert best.min() > 0.6
