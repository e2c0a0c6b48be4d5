"""FAISS store with compressed codes (quantize sq8 / binary / pq): every search rescored from the full vectors.

The answers are compared with an independent numpy ranking of the same vectors: after rescoring, ids and
scores equal exact search's top-k. Small writes, filters, hybrid search and damaged vector files too.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from care_retriever.cli.main import main
from care_retriever.errors import InputError, StoreError
from care_retriever.indexing.corpus import Document
from care_retriever.stores.config import FaissIndexConfig, IndexType, Quantize
from care_retriever.stores.faiss import DELTA, INDEX, MANIFEST, VECTORS, FaissStore

DIM, N = 64, 600
CHARS = "高血压患者应低盐饮食规律服用降压药定期监测普通感冒多由病毒引起休息喝水糖尿病控制运动拉肚子补充电解质失眠"
# (index options, label): flat codes for each kind, and the graph / inverted-list variants over codes
SETTINGS = [
    (FaissIndexConfig(quantize=Quantize.SQ8), "sq8"),
    (FaissIndexConfig(quantize=Quantize.BINARY), "binary"),
    (FaissIndexConfig(quantize=Quantize.PQ, pq_m=16), "pq"),
    (FaissIndexConfig(quantize=Quantize.SQ8, index_type=IndexType.HNSW, m=16), "sq8-hnsw"),
    (FaissIndexConfig(quantize=Quantize.SQ8, index_type=IndexType.IVF, nlist=8, nprobe=8), "sq8-ivf"),
    (FaissIndexConfig(quantize=Quantize.PQ, index_type=IndexType.IVF, nlist=8, nprobe=8, pq_m=16), "pq-ivf"),
]


def clustered(n: int, seed: int = 0) -> np.ndarray:
    """Unit vectors around 30 centres (real embeddings are clustered; near neighbours exist)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((30, DIM)).astype(np.float32)
    x = centres[rng.integers(0, 30, n)] + 0.5 * rng.standard_normal((n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


VECS = clustered(N)
_noise = np.random.default_rng(1).standard_normal((20, DIM)).astype(np.float32)
QUERIES = VECS[::30] + 0.3 * _noise / np.sqrt(DIM)  # queries near stored documents, as real queries are
QUERIES /= np.linalg.norm(QUERIES, axis=1, keepdims=True)
rng_text = random.Random(0)
DOCS = [
    Document(
        id=f"d{i}",
        text="".join(rng_text.choice(CHARS) for _ in range(12)),
        metadata={"group": i % 3},
    )
    for i in range(N)
]


def build(folder: Path, options: FaissIndexConfig, docs=DOCS, vectors=VECS, *, sparse: bool = False) -> FaissStore:
    store = FaissStore(folder)
    store.prepare(DIM, "fp", "model", options)
    store.upsert(docs, vectors)
    if sparse:
        store.enable_sparse()
    store.finalize()
    return store


def exact(vectors: np.ndarray, ids: list[str], query: np.ndarray, k: int) -> list[tuple[str, float]]:
    scores = vectors @ query
    order = np.argsort(-scores, kind="stable")[:k]
    return [(ids[i], float(scores[i])) for i in order]


def assert_exact(hits, want: list[tuple[str, float]]) -> None:
    assert [h.id for h in hits] == [i for i, _ in want]
    np.testing.assert_allclose([h.score for h in hits], [s for _, s in want], atol=1e-5)


@pytest.mark.parametrize(("options", "label"), SETTINGS, ids=[s[1] for s in SETTINGS])
def test_rescored_search_equals_exact_top_k(tmp_path: Path, options: FaissIndexConfig, label: str) -> None:
    build(tmp_path / "s", options).close()
    ids = [d.id for d in DOCS]
    with FaissStore(tmp_path / "s") as store:  # reopened: codes from index.faiss, vectors mapped from disk
        manifest = store.require_manifest()
        assert manifest.index["quantize"] == options.quantization.value and manifest.index["oversample"] >= 1
        assert manifest.format_version == 3 and VECTORS in manifest.block_checksums
        assert (tmp_path / "s" / VECTORS).stat().st_size == N * DIM * 4
        for hits, query in zip(store.search(QUERIES, 10), QUERIES, strict=True):
            assert_exact(hits, exact(VECS, ids, query, 10))
        # exact vectors back (not decoded codes), and the full check passes
        np.testing.assert_array_equal(np.stack(store.vectors(["d5", "d7"])), VECS[[5, 7]])
        assert store.vectors(["missing"]) == [None]
        assert store.verify() == N
        # the index searched holds codes (less than float32 vectors); the vectors are on disk
        footprint = store.footprint()
        assert footprint["quantize"] == options.quantization.value
        assert footprint["ram_bytes_per_doc"] < DIM * 4 < footprint["disk_bytes_per_doc"]


@pytest.mark.parametrize("quantize", ["sq8", "binary", "pq"])
def test_filters_and_small_writes_and_deletes(tmp_path: Path, quantize: str) -> None:
    options = FaissIndexConfig(quantize=Quantize(quantize), pq_m=16)
    build(tmp_path / "s", options).close()
    new = clustered(5, seed=7)
    with FaissStore(tmp_path / "s") as store, store.transaction() as tx:  # small write: in place, delta
        tx.upsert([Document(id=f"n{i}", text="新文档", metadata={"group": 1}) for i in range(5)], new)
        assert tx.delete(["d0", "d1", "d2", "missing"]) == 3
        tx.upsert([Document(id="d3", text="改过的", metadata={"group": 0})], new[:1])  # replaced: new vector
    assert (tmp_path / "s" / DELTA).stat().st_size > 0
    vectors = np.concatenate([VECS[4:], new, new[:1]])
    ids = [d.id for d in DOCS[4:]] + [f"n{i}" for i in range(5)] + ["d3"]
    groups = [d.metadata["group"] for d in DOCS[4:]] + [1] * 5 + [0]
    with FaissStore(tmp_path / "s") as store:  # a fresh reader replays the delta
        assert store.count() == N - 3 + 5
        for hits, query in zip(store.search(QUERIES, 10), QUERIES, strict=True):
            assert_exact(hits, exact(vectors, ids, query, 10))
        keep = np.asarray([g == 1 for g in groups])
        sub_ids = [i for i, k in zip(ids, keep, strict=True) if k]
        for hits, query in zip(store.search(QUERIES, 7, {"group": 1}), QUERIES, strict=True):
            assert_exact(hits, exact(vectors[keep], sub_ids, query, 7))
        np.testing.assert_array_equal(store.vectors(["n2", "d3"])[0], new[2])
        np.testing.assert_array_equal(store.vectors(["d3"])[0], new[0])
        assert store.verify() == N + 2
    assert main(["verify", "--store", f"faiss:{tmp_path / 's'}"]) == 0


@pytest.mark.parametrize("quantize", ["sq8", "binary"])
def test_hybrid_search_equals_the_unquantized_store(tmp_path: Path, quantize: str) -> None:
    exact_store = build(tmp_path / "exact", FaissIndexConfig(), sparse=True)
    store = build(tmp_path / "codes", FaissIndexConfig(quantize=Quantize(quantize)), sparse=True)
    texts = ["高血压 降压药", "感冒 喝水", "拉肚子", "失眠 运动"]
    for got, want in zip(
        store.search_hybrid(QUERIES[:4], texts, 10), exact_store.search_hybrid(QUERIES[:4], texts, 10), strict=True
    ):
        assert [h.id for h in got] == [h.id for h in want] and got
        np.testing.assert_allclose([h.score for h in got], [h.score for h in want], atol=1e-6)
    got = store.search_hybrid(QUERIES[:2], texts[:2], 5, {"group": 2})
    assert all(h.metadata["group"] == 2 for row in got for h in row)
    exact_store.close()
    store.close()


@pytest.mark.parametrize("damage", ["missing", "truncated", "truncated-after-small-write"])
def test_missing_or_truncated_vectors_fail_open_and_verify(tmp_path: Path, damage: str, capsys) -> None:
    folder = tmp_path / "s"
    build(folder, FaissIndexConfig(quantize=Quantize.BINARY)).close()
    if damage == "truncated-after-small-write":  # the manifest's sizes are gone: the rows must still be there
        with FaissStore(folder) as store, store.transaction() as tx:
            tx.upsert([Document(id="x", text="新")], clustered(1, seed=3))
    path = folder / VECTORS
    if damage == "missing":
        path.unlink()
    else:
        with open(path, "rb+") as fh:
            fh.truncate(path.stat().st_size - 4 * DIM)
    with pytest.raises(StoreError, match=r"vectors\.f32: (missing|truncated)"):
        FaissStore(folder)
    assert main(["verify", "--store", f"faiss:{folder}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "vectors.f32" in err


def test_flipped_bytes_in_the_vector_file_fail_verify(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "s"
    build(folder, FaissIndexConfig(quantize=Quantize.SQ8)).close()
    data = bytearray((folder / VECTORS).read_bytes())
    data[4 * DIM * 10 + 3] ^= 0x40  # same size: open passes, verify reads every byte
    (folder / VECTORS).write_bytes(bytes(data))
    FaissStore(folder).close()
    assert main(["verify", "--store", f"faiss:{folder}"]) == 2
    assert "vectors.f32: checksum mismatch" in capsys.readouterr().err


def test_quantization_is_fixed_and_bad_options_are_one_line(tmp_path: Path) -> None:
    store = build(tmp_path / "s", FaissIndexConfig(quantize=Quantize.SQ8))
    with pytest.raises(InputError, match=r"built with quantize=sq8.*cannot change") as err:
        store.prepare(DIM, "fp", "model", FaissIndexConfig(quantize=Quantize.BINARY))
    assert "\n" not in str(err.value)
    with pytest.raises(
        InputError, match=r"Unknown FAISS quantize 'int4'\. Available: \['none', 'sq8', 'binary', 'pq'\]"
    ):
        FaissIndexConfig(quantize="int4")
    with pytest.raises(InputError, match="oversample must be a number >= 1"):
        FaissIndexConfig(quantize=Quantize.SQ8, oversample=0.5)
    with pytest.raises(InputError, match="binary works with index type flat only"):
        FaissIndexConfig(quantize=Quantize.BINARY, index_type=IndexType.HNSW)
    # The same quantization again, with another oversample: a search-time setting, recorded
    store.prepare(DIM, "fp", "model", FaissIndexConfig(oversample=7))
    store.finalize()
    assert FaissStore(tmp_path / "s").require_manifest().index["oversample"] == 7
    store.prepare(
        DIM, "fp", "model", FaissIndexConfig(quantize=Quantize.SQ8)
    )  # the same quantization, no oversample: kept
    store.finalize()
    assert FaissStore(tmp_path / "s").require_manifest().index["oversample"] == 7
    store.close()


def test_search_time_oversample_overrides_the_manifest(tmp_path: Path) -> None:
    build(tmp_path / "s", FaissIndexConfig(quantize=Quantize.BINARY, oversample=1)).close()
    ids = [d.id for d in DOCS]
    want = [exact(VECS, ids, q, 10) for q in QUERIES]
    low = FaissStore(tmp_path / "s")
    high = FaissStore(tmp_path / "s", oversample=30)
    low_hits, high_hits = low.search(QUERIES, 10), high.search(QUERIES, 10)
    for hits, w in zip(high_hits, want, strict=True):
        assert_exact(hits, w)
    # one candidate per result: the 1-bit codes alone miss some of the exact top 10 (the rescoring finds them)
    assert sum(len({h.id for h in hits} & {i for i, _ in w}) for hits, w in zip(low_hits, want, strict=True)) < 200
    low.close()
    high.close()


def test_binary_at_its_default_oversample_finds_the_exact_top_10_of_embeddings_sharing_a_component(
    tmp_path: Path,
) -> None:
    """Real embeddings share a large common component: every document has nearly the same sign in each
    dimension, so sign bits with a sign-bit query (Hamming distance) barely tell documents apart. The 1-bit
    codes must still bring the exact top 10 into the candidates at the store's default oversample."""
    rng = np.random.default_rng(5)
    n = 2000
    common = rng.standard_normal(DIM).astype(np.float32)
    centres = rng.standard_normal((40, DIM)).astype(np.float32) / np.sqrt(DIM)
    x = 10 * common / np.linalg.norm(common) + centres[rng.integers(0, 40, n + 20)]
    x += 0.5 * rng.standard_normal((n + 20, DIM)).astype(np.float32) / np.sqrt(DIM)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    vectors, queries = x[:n], x[n:]
    docs = [Document(id=f"a{i}", text="文档") for i in range(n)]
    build(tmp_path / "s", FaissIndexConfig(quantize=Quantize.BINARY), docs=docs, vectors=vectors).close()
    ids = [d.id for d in docs]
    with FaissStore(tmp_path / "s") as store:
        assert store.require_manifest().index["oversample"] * 10 < n  # the codes choose: not every row rescored
        for hits, query in zip(store.search(queries, 10), queries, strict=True):
            assert_exact(hits, exact(vectors, ids, query, 10))


def test_cli_unknown_quantize_is_one_line_exit_2(tmp_path: Path, capsys) -> None:
    code = main(
        ["index", "--model", str(tmp_path / "m"), "--corpus", str(tmp_path / "c.jsonl"), "--store",
         f"faiss:{tmp_path / 's'}", "--quantize", "int3"]
    )  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'none', 'sq8', 'binary', 'pq'" in err and "int3" in err
    assert not (tmp_path / "s").exists()


def test_cli_index_and_info_with_quantize(tiny_model_dir: Path, small_corpus_path: Path, tmp_path: Path, capsys):
    folder = tmp_path / "s"
    # the tiny corpus is far below what sq8 / pq train on: RaBitQ trains on any first batch (its mean)
    args = ["index", "--model", str(tiny_model_dir), "--corpus", str(small_corpus_path), "--store", f"faiss:{folder}"]
    assert main([*args, "--quantize", "binary", "--oversample", "3", "--no-progress"]) == 0
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["index"]["quantize"] == "binary" and manifest["index"]["oversample"] == 3.0
    capsys.readouterr()
    assert main(["info", "--store", f"faiss:{folder}"]) == 0
    out = capsys.readouterr().out
    assert "quantization: binary, oversample 3" in out and "in RAM" in out and "on disk" in out
    # re-running without --quantize keeps the store's; another one is refused in one line
    assert main([*args, "--no-progress"]) == 0
    assert main([*args, "--quantize", "sq8", "--no-progress"]) == 2
    assert "cannot change" in capsys.readouterr().err
    assert (folder / INDEX).exists()
