"""Qdrant compressed vectors: sq8 / binary collections, HNSW, rescoring, on-disk originals, shards and replicas.

``qdrant:PATH`` runs Qdrant Edge: what it built is read back from the engine (its shard info and each segment's
own config: HNSW graph, quantized codes, payload indexes), not from the manifest we write. A store pointed at a
server URL builds the same settings through qdrant-client; no Qdrant server runs here, so those cases run against
qdrant-client's in-memory mode, a stand-in that accepts the settings and searches exactly.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from qdrant_client import QdrantClient, models

from care_retriever.documents import Document
from care_retriever.errors import InputError, StoreError
from care_retriever.sparse import FusionConfig
from care_retriever.stores.config import QdrantCollectionConfig
from care_retriever.stores.qdrant import MANIFEST_KEY, QdrantStore

# The server-located store runs on the local engine, which says once that it ignores these (what is tested here is
# that the requests carrying them are valid and give the exact results).
pytestmark = pytest.mark.filterwarnings(
    "ignore:Payload indexes have no effect:UserWarning", "ignore:Local mode performs exact:UserWarning"
)

DIM = 24
SERVER = "http://localhost:6333"  # a server-located store over an in-process local engine (see the module doc)


def _data(n: int, seed: int = 0) -> tuple[list[Document], np.ndarray]:
    rng = np.random.default_rng(seed)
    vectors = rng.normal(size=(n, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    words = ["fever", "cough", "headache", "rash", "nausea", "insomnia"]
    docs = [Document(id=f"d{i}", text=f"{words[i % 6]} case {i}", metadata={"group": i % 3}) for i in range(n)]
    return docs, vectors


def _engine_settings(path: Path) -> dict:
    """What Qdrant Edge holds and built for the closed store's folder, from a store opened afresh."""
    store = QdrantStore(str(path))
    try:
        return store.collection_settings()
    finally:
        store.close()


@pytest.mark.parametrize("quantize", ["sq8", "binary"])
def test_the_engine_builds_hnsw_and_quantized_codes_at_finalize(tmp_path: Path, quantize: str) -> None:
    """Until the store is finalized every segment is plain (searched by brute force, as Edge does before
    ``optimize``); finalize has the engine build the graph and the codes, which its own segment configs show."""
    path = tmp_path / "q"
    store = QdrantStore(str(path))
    # random unit vectors are binary codes' worst case: more candidates rescored (measured: recall@10 0.56 at 4x,
    # 0.98 at 20x for 256-dim random vectors; rescored scores are the exact ones either way)
    oversample = 20 if quantize == "binary" else 2
    options = {"quantize": quantize, "m": 8, "ef_construct": 40, "indexing_threshold": 1, "oversample": oversample}
    store.prepare(DIM, "fp", "m", QdrantCollectionConfig.from_manifest(options))
    docs, vectors = _data(300)
    store.upsert(docs, vectors)
    store.commit()
    before = store.collection_settings()
    assert {s["index"] for s in before["segment_indexes"]} == {"plain"}  # (binary codes may come at once)
    store.finalize()
    store.close()
    built = _engine_settings(path)
    assert built["engine"] == "qdrant-edge" and built["points"] == 300
    graphs = [s for s in built["segment_indexes"] if s["index"] == "hnsw"]
    assert graphs and all(s["quantization"] == quantize for s in graphs)
    assert built["indexed_vectors"] >= 300
    assert (built["quantize"], built["m"], built["ef_construct"]) == (quantize, 8, 40)
    # payload indexes: doc_id, and each metadata field filters match; numbers as floats, so a range finds 2019.5 too
    assert built["payload_indexes"] == {"doc_id": "keyword", "metadata.group": "float"}
    reopened = QdrantStore(str(path))
    queries = _data(10, seed=1)[1]
    found = [[h.id for h in row] for row in reopened.search(queries, 10, payload=False)]
    recall = np.mean([len(set(f) & set(e)) / 10 for f, e in zip(found, _exact_top(vectors, queries, 10), strict=True)])
    assert recall >= 0.9, recall  # rescored from the originals
    assert reopened.verify() == 300
    reopened.close()


@pytest.mark.parametrize("quantize", ["sq8", "binary"])
def test_quantized_collection_holds_its_settings(tmp_path: Path, quantize: str) -> None:
    path = tmp_path / "q"
    store = QdrantStore(str(path))
    store.prepare(
        DIM, "fp", "m", QdrantCollectionConfig(quantize=quantize, on_disk=True, always_ram=False, oversample=5)
    )
    docs, vectors = _data(30)
    store.upsert(docs, vectors)
    store.commit()
    store.close()
    held = _engine_settings(path)
    assert (held["quantize"], held["on_disk"], held["always_ram"]) == (quantize, True, False)
    reopened = QdrantStore(str(path))
    assert reopened.manifest is not None and reopened.manifest.index == {
        "type": "hnsw",
        "quantize": quantize,
        "on_disk": True,
        "always_ram": False,
        "oversample": 5.0,
    }
    assert reopened.collection_settings()["quantize"] == quantize
    assert reopened.verify() == 30
    reopened.close()


def test_int8_is_sq8_and_defaults_are_recorded(tmp_path: Path) -> None:
    path = tmp_path / "q"
    store = QdrantStore(str(path))
    store.prepare(DIM, "fp", "m", QdrantCollectionConfig.from_manifest({"quantization": "int8"}))
    store.commit()
    assert store.manifest is not None and store.manifest.index == {
        "type": "hnsw",
        "quantize": "sq8",
        "always_ram": True,
        "oversample": 2.0,
    }
    store.close()
    held = _engine_settings(path)
    assert (held["quantize"], held["always_ram"]) == ("sq8", True)
    plain = QdrantStore(str(tmp_path / "plain"))
    plain.prepare(DIM, "fp", "m")
    plain.close()
    assert _engine_settings(tmp_path / "plain")["quantize"] == "none"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"quantize": "pq"}, "unknown Qdrant quantization 'pq'; valid: none, sq8, binary"),
        ({"quantization": "int4"}, "unknown Qdrant quantization 'int4'; valid: none, sq8, binary"),
        ({"quantize": "sq8", "oversample": 0.5}, "oversample must be a number >= 1"),
        ({"shards": 0}, "shards must be an integer >= 1"),
        ({"replicas": "2"}, "replicas must be an integer >= 1"),
        ({"on_disk": "yes"}, "on_disk must be true or false"),
        ({"oversample": 3}, "apply to a quantized collection"),
        ({"quantize": "sq8", "quantization": None, "shards": 2, "shard_number": 3}, "disagree"),
        ({"nlist": 4}, "unknown Qdrant collection options"),
    ],
)
def test_bad_settings_are_one_line_input_errors(options: dict, message: str) -> None:
    store = QdrantStore(":memory:")
    with pytest.raises(InputError, match=message) as caught:
        store.prepare(DIM, "fp", "m", QdrantCollectionConfig.from_manifest(options))  # a user's dict, read once
    assert "\n" not in str(caught.value)
    assert store.manifest is None and not store.folder.exists()  # nothing created


def test_edge_says_what_it_drops_and_records_only_what_it_holds(tmp_path: Path, caplog) -> None:
    path = tmp_path / "q"
    store = QdrantStore(str(path))
    with caplog.at_level(logging.WARNING, logger="care_retriever"):
        store.prepare(DIM, "fp", "m", QdrantCollectionConfig(quantize="binary", shards=3, replicas=2))
    lines = [r.getMessage() for r in caplog.records if r.name == "care_retriever"]
    assert len(lines) == 1 and "\n" not in lines[0]
    assert "Qdrant Edge has one shard and no replicas (ignoring shards, replicas)" in lines[0]
    assert store.manifest is not None and "shards" not in store.manifest.index
    settings = store.collection_settings()
    assert settings["shards"] == 1 and settings["replicas"] == 1 and settings["quantize"] == "binary"
    store.close()
    caplog.clear()
    again = QdrantStore(str(path))
    with caplog.at_level(logging.WARNING, logger="care_retriever"):  # an existing collection: checked, not re-told
        again.prepare(DIM, "fp", "m", QdrantCollectionConfig(quantize="binary", shards=3))
    assert not [r for r in caplog.records if r.name == "care_retriever"]
    again.close()


def test_another_quantization_on_an_existing_collection_is_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "q")
    store = QdrantStore(path)
    store.prepare(DIM, "fp", "m", QdrantCollectionConfig(quantize="sq8"))
    docs, vectors = _data(10)
    store.upsert(docs, vectors)
    store.commit()
    store.close()
    store = QdrantStore(path)
    with pytest.raises(StoreError, match=r"created with quantize 'sq8' \(asked 'binary'\)") as caught:
        store.prepare(DIM, "fp", "m", QdrantCollectionConfig(quantize="binary"))
    assert "\n" not in str(caught.value)
    with pytest.raises(StoreError, match="on_disk None"):
        store.prepare(DIM, "fp", "m", QdrantCollectionConfig(on_disk=True))
    # oversample is a search-time setting: a new value replaces the recorded one
    store.prepare(DIM, "fp", "m", QdrantCollectionConfig(quantize="sq8", oversample=6))
    store.commit()
    store.close()
    reopened = QdrantStore(path)
    assert reopened.manifest is not None and reopened.manifest.index["oversample"] == 6.0
    assert reopened.count() == 10
    plain = QdrantStore(":memory:")
    plain.prepare(DIM, "fp", "m")
    with pytest.raises(InputError, match="apply to a quantized collection"):
        plain.prepare(DIM, "fp", "m", QdrantCollectionConfig(oversample=4))


def _exact_top(vectors: np.ndarray, queries: np.ndarray, k: int) -> list[list[str]]:
    scores = queries @ vectors.T
    return [[f"d{i}" for i in np.argsort(-row, kind="stable")[:k]] for row in scores]


@pytest.mark.parametrize("quantize", ["sq8", "binary"])
@pytest.mark.parametrize("where", ["edge", "server-path"])
def test_rescored_search_returns_the_exact_top_k(quantize: str, where: str) -> None:
    store = (
        QdrantStore(":memory:") if where == "edge" else QdrantStore(SERVER, client=QdrantClient(location=":memory:"))
    )
    # Edge searches the codes: 24-dim random vectors rank poorly in one bit a dimension, so the binary case rescores
    # every point (the other engine, a stand-in, searches exactly whatever it is asked)
    oversample = 20 if (where, quantize) == ("edge", "binary") else 4
    store.prepare(DIM, "fp", "m", QdrantCollectionConfig(quantize=quantize, oversample=oversample))
    params = store.search_params()
    if where == "edge":  # the engine's own parameters: rescore oversample x top_k candidates from the originals
        assert params.quantization.rescore and params.quantization.oversampling == oversample
    else:
        assert params.quantization == models.QuantizationSearchParams(rescore=True, oversampling=4.0)
    docs, vectors = _data(200)
    store.upsert(docs, vectors)
    store.commit()
    queries = _data(12, seed=1)[1]
    hits = store.search(queries, 10, payload=False)
    assert [[h.id for h in row] for row in hits] == _exact_top(vectors, queries, 10)
    scores = np.array([[h.score for h in row] for row in hits])
    exact = np.sort(queries @ vectors.T, axis=1)[:, ::-1][:, :10]
    np.testing.assert_allclose(scores, exact, atol=1e-5)  # full-precision scores, not code distances


@pytest.mark.parametrize("quantize", ["sq8", "binary"])
@pytest.mark.parametrize("where", ["edge", "server-path"])
def test_small_writes_deletes_verify_and_hybrid_on_a_quantized_collection(quantize: str, where: str) -> None:
    store = (
        QdrantStore(":memory:") if where == "edge" else QdrantStore(SERVER, client=QdrantClient(location=":memory:"))
    )
    docs, vectors = _data(40)
    with store.transaction(DIM, "fp", "m", QdrantCollectionConfig(quantize=quantize, on_disk=True)) as tx:
        tx.upsert(docs[:30], vectors[:30])
    with store.transaction(
        index=QdrantCollectionConfig(quantize=quantize)
    ) as tx:  # a small write with the same settings
        tx.upsert(docs[30:], vectors[30:])
        tx.delete(["d0", "d1", "missing"])
    with store.transaction() as tx:  # an update in place: d5 gets d2's vector
        tx.upsert([Document(id="d5", text="updated fever case")], vectors[2:3])
    assert store.count() == 38 and store.verify() == 38
    assert sorted(h.id for h in store.search(vectors[2], 2)[0]) == ["d2", "d5"]  # one vector: tied
    assert store.search(vectors[0], 1)[0][0].id != "d0"
    store.enable_sparse()
    store.commit()
    assert store.verify() == 38
    fusion = FusionConfig("rrf", k=60)
    hybrid = store.search_hybrid(vectors[7:8], ["nausea case 7"], 5, fusion=fusion)[0]
    assert hybrid[0].id == "d7"  # first in both the dense and the BM25 ranking
    assert store.search_hybrid(None, ["updated"], 3)[0][0].id == "d5"
    filtered = store.search(vectors[9], 5, {"group": 0})[0]
    assert filtered and all(h.metadata["group"] == 0 for h in filtered)


def test_verify_compares_the_collection_with_its_manifest() -> None:
    client = QdrantClient(location=":memory:")
    store = QdrantStore(":memory:", client=client)
    store.prepare(DIM, "fp", "m", QdrantCollectionConfig(quantize="sq8"))
    docs, vectors = _data(5)
    store.upsert(docs, vectors)
    store.commit()
    assert store.verify() == 5
    raw = client.get_collection("care").config.metadata[MANIFEST_KEY]
    raw["index"]["quantize"] = "binary"  # a manifest that no longer describes the collection
    client.update_collection("care", metadata={MANIFEST_KEY: raw})
    with pytest.raises(StoreError, match=r"holds quantize='sq8'; its manifest says 'binary'"):
        QdrantStore(":memory:", client=client).verify()


def test_verify_compares_the_edge_shard_with_its_manifest(tmp_path: Path) -> None:
    store = QdrantStore(str(tmp_path / "q"))
    store.prepare(DIM, "fp", "m", QdrantCollectionConfig(quantize="sq8"))
    docs, vectors = _data(5)
    store.upsert(docs, vectors)
    store.commit()
    assert store.verify() == 5
    store.close()
    manifest = tmp_path / "q" / "care" / "manifest.json"
    raw = json.loads(manifest.read_text())
    raw["index"]["quantize"] = "binary"  # a manifest that no longer describes the shard
    manifest.write_text(json.dumps(raw))
    tampered = QdrantStore(str(tmp_path / "q"))
    with pytest.raises(StoreError, match=r"holds quantize='sq8'; its manifest says 'binary'"):
        tampered.verify()
    tampered.close()


def test_normalized_names_round_trip() -> None:
    given = {"quantization": "int8", "shard_number": 2, "replication_factor": 3, "on_disk": False}
    recorded = QdrantCollectionConfig.from_manifest(given).to_manifest()
    assert recorded == {"type": "hnsw", "quantize": "sq8", "shards": 2, "replicas": 3, "on_disk": False}
    assert QdrantCollectionConfig.from_manifest(recorded).to_manifest() == recorded


# ---------------------------------------------------------------------- the CLI
def _index(capsys, model: Path, corpus: Path, store: str, *flags: str) -> tuple[int, str, str]:
    from tests.support.cli import run_cli

    return run_cli(capsys, "index", "--model", model, "--corpus", corpus, "--store", store, "--no-progress", *flags)


def test_cli_index_flags_end_to_end(
    capsys, caplog, tiny_model_dir: Path, small_corpus_path: Path, tmp_path: Path
) -> None:
    from tests.support.cli import run_cli

    path = tmp_path / "q"
    store = f"qdrant:{path}"
    flags = ("--quantize", "binary", "--oversample", "4", "--on-disk-vectors", "--shards", "2", "--replicas", "2")
    with caplog.at_level(logging.WARNING, logger="care_retriever"):
        code, _, err = _index(capsys, tiny_model_dir, small_corpus_path, store, *flags)
    assert code == 0, err
    said = [r.getMessage() for r in caplog.records if "Qdrant Edge has one shard" in r.getMessage()]
    assert len(said) == 1 and "ignoring shards, replicas" in said[0]
    code, out, _ = run_cli(capsys, "info", "--store", store, "--json")
    info = json.loads(out)
    assert code == 0 and info["index"]["quantize"] == "binary" and info["index"]["oversample"] == 4.0
    assert info["collection"]["quantize"] == "binary" and info["collection"]["on_disk"] is True
    code, out, _ = run_cli(capsys, "info", "--store", store)
    assert code == 0 and "collection: {'engine': 'qdrant-edge', 'quantize': 'binary'" in out
    code, out, _ = run_cli(capsys, "verify", "--store", store)
    assert code == 0 and "holds 6 documents" in out
    code, out, _ = run_cli(
        capsys, "search", "--model", tiny_model_dir, "--store", store, "--top-k", "3", "--json", "宝宝发烧"
    )
    assert code == 0 and len(json.loads(out)["hits"]) == 3
    # the same settings again: an update, nothing refused; another quantization: one line, exit 2
    code, _, err = _index(capsys, tiny_model_dir, small_corpus_path, store, "--quantize", "binary", "--update")
    assert code == 0, err
    code, _, err = _index(capsys, tiny_model_dir, small_corpus_path, store, "--quantize", "sq8")
    assert code == 2 and "created with quantize 'binary' (asked 'sq8')" in err and err.count("\n") == 1
    assert _engine_settings(path)["quantize"] == "binary"


@pytest.mark.parametrize(
    ("backend", "flags", "message"),
    [
        ("qdrant", ("--quantize", "pq"), "unknown Qdrant quantization 'pq'; valid: none, sq8, binary"),
        ("qdrant", ("--shards", "0"), "shards must be an integer >= 1"),
        ("qdrant", ("--replicas", "-1"), "replicas must be an integer >= 1"),
        ("qdrant", ("--oversample", "3"), "apply to a quantized collection"),
        ("faiss", ("--shards", "2"), "--shards applies to Qdrant stores only"),
        ("faiss", ("--on-disk-vectors", "--replicas", "2"), "--on-disk-vectors, --replicas apply to Qdrant stores"),
    ],
)
def test_cli_bad_values_and_wrong_store_exit_2_with_one_line(
    capsys, tiny_model_dir: Path, small_corpus_path: Path, tmp_path: Path, backend: str, flags: tuple, message: str
) -> None:
    store = f"{backend}:{tmp_path / 'store'}"
    code, _, err = _index(capsys, tiny_model_dir, small_corpus_path, store, *flags)
    assert code == 2 and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "store").exists()  # nothing created


def test_max_segment_size_builds_the_graph_a_segment_at_a_time(tmp_path: Path) -> None:
    """Edge writes every point into one segment and optimize() builds one graph over all of them, its memory
    peaking with the segment (11 GiB at 1M 768-d vectors). With ``max_segment_size`` the commits past that many KB
    optimize what was written since, so each graph covers about that much; the search still finds the neighbours."""

    def graphs(options: dict) -> tuple[list[int], float]:
        path = tmp_path / str(len(list(tmp_path.iterdir())))
        store = QdrantStore(str(path))
        store.prepare(DIM, "fp", "m", QdrantCollectionConfig.from_manifest({"m": 8, "ef_construct": 40, **options}))
        docs, vectors = _data(1200)
        for start in range(0, 1200, 200):  # 200 vectors of 24 floats: 18.75 KB a commit
            store.upsert(docs[start : start + 200], vectors[start : start + 200])
            store.commit()
        store.finalize()
        queries = _data(10, seed=1)[1]
        found = [[h.id for h in row] for row in store.search(queries, 10, payload=False)]
        top = _exact_top(vectors, queries, 10)
        recall = float(np.mean([len(set(f) & set(e)) / 10 for f, e in zip(found, top, strict=True)]))
        built = store.collection_settings()
        store.close()
        return [s["index"] for s in built["segment_indexes"]].count("hnsw"), recall

    one_graph, recall = graphs({"indexing_threshold": 1})
    assert one_graph == 1 and recall >= 0.9
    several, recall = graphs({"indexing_threshold": 1, "max_segment_size": 30})
    assert several >= 3 and recall >= 0.9, (several, recall)  # optimized at every second commit


def test_a_server_collection_is_created_with_the_optimizer_settings(tmp_path: Path) -> None:
    """On a server, Qdrant's own optimizer applies the indexing threshold and the segment size (KB); a collection
    given neither gets the server's defaults. Local mode (the engine the server path is tested on) records them."""
    from care_retriever.stores.qdrant import ServerStore
    from care_retriever.stores.qdrant.server_settings import client, collection_options

    given = QdrantCollectionConfig(indexing_threshold=1000, max_segment_size=50_000)
    optimizers = collection_options(DIM, given)["optimizers_config"]
    assert (optimizers.indexing_threshold, optimizers.max_segment_size) == (1000, 50_000)
    assert "optimizers_config" not in collection_options(DIM, QdrantCollectionConfig())
    store = ServerStore(str(tmp_path / "local"), client=client(str(tmp_path / "local")))
    store.prepare(DIM, "fp", "m", given)
    docs, vectors = _data(20)
    store.upsert(docs, vectors)
    store.commit()
    assert store.count() == 20
    store.close()
