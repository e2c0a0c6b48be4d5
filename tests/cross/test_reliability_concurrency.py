"""``CareRetriever.search`` from many threads gives exactly what serial calls give (FAISS and Qdrant)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from care_retriever import CareRetriever, DocumentStoreWriter
from care_retriever.indexing.corpus import Document

WORDS = [
    "高血压",
    "感冒",
    "糖尿病",
    "腹泻",
    "失眠",
    "发烧",
    "宝宝",
    "饮食",
    "运动",
    "就医",
    "降压药",
    "病毒",
    "脱水",
    "咖啡",
    "监测",
]


@pytest.fixture(scope="module")
def corpus() -> list[Document]:
    rng = np.random.default_rng(0)
    return [
        Document(f"d{i}", "".join(rng.choice(WORDS, size=int(rng.integers(2, 8)))), metadata={"group": int(i % 4)})
        for i in range(400)
    ]


def _queries(n: int) -> list[str]:
    rng = np.random.default_rng(1)
    return ["".join(rng.choice(WORDS, size=int(rng.integers(1, 4)))) for _ in range(n)]


def _key(hits) -> list[tuple[str, float]]:
    return [(h.id, round(h.score, 5)) for h in hits]


@pytest.mark.parametrize("spec", ["faiss-flat", "faiss-hnsw", "qdrant-memory"])
def test_threaded_search_equals_serial(embedder, corpus, tmp_path: Path, spec: str) -> None:
    store = {
        "faiss-flat": f"faiss:{tmp_path / 'f'}",
        "faiss-hnsw": f"faiss:{tmp_path / 'h'}",
        "qdrant-memory": "qdrant::memory:",
    }[spec]
    options = {"type": "hnsw", "m": 8} if spec == "faiss-hnsw" else None
    writer = DocumentStoreWriter(embedder, store, show_progress=False, index_options=options)
    writer.write(corpus)
    retriever = CareRetriever(writer.store, embedder)
    queries = _queries(60)
    filters = [None, {"group": 1}, {"group": [0, 2]}]
    serial = [_key(retriever.search(q, top_k=7, filters=filters[i % 3])) for i, q in enumerate(queries)]
    serial_batch = [[_key(h) for h in retriever.search(queries[i : i + 5], top_k=3)] for i in range(0, 60, 5)]

    def one(i: int) -> list[tuple[str, float]]:
        return _key(retriever.search(queries[i], top_k=7, filters=filters[i % 3]))

    def batch(i: int) -> list[list[tuple[str, float]]]:
        return [_key(h) for h in retriever.search(queries[i * 5 : i * 5 + 5], top_k=3)]

    with ThreadPoolExecutor(max_workers=8) as pool:
        singles = pool.map(one, range(60), timeout=120)
        batches = pool.map(batch, range(12), timeout=120)
        assert list(singles) == serial
        assert list(batches) == serial_batch
    assert all(len(hits) == 7 for hits in serial[::3])


def test_threaded_encoding_equals_serial(embedder) -> None:
    """The tokenizer is shared (fast tokenizers are not re-entrant); the forward pass is not serialised."""
    texts = _queries(64)
    serial_q = embedder.embed_queries(texts)
    serial_d = embedder.embed_documents(texts)
    with ThreadPoolExecutor(max_workers=8) as pool:
        rows_q = list(pool.map(lambda t: embedder.embed_queries([t])[0], texts, timeout=120))
        rows_d = list(pool.map(lambda t: embedder.embed_documents([t])[0], texts, timeout=120))
    np.testing.assert_allclose(np.stack(rows_q), serial_q, atol=1e-5)
    np.testing.assert_allclose(np.stack(rows_d), serial_d, atol=1e-5)
