"""Stores of earlier releases (qdrant-client local mode) are recognised in one line and converted to Qdrant Edge by
``care-retriever migrate``: ids, vectors, payloads, the BM25 side and the model's fingerprint carried over, counts
verified, the old folder left as it was."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("qdrant_edge")
from qdrant_client import QdrantClient

from care_retriever.documents import Document
from care_retriever.sparse.qdrant_sparse import VECTOR
from care_retriever.stores import open_store
from care_retriever.stores.config import QdrantCollectionConfig
from care_retriever.stores.qdrant import EdgeStore, QdrantStore, ServerStore, point_id
from care_retriever.stores.qdrant.edge_verify import VECTOR_CHECKSUM, vector_checksum
from tests.support.cli import run_cli

DIM = 12


def old_store(folder: Path, n: int = 60) -> tuple[list[Document], np.ndarray]:
    """A store as the previous release wrote ``qdrant:PATH``: the same store code over qdrant-client's local mode."""
    rng = np.random.default_rng(3)
    vectors = rng.normal(size=(n, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    words = ["高血压", "糖尿病", "咳嗽", "发烧"]
    docs = [
        Document(id=f"d{i}", text=f"{words[i % 4]} 病例 {i}", title=f"t{i}", metadata={"group": i % 3})
        for i in range(n)
    ]
    client = QdrantClient(path=str(folder))
    store = QdrantStore(str(folder), client=client)
    assert isinstance(store, ServerStore)
    store.prepare(DIM, "old-space", "old-model", QdrantCollectionConfig(quantize="sq8"))
    store.upsert(docs, vectors)
    store.enable_sparse()
    store.commit()
    client.close()
    return docs, vectors


def digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


def old_points(folder: Path) -> dict[str, object]:
    client = QdrantClient(path=str(folder))
    points, _ = client.scroll("care", limit=1000, with_payload=True, with_vectors=True)
    client.close()
    return {p.id: p for p in points}


def test_an_old_store_is_named_in_one_line_and_converted_with_nothing_lost(tmp_path: Path, capsys) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    docs, vectors = old_store(old)
    before = digest(old)
    code, _, err = run_cli(capsys, "info", "--store", f"qdrant:{old}")
    assert code == 2 and err.count("\n") == 1
    assert f"care-retriever migrate --from qdrant:{old} --to qdrant:NEW_FOLDER" in err
    with pytest.raises(Exception, match="earlier care-retriever"):
        open_store(f"qdrant:{old}")

    code, out, err = run_cli(capsys, "migrate", "--from", f"qdrant:{old}", "--to", f"qdrant:{new}")
    assert code == 0 and "60 documents" in out, err
    assert digest(old) == before  # the old folder is only read

    store = open_store(f"qdrant:{new}")
    assert isinstance(store, EdgeStore)
    manifest = store.require_manifest()
    assert (manifest.space_fingerprint, manifest.model_name, manifest.dim) == ("old-space", "old-model", DIM)
    assert manifest.index["quantize"] == "sq8" and store.collection_settings()["quantize"] == "sq8"
    assert store.count() == store.verify() == 60
    ids = [d.id for d in docs]
    assert store.get(ids) == docs  # text, title, metadata
    np.testing.assert_allclose(np.stack(store.vectors(ids)), vectors, rtol=1e-6)
    # the BM25 side: the same sparse vectors, point by point
    old_by_id = old_points(old)
    new_by_id = {r.id: r for batch in store.scroll(True, True) for r in batch}
    assert set(new_by_id) == set(old_by_id) == {point_id(i) for i in ids}
    for pid, record in new_by_id.items():
        previous = old_by_id[pid]
        # the payload carried over, plus the checksum of the vector as the Edge shard stores it
        assert {k: v for k, v in record.payload.items() if k != VECTOR_CHECKSUM} == previous.payload
        assert record.payload[VECTOR_CHECKSUM] == vector_checksum(record.vector)
        assert record.sparse is not None and record.sparse[0] == list(previous.vector[VECTOR].indices)
        np.testing.assert_allclose(record.sparse[1], previous.vector[VECTOR].values, rtol=1e-6)
    assert store.search_sparse(["高血压"], 3)[0][0].text.startswith("高血压")
    store.close()

    # run again: nothing to write, the same counts
    code, out, err = run_cli(capsys, "migrate", "--from", f"qdrant:{old}", "--to", f"qdrant:{new}")
    assert code == 0, err
    with open_store(f"qdrant:{new}") as again:
        assert again.count() == 60


def test_migrate_refuses_what_it_cannot_convert_in_one_line(tmp_path: Path, capsys) -> None:
    old_store(tmp_path / "old", n=5)
    for source, target, message in (
        (f"qdrant:{tmp_path / 'old'}", f"qdrant:{tmp_path / 'old'}", "must be another folder"),
        (f"qdrant:{tmp_path / 'none'}", f"qdrant:{tmp_path / 'new'}", "no qdrant-client local-mode collection"),
        (f"faiss:{tmp_path / 'old'}", f"qdrant:{tmp_path / 'new'}", "--from takes qdrant:FOLDER"),
        (f"qdrant:{tmp_path / 'old'}", "qdrant:http://localhost:6333", "--to takes qdrant:FOLDER"),
    ):
        code, _, err = run_cli(capsys, "migrate", "--from", source, "--to", target)
        assert code == 2 and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "new").exists() and not (tmp_path / "none").exists()


def test_a_target_holding_documents_the_old_store_has_not_is_refused_before_any_write(tmp_path: Path, capsys) -> None:
    # the conversion merged the old store into it, then failed its count check: the target changed, exit 2
    old, new = tmp_path / "old", tmp_path / "new"
    old_store(old, n=10)
    target = EdgeStore(str(new))
    target.prepare(DIM, "old-space", "old-model", QdrantCollectionConfig(quantize="sq8", always_ram=True))
    extra = np.zeros((1, DIM), dtype=np.float32)
    extra[0, 0] = 1.0
    target.upsert([Document(id="extra", text="另一个库的文档")], extra)
    target.finalize()
    target.close()
    code, out, err = run_cli(capsys, "migrate", "--from", f"qdrant:{old}", "--to", f"qdrant:{new}")
    assert code == 2 and not out and err.count("\n") == 1, err
    assert "'extra'" in err and "another folder" in err, err
    with open_store(f"qdrant:{new}") as unchanged:
        assert unchanged.count() == 1 and [d.id for d in unchanged.get(["extra"])] == ["extra"]
