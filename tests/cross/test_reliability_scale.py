"""The large-corpus options: FAISS IVF-PQ stores, Qdrant collection settings and concurrent jobs joining one
collection, and the large-index benchmark on a small N."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from qdrant_client import QdrantClient

from care_retriever.errors import InputError, StoreError
from care_retriever.indexing.corpus import Document
from care_retriever.stores import open_store
from care_retriever.stores.config import FaissIndexConfig, IndexType, QdrantCollectionConfig
from care_retriever.stores.faiss import FaissStore
from care_retriever.stores.qdrant import QdrantStore

REPO = Path(__file__).resolve().parents[2]
DIM = 32


def _data(n: int, seed: int = 0) -> tuple[list[Document], np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((20, DIM)).astype(np.float32)
    x = centres[rng.integers(0, 20, n)] + 0.3 * rng.standard_normal((n, DIM)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return [Document(f"d{i}", f"文档 {i}", metadata={"g": i % 2}) for i in range(n)], x


def test_ivfpq_store_writes_reopens_updates_and_finds_neighbours(tmp_path: Path) -> None:
    docs, vectors = _data(1200)
    spec = tmp_path / "pq"
    store = FaissStore(spec)
    store.prepare(DIM, "fp", "m", FaissIndexConfig(index_type=IndexType.IVFPQ, nlist=8, pq_m=16, nprobe=8))
    store.upsert(docs[:1000], vectors[:1000])  # the first batch trains the coarse quantiser and codebooks
    store.commit()
    store.upsert(docs[1000:], vectors[1000:])
    store.finalize()
    reopened = open_store(f"faiss:{spec}")
    assert reopened.count() == 1200 and reopened.require_manifest().index["type"] == "ivfpq"
    queries = vectors[:50] + 0.01
    exact = np.argsort(-(queries @ vectors.T), axis=1)[:, :10]
    hits = reopened.search(queries, 10)
    recall = np.mean(
        [len({h.id for h in row} & {f"d{i}" for i in ex}) / 10 for row, ex in zip(hits, exact, strict=True)]
    )
    assert recall > 0.5  # lossy 16-byte codes (random: 0.01); the point is a working ANN index
    assert {h.metadata["g"] for h in reopened.search(queries[:5], 5, {"g": 1})[0]} == {1}
    reopened.prepare(DIM, "fp", "m")
    reopened.upsert([Document("d0", "改写")], vectors[:1])  # IVF removes the old vector: no tombstone
    assert reopened.delete(["d1"]) == 1
    reopened.finalize()
    assert reopened.count() == 1199 and reopened.require_manifest().index.get("tombstones") == 0


def test_ivfpq_rejects_a_first_batch_too_small_to_train(tmp_path: Path) -> None:
    docs, vectors = _data(100)
    store = FaissStore(tmp_path / "pq")
    store.prepare(DIM, "fp", "m", FaissIndexConfig(index_type=IndexType.IVFPQ, nlist=8, pq_m=8))
    with pytest.raises(InputError, match="needs at least 256 vectors in the first batch"):
        store.upsert(docs, vectors)
    with pytest.raises(InputError, match="must divide the dimension"):
        FaissStore(tmp_path / "other").prepare(DIM, "fp", "m", FaissIndexConfig(index_type=IndexType.IVFPQ, pq_m=7))


def test_independent_jobs_join_one_qdrant_collection() -> None:
    """Two jobs start against one (here: shared in-process) Qdrant: both see no collection, one creates it,
    the other joins it; each writes its half and the union is the corpus."""
    client = QdrantClient(location=":memory:")
    first, second = QdrantStore(":memory:", client=client), QdrantStore(":memory:", client=client)
    # the older names (quantization int8, shard_number) as a user gives them, read once into the config
    options = QdrantCollectionConfig.from_manifest(
        {"m": 16, "ef_construct": 64, "on_disk": True, "quantization": "int8", "shard_number": 2}
    )
    first.prepare(DIM, "fp", "m", options)
    second.prepare(DIM, "fp", "m")  # lost the creation race
    # Recorded under the canonical names, with the defaults filled in; local mode has one shard, so none recorded.
    assert second.manifest is not None and second.manifest.index == {
        "type": "hnsw",
        "m": 16,
        "ef_construct": 64,
        "on_disk": True,
        "quantize": "sq8",
        "always_ram": True,
        "oversample": 2.0,
    }
    docs, vectors = _data(40)
    first.upsert(docs[:20], vectors[:20])
    second.upsert(docs[20:], vectors[20:])
    first.commit()
    second.commit()
    assert first.count() == second.count() == 40
    assert [h.id for h in first.search(vectors[25], 1)[0]] == ["d25"]
    other = QdrantStore(":memory:", client=client, collection="care")
    with pytest.raises(StoreError, match="built with another model"):
        other.prepare(DIM, "another-model", "m")


def test_unknown_qdrant_options_are_refused() -> None:
    with pytest.raises(InputError, match="unknown Qdrant collection options"):
        QdrantStore(":memory:").prepare(DIM, "fp", "m", QdrantCollectionConfig.from_manifest({"nlist": 4}))
    with pytest.raises(InputError, match="quantization"):
        QdrantStore(":memory:").prepare(DIM, "fp", "m", QdrantCollectionConfig.from_manifest({"quantization": "int4"}))


def test_large_index_benchmark_prints_its_table(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.large_index",
        "--n",
        "3000",
        "--dim",
        "32",
        "--queries",
        "40",
        "--latency-queries",
        "10",
        "--qdrant-queries",
        "10",
        "--clusters",
        "50",
        "--nlist",
        "16",
        "--pq-m",
        "8",
        "--backends",
        "flat,hnsw,ivfpq,qdrant",
        "--threads",
        "1",
        "--workdir",
        str(tmp_path),
        "--json",
        str(tmp_path / "r.json"),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    assert lines[0].startswith("| engine |") and [line.split("|")[1].strip() for line in lines[1:]] == [
        "flat",
        "hnsw",
        "ivfpq",
        "qdrant",
    ]
    recalls = {line.split("|")[1].strip(): float(line.split("|")[-2]) for line in lines[1:]}
    assert recalls["flat"] == recalls["qdrant"] == 1.0 and recalls["hnsw"] > 0.9
