"""FAISS and Qdrant stores, the writer and the retriever, on real FAISS and Qdrant local mode."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from care_retriever import AsymmetricEmbedder, CareRetriever, DocumentStoreWriter
from care_retriever.errors import InputError, StoreError
from care_retriever.indexing.corpus import Document
from care_retriever.stores import open_store
from care_retriever.stores.faiss import DOCSTORE, INDEX, MANIFEST

QUERIES = ["血压高怎么办", "拉肚子脱水", "宝宝发烧"]


def _brute_force_scored(embedder: AsymmetricEmbedder, docs: list[Document], query: str) -> list[tuple[str, float]]:
    """The independent answer: numpy cosine (unit vectors: a dot product) of the query with every document."""
    d = embedder.embed_documents([x.embedding_text() for x in docs])
    q = embedder.embed_queries([query])[0]
    scores = d @ q
    return [(docs[i].id, float(scores[i])) for i in np.argsort(-scores, kind="stable")]


def _brute_force(embedder: AsymmetricEmbedder, docs: list[Document], query: str) -> list[str]:
    return [doc_id for doc_id, _ in _brute_force_scored(embedder, docs, query)]


def _assert_hits_equal(hits: list, want: list[tuple[str, float]]) -> None:
    assert [h.id for h in hits] == [i for i, _ in want]
    np.testing.assert_allclose([h.score for h in hits], [s for _, s in want], atol=1e-5)


@pytest.mark.parametrize("spec", ["faiss", "qdrant-memory", "qdrant-path"])
def test_write_then_search_matches_brute_force(embedder, docs, tmp_path: Path, spec: str) -> None:
    store = {
        "faiss": f"faiss:{tmp_path / 'f'}",
        "qdrant-memory": "qdrant::memory:",
        "qdrant-path": f"qdrant:{tmp_path / 'q'}",
    }[spec]
    writer = DocumentStoreWriter(embedder, store, show_progress=False, chunk_size=4)
    report = writer.write(docs)
    assert (report.added, report.count) == (len(docs), len(docs))
    retriever = CareRetriever(writer.store, embedder)
    for query in QUERIES:
        hits = retriever.search(query, top_k=len(docs))
        # ids and scores: a wrong but order-preserving score (say (1 + cos) / 2) fails here
        _assert_hits_equal(hits, _brute_force_scored(embedder, docs, query))
        assert hits[0].text
    # The queries do not share one ranking, so a batch answered in the wrong order fails below.
    assert len({tuple(_brute_force(embedder, docs, q)) for q in QUERIES}) == len(QUERIES)
    batch = retriever.search(QUERIES, top_k=2)
    for hits, query in zip(batch, QUERIES, strict=True):
        _assert_hits_equal(hits, _brute_force_scored(embedder, docs, query)[:2])
    filtered = retriever.search(QUERIES[0], top_k=6, filters={"group": "odd"})
    assert {h.id for h in filtered} == {"b", "d", "f"}
    retriever.close()


@pytest.mark.parametrize("spec", ["faiss", "qdrant"])
def test_reindex_adds_nothing_update_reencodes_changed_and_delete(embedder, docs, tmp_path: Path, spec: str) -> None:
    store = f"faiss:{tmp_path / 'f'}" if spec == "faiss" else f"qdrant:{tmp_path / 'q'}"
    first = DocumentStoreWriter(embedder, store, show_progress=False)
    first.write(docs)
    first.store.close()
    again = DocumentStoreWriter(embedder, store, show_progress=False)
    report = again.write(docs)
    assert (report.added, report.updated, report.unchanged, report.count) == (0, 0, len(docs), len(docs))
    changed = [Document(d.id, d.text + "（已更新）", d.title, d.metadata) if d.id == "a" else d for d in docs]
    changed.append(Document("g", "新增文档：痛风患者应少吃海鲜。"))
    report = again.write(changed)
    assert (report.added, report.updated, report.unchanged, report.count) == (
        1,
        1,
        len(docs) - 1,
        len(docs) + 1,
    )
    assert again.store.get(["a"])[0].text.endswith("（已更新）")
    assert again.delete(["g", "missing"]) == 1
    assert again.store.count() == len(docs)
    hits = CareRetriever(again.store, embedder).search(QUERIES[0], top_k=10)
    assert len(hits) == len(docs) and len({h.id for h in hits}) == len(docs)
    again.store.close()


@pytest.mark.parametrize("options", [{"type": "hnsw", "m": 8}, {"type": "ivf", "nlist": 2, "nprobe": 2}])
def test_approximate_faiss_indexes(embedder, docs, tmp_path: Path, options: dict) -> None:
    writer = DocumentStoreWriter(embedder, f"faiss:{tmp_path / 's'}", index_options=options, show_progress=False)
    writer.write(docs)
    hits = CareRetriever(writer.store, embedder).search(QUERIES[0], top_k=3)
    assert [h.id for h in hits] == _brute_force(embedder, docs, QUERIES[0])[:3]  # tiny index: exact
    writer.write([Document("a", "改写后的高血压文档"), *docs[1:]])  # HNSW keeps a tombstone, IVF removes
    reopened = open_store(f"faiss:{tmp_path / 's'}")
    assert reopened.count() == len(docs)
    assert len({h.id for h in CareRetriever(reopened, embedder).search(QUERIES[0], top_k=10)}) == len(docs)


def test_store_refuses_another_model(embedder, docs, tmp_path: Path, small_corpus_path: Path) -> None:
    from care_retriever.model.towers.scratch import init_from_scratch

    DocumentStoreWriter(embedder, f"faiss:{tmp_path / 's'}", show_progress=False).write(docs)
    other = init_from_scratch("tiny", [small_corpus_path], seed=1)
    with pytest.raises(StoreError, match="built with another model"):
        CareRetriever(f"faiss:{tmp_path / 's'}", other)
    with pytest.raises(StoreError, match="built with another model"):
        DocumentStoreWriter(other, f"faiss:{tmp_path / 's'}", show_progress=False).write(docs)


def test_corrupted_stores_give_clear_errors(embedder, docs, tmp_path: Path) -> None:
    folder = tmp_path / "s"
    DocumentStoreWriter(embedder, f"faiss:{folder}", show_progress=False).write(docs)
    manifest = json.loads((folder / MANIFEST).read_text())
    index_bytes = (folder / INDEX).read_bytes()
    (folder / INDEX).write_bytes(index_bytes[: len(index_bytes) // 2])
    with pytest.raises(StoreError, match=r"index.faiss: size mismatch"):  # open checks sizes, verify hashes
        open_store(f"faiss:{folder}")
    (folder / INDEX).write_bytes(index_bytes)
    (folder / MANIFEST).write_text(json.dumps({**manifest, "format_version": 99}))
    with pytest.raises(StoreError, match="newer than this care-retriever"):
        open_store(f"faiss:{folder}")
    (folder / MANIFEST).write_text(json.dumps(manifest))
    con = sqlite3.connect(folder / DOCSTORE)  # the docstore's meta table holds the counts open() checks
    con.execute("UPDATE care_meta SET value = 5 WHERE key = 'count'")
    con.commit()
    con.close()
    with pytest.raises(StoreError, match="count mismatch"):
        open_store(f"faiss:{folder}")
    (folder / DOCSTORE).unlink()
    with pytest.raises(StoreError, match=r"docstore\.sqlite: missing"):
        open_store(f"faiss:{folder}")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "x").write_text("x")
    with pytest.raises(StoreError, match="not a care-retriever FAISS store"):
        open_store(f"faiss:{tmp_path / 'junk'}")


def test_bad_store_specs_and_queries(embedder, docs, tmp_path: Path) -> None:
    for spec in ["bogus:/x", "faiss:", "nocolon"]:
        with pytest.raises(InputError, match="invalid store"):
            open_store(spec)
    with pytest.raises(StoreError, match="does not exist"):
        CareRetriever(f"faiss:{tmp_path / 'empty'}", embedder)
    writer = DocumentStoreWriter(embedder, "qdrant::memory:", show_progress=False)
    writer.write(docs)
    retriever = CareRetriever(writer.store, embedder)
    with pytest.raises(InputError, match="empty query"):
        retriever.search("  ")
    with pytest.raises(InputError, match="top_k"):
        retriever.search("血压", top_k=0)
    with pytest.raises(InputError, match="invalid filter field"):
        retriever.search("血压", filters={"a b": 1})
    with pytest.raises(InputError, match="dims"):
        writer.store.search(np.zeros((1, 7), dtype=np.float32), 3)


@pytest.mark.parametrize("spec", ["faiss", "qdrant-path"])
def test_store_scores_equal_numpy_cosine_on_the_same_vectors(tmp_path: Path, spec: str) -> None:
    """The independent reference for scores: numpy over the vectors that went in (not the store's own
    exact search). 200 random unit vectors in 32 dims, 5 queries: every returned score is the cosine."""
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((200, 32)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    queries = rng.standard_normal((5, 32)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    docs = [Document(f"v{i}", f"文本{i}") for i in range(len(vectors))]
    store = open_store(f"faiss:{tmp_path / 'f'}" if spec == "faiss" else f"qdrant:{tmp_path / 'q'}")
    store.prepare(32, "numpy-reference", "random-vectors")
    store.upsert(docs, vectors)
    store.commit()
    store.finalize()
    cosine = queries @ vectors.T
    for row, hits in zip(cosine, store.search(queries, 10), strict=True):
        want = np.argsort(-row, kind="stable")[:10]
        assert [h.id for h in hits] == [f"v{i}" for i in want]
        np.testing.assert_allclose([h.score for h in hits], row[want], atol=1e-5)
    store.close()
