"""Store profiles: ``auto`` picks by size, an option given wins over the profile, and the large profile's FAISS
build (IVF + PQ trained on a held sample, rows added chunk by chunk) searches as a one-shot build of the same
settings does, in memory bounded by the sample and one chunk."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np

from care_retriever.documents import Document
from care_retriever.stores import open_store
from care_retriever.stores.config import FaissIndexConfig, IndexType, QdrantCollectionConfig, QdrantQuantize, Quantize
from care_retriever.stores.profiles import (
    LARGE_EDGE_SEGMENT_KB,
    LARGE_FROM_BYTES,
    StoreProfile,
    chosen_profile,
    profile_config,
)

DIM = 32
SETTINGS = FaissIndexConfig(index_type="ivf", nlist=16, nprobe=4, quantize="pq", pq_m=4, train_size=600)


def _rows(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((24, DIM)).astype(np.float32)
    x = centres[rng.integers(0, 24, n)] + 0.3 * rng.standard_normal((n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _build(folder: Path, vectors: np.ndarray, chunk: int) -> None:
    store = open_store(f"faiss:{folder}")
    store.prepare(DIM, "profile-space", "profile-model", SETTINGS)
    for start in range(0, len(vectors), chunk):
        part = vectors[start : start + chunk]
        store.upsert([Document(id=f"d{start + i}", text=f"病例 {start + i}") for i in range(len(part))], part)
        store.commit()
    store.finalize()
    store.close()


def test_auto_is_large_past_the_threshold_and_small_below() -> None:
    past = LARGE_FROM_BYTES // (768 * 4) + 1
    assert chosen_profile("auto", past, 768) is StoreProfile.LARGE
    assert chosen_profile("auto", past - 1, 768) is StoreProfile.SMALL
    assert chosen_profile("large", 10, 768) is StoreProfile.LARGE
    assert chosen_profile("small", 10**8, 768) is StoreProfile.SMALL
    assert profile_config("auto", FaissIndexConfig(), n=1000, dim=768) == FaissIndexConfig()


def test_large_faiss_settings_grow_with_n_and_options_given_win() -> None:
    small, big = (profile_config("large", FaissIndexConfig(), n=n, dim=768) for n in (10**6, 10**7))
    assert isinstance(big, FaissIndexConfig) and isinstance(small, FaissIndexConfig)
    assert (big.index_type, big.quantize, big.pq_m, big.oversample) == (IndexType.IVF, Quantize.PQ, 192, 40.0)
    assert (small.nlist, big.nlist) == (512, 2048)
    assert big.train_size is not None and big.train_size >= 39 * big.nlist  # FAISS's k-means wants 39 a list
    given = FaissIndexConfig(nprobe=64, quantize="sq8")
    mine = profile_config("large", given, n=10**7, dim=768)
    assert isinstance(mine, FaissIndexConfig)
    assert (mine.nprobe, mine.quantize, mine.index_type) == (64, Quantize.SQ8, IndexType.IVF)
    odd = profile_config("large", FaissIndexConfig(), n=10**7, dim=102)  # 4 does not divide 102: SQ8 codes
    assert isinstance(odd, FaissIndexConfig) and odd.quantize is Quantize.SQ8


def test_large_qdrant_keeps_vectors_on_disk_and_int8_codes_in_ram() -> None:
    large = profile_config("large", QdrantCollectionConfig(), n=10**7, dim=768)
    assert large == QdrantCollectionConfig(
        on_disk=True, quantize=QdrantQuantize.SQ8, always_ram=True, max_segment_size=LARGE_EDGE_SEGMENT_KB
    )
    kept = profile_config("large", QdrantCollectionConfig(on_disk=False), n=10**7, dim=768)
    assert isinstance(kept, QdrantCollectionConfig) and kept.on_disk is False


def test_chunked_build_searches_as_the_one_shot_build(tmp_path: Path) -> None:
    vectors, queries = _rows(2000), _rows(20, seed=1)
    _build(tmp_path / "one", vectors, chunk=len(vectors))
    _build(tmp_path / "chunks", vectors, chunk=128)  # the sample fills over five chunks, checkpoints between
    one, chunked = open_store(f"faiss:{tmp_path / 'one'}"), open_store(f"faiss:{tmp_path / 'chunks'}")
    a, b = one.search(queries, 10, payload=False), chunked.search(queries, 10, payload=False)
    assert [[h.id for h in q] for q in a] == [[h.id for h in q] for q in b]
    assert np.allclose([[h.score for h in q] for q in a], [[h.score for h in q] for q in b], atol=1e-6)
    assert chunked.count() == len(vectors) and chunked.verify() == len(vectors)
    one.close()
    chunked.close()


def test_rows_held_for_the_sample_and_deleted_never_reach_the_index(tmp_path: Path) -> None:
    store = open_store(f"faiss:{tmp_path / 's'}")
    store.prepare(DIM, "profile-space", "profile-model", SETTINGS)
    vectors = _rows(700)
    store.upsert([Document(id=f"d{i}", text="x") for i in range(300)], vectors[:300])
    store.delete(["d0", "d1"])  # still held: the sample is not full
    store.upsert([Document(id=f"d{i}", text="x") for i in range(300, 700)], vectors[300:])
    store.finalize()
    assert store.count() == 698 and store.verify() == 698
    assert store.vectors(["d0", "d2"])[0] is None
    store.close()


def test_a_chunked_build_holds_one_chunk_and_the_sample_not_every_vector(tmp_path: Path) -> None:
    chunk = 100
    vectors = _rows(20_000)  # 2.4 MiB of float32 rows; the sample is 600 rows (75 KiB), a chunk 100
    store = open_store(f"faiss:{tmp_path / 's'}")
    store.prepare(DIM, "profile-space", "profile-model", SETTINGS)
    tracemalloc.start()
    for start in range(0, len(vectors), chunk):
        part = vectors[start : start + chunk].copy()
        store.upsert([Document(id=f"d{start + i}", text="") for i in range(chunk)], part)
        del part
    _, peak = tracemalloc.get_traced_memory()  # the writes: the publish after them reads files a block at a time
    tracemalloc.stop()
    store.finalize()
    assert store.count() == len(vectors)
    assert peak < vectors.nbytes / 8, f"the writes' Python-side peak was {peak} bytes"
    store.close()


def test_auto_turns_large_only_for_a_corpus_the_large_profile_can_train(tmp_path: Path) -> None:
    """``auto`` never picks the large profile for a corpus too small to train its IVF lists and codes: at each
    width, the fewest vectors that turn it large are at least what the large index needs to train."""
    store = open_store(f"faiss:{tmp_path / 'new'}")
    for dim in (8, 100, 384, 768, 1024, 4096):
        fewest = LARGE_FROM_BYTES // (dim * 4) + 1
        assert chosen_profile("auto", fewest - 1, dim) is StoreProfile.SMALL
        large = profile_config("auto", FaissIndexConfig(), n=fewest, dim=dim)
        assert isinstance(large, FaissIndexConfig) and large.trains_on_first_vectors
        assert 0 < store.vectors_to_train(dim, large) <= fewest, dim
    assert chosen_profile("auto", 65_535, 768) is StoreProfile.SMALL
    store.close()
