"""Hybrid search: the sparse (BM25) side of FAISS and Qdrant local stores, fusion, modes, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from care_retriever.cli.main import main
from care_retriever.errors import StoreError
from care_retriever.indexing.corpus import Document
from care_retriever.indexing.writer import DocumentStoreWriter
from care_retriever.search.retriever import CareRetriever
from care_retriever.sparse import FusionConfig
from care_retriever.sparse.fusion import fuse, rrf
from tests.support.data import MEDICAL_TEXTS

QUERIES = ["高血压吃什么药", "宝宝发烧怎么办", "拉肚子脱水", "失眠 咖啡"]
DOCS = [
    Document(id=i, title=t, text=x, metadata={"group": "odd" if n % 2 else "even"})
    for n, (i, t, x) in enumerate(MEDICAL_TEXTS)
]


def write(embedder, spec: str, docs=DOCS, *, sparse: bool = True, prune: bool = False):
    writer = DocumentStoreWriter(embedder, spec, sparse=sparse, show_progress=False)
    writer.write(docs, prune_ids_not_in=prune)
    return writer.store


def ranking(hits) -> list[tuple[str, float]]:
    return [(h.id, round(h.score, 5)) for h in hits]


def test_fusion_definitions() -> None:
    dense, sparse = [("a", 0.9), ("b", 0.5), ("c", 0.1)], [("c", 7.0), ("a", 1.0)]
    assert rrf([dense, sparse], k=10) == pytest.approx({"a": 1 / 11 + 1 / 12, "b": 1 / 12, "c": 1 / 13 + 1 / 11})
    wsum = dict(fuse(dense, sparse, FusionConfig("wsum", dense_weight=0.25)))
    assert wsum == pytest.approx({"a": 0.25 * 1.0 + 0.0, "b": 0.25 * 0.5, "c": 0.0 + 0.75 * 1.0})
    assert [d for d, _ in fuse(dense, sparse, FusionConfig("rrf", k=10))] == ["a", "c", "b"]


def test_faiss_sparse_scores_equal_the_bm25_baseline(embedder, tmp_path: Path) -> None:
    """The store's inverted index scores exactly as the eval baseline (bm25s, same tokens)."""
    from care_retriever.sparse.bm25 import BM25Model

    store = write(embedder, f"faiss:{tmp_path / 's'}")
    baseline = BM25Model()
    baseline.index([d.embedding_text() for d in DOCS])
    # Twice: a store's first query is scored in SQL, the later ones on its postings held in memory.
    for query in QUERIES * 2:
        idx, scores = baseline.search([query], len(DOCS))
        expected = {DOCS[i].id: float(s) for i, s in zip(idx[0], scores[0], strict=True) if s > 0}
        got = {h.id: h.score for h in store.search_sparse([query], len(DOCS))[0]}
        assert got == pytest.approx(expected, rel=1e-5), query
        assert expected


def test_sparse_scores_in_memory_equal_sql_and_follow_other_writers(embedder, tmp_path: Path, monkeypatch) -> None:
    """The in-memory postings give SQL's ranking (ties, top-k cut, filters) and see commits of another writer."""
    from care_retriever.sparse import sqlite_bm25
    from care_retriever.stores import open_store

    spec = f"faiss:{tmp_path / 'mem'}"
    write(embedder, spec)
    queries = [*QUERIES, "高血压 高血压 头痛", "的", "患者饮食", "及时就医 避免", "规律 避免 患者 就医 饮食 多"]
    cases = [(k, filters) for k in (1, 2, 10) for filters in (None, {"group": "odd"})]
    with monkeypatch.context() as patch:
        patch.setattr(sqlite_bm25, "MEMORY_POSTINGS", 0)  # this reader scores every query in SQL
        in_sql = open_store(spec)
        expected = [[ranking(in_sql.search_sparse([q], k, f)[0]) for q in queries] for k, f in cases]
    reader = open_store(spec)
    for _ in range(2):
        assert [[ranking(reader.search_sparse([q], k, f)[0]) for q in queries] for k, f in cases] == expected
    assert "a" not in {h.id for h in reader.search_sparse(["偏头痛"], 10)[0]}
    changed = Document(id="a", title="头痛", text="偏头痛发作时可以在安静黑暗的房间休息。")
    other = open_store(spec)
    with other.transaction():  # in place (the adapters' write path), from another connection
        other.upsert([changed], embedder.embed_documents([changed.embedding_text()]))
    assert [h.id for h in reader.search_sparse(["偏头痛"], 10)[0]] == ["a"]


def test_a_long_lived_reader_answers_as_a_fresh_open_after_other_writers_commit(embedder, tmp_path: Path) -> None:
    """A reader opened before another process writes (``serve`` while an adapter adds documents) sees each
    committed write on both sides at once: its dense, sparse and hybrid answers and its count equal a store
    opened afterwards, after an in-place upsert, an in-place delete, and a re-index that swaps the folder."""
    from care_retriever.stores import open_store

    spec = f"faiss:{tmp_path / 'live'}"
    write(embedder, spec)
    reader = open_store(spec)
    migraine = Document(id="new", title="偏头痛", text="偏头痛发作时可以在安静黑暗的房间休息，必要时服用止痛药。")
    query = "偏头痛 止痛药"
    vector = embedder.embed_documents([migraine.embedding_text()])  # the new document's own vector: its top hit

    def answers(store) -> tuple:
        return (
            ranking(store.search(vector, 5)[0]),
            ranking(store.search_sparse([query], 5)[0]),
            ranking(store.search_hybrid(vector, [query], 5)[0]),
            store.count(),
        )

    answers(reader)  # everything loaded (the BM25 postings are held in memory from the second query on)
    answers(reader)
    other = open_store(spec)
    with other.transaction():
        other.upsert([migraine], embedder.embed_documents([migraine.embedding_text()]))
    now = answers(reader)
    assert now == answers(open_store(spec)) and now[3] == len(DOCS) + 1
    assert now[0][0][0] == now[1][0][0] == now[2][0][0] == "new"
    with other.transaction():
        other.delete(["new", "a"])
    assert answers(reader) == answers(open_store(spec))
    write(embedder, spec, docs=DOCS[:3], prune=True)
    assert answers(reader) == answers(open_store(spec)) and reader.count() == 3


def test_hybrid_modes_and_filters_faiss(embedder, tmp_path: Path) -> None:
    store = write(embedder, f"faiss:{tmp_path / 'm'}")
    retriever = CareRetriever(store, embedder)
    dense = retriever.search(QUERIES[0], 6)
    sparse = retriever.search(QUERIES[0], 6, mode="sparse")
    hybrid = retriever.search(QUERIES[0], 6, mode="hybrid", fusion=FusionConfig("rrf", k=10))
    expected = fuse([(h.id, h.score) for h in dense], [(h.id, h.score) for h in sparse], FusionConfig("rrf", k=10))
    assert [(h.id, pytest.approx(h.score)) for h in hybrid] == [(d, pytest.approx(s)) for d, s in expected]
    assert sparse[0].id == "a"
    filtered = retriever.search(QUERIES[0], 6, {"group": "odd"}, mode="hybrid")
    assert filtered and {h.metadata["group"] for h in filtered} == {"odd"}


def test_punctuation_or_stopword_query_gives_dense_results(embedder, tmp_path: Path) -> None:
    retriever = CareRetriever(write(embedder, f"faiss:{tmp_path / 'p'}"), embedder)
    for query in ["？？！。", "的吗呢 请问"]:
        dense = retriever.search(query, 4)
        assert retriever.search(query, 4, mode="sparse") == []
        assert ranking(retriever.search(query, 4, mode="hybrid")) == ranking(dense)


def test_hybrid_without_sparse_side_names_the_command_and_sparse_only_adds_it(
    embedder, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "dense"
    store = write(embedder, f"faiss:{path}", sparse=False)
    retriever = CareRetriever(store, embedder)
    with pytest.raises(StoreError, match=r"index --sparse-only --store faiss:"):
        retriever.search(QUERIES[0], 3, mode="hybrid")
    retriever.close()
    vectors_before = (path / "index.faiss").read_bytes()
    assert main(["index", "--sparse-only", "--store", f"faiss:{path}", "--no-progress", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["tokenized"] == len(DOCS) and report["sparse"]["tokenizer"]["name"] == "jieba-search"
    assert (path / "index.faiss").read_bytes() == vectors_before  # nothing re-encoded
    from care_retriever.stores import open_store

    assert ranking(open_store(f"faiss:{path}").search_sparse([QUERIES[0]], 6)[0]) == ranking(
        write(embedder, f"faiss:{tmp_path / 'ref'}").search_sparse([QUERIES[0]], 6)[0]
    )


def test_cli_hybrid_on_a_dense_only_store_is_one_line(
    embedder, tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(embedder, f"faiss:{tmp_path / 'd'}", sparse=False).close()
    code = main(
        ["search", "高血压", "--model", str(tiny_model_dir), "--store", f"faiss:{tmp_path / 'd'}", "--mode", "hybrid"]
    )
    err = capsys.readouterr().err.strip()
    assert code != 0 and len(err.splitlines()) == 1 and "care-retriever index --sparse-only" in err
    assert (
        main(["search", "x", "--model", str(tiny_model_dir), "--store", f"faiss:{tmp_path / 'd'}", "--mode", "fuzzy"])
        != 0
    )
    assert "Available modes: ['dense', 'sparse', 'hybrid']" in capsys.readouterr().err


def test_other_tokenizer_version_is_refused(embedder, tmp_path: Path) -> None:
    path = tmp_path / "v"
    write(embedder, f"faiss:{path}").close()
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["sparse"]["tokenizer"]["version"] = 0
    (path / "manifest.json").write_text(json.dumps(manifest))
    from care_retriever.stores import open_store

    store = open_store(f"faiss:{path}")
    assert store.search(embedder.embed_queries(["高血压"]), 2)[0]  # dense still works
    with pytest.raises(StoreError, match="tokenizer jieba-search v0"):
        CareRetriever(store, embedder).search("高血压", 3, mode="hybrid")
    store.close()
    assert main(["index", "--sparse-only", "--store", f"faiss:{path}", "--no-progress"]) == 0  # the fix it names
    assert open_store(f"faiss:{path}").search_sparse(["高血压"], 3)[0][0].id == "a"


def test_failed_sparse_build_leaves_the_store_untouched(embedder, tmp_path: Path, monkeypatch) -> None:
    """`index --sparse-only` killed mid-build publishes nothing; running it again completes the side."""
    from care_retriever.sparse import tokenizer
    from care_retriever.stores import open_store

    path = tmp_path / "f"
    write(embedder, f"faiss:{path}", sparse=False).close()
    before = {p.name: p.read_bytes() for p in path.iterdir()}
    real = tokenizer.tokenize

    def killed(texts, **kwargs):
        raise KeyboardInterrupt("killed mid-build")

    monkeypatch.setattr(tokenizer, "tokenize", killed)
    # click turns the interrupt into "Aborted!" and exit 1 (a plain process would die on it): either way, not 0
    try:
        code = main(["index", "--sparse-only", "--store", f"faiss:{path}", "--no-progress"])
    except KeyboardInterrupt:
        code = None
    assert code != 0
    assert {p.name: p.read_bytes() for p in path.iterdir()} == before
    assert not open_store(f"faiss:{path}").manifest.sparse
    monkeypatch.setattr(tokenizer, "tokenize", real)
    assert main(["index", "--sparse-only", "--store", f"faiss:{path}", "--no-progress"]) == 0  # resumes the build
    reopened = open_store(f"faiss:{path}")
    assert reopened.manifest.sparse and reopened.search_sparse(["高血压"], 3)[0][0].id == "a"


def test_qdrant_edge_hybrid_matches_faiss(embedder, tmp_path: Path) -> None:
    """Native sparse vectors (IDF modifier) score as the FAISS inverted index; RRF/DBSF fused in the engine as ours."""
    qdrant = write(embedder, f"qdrant:{tmp_path / 'q'}")
    faiss_store = write(embedder, f"faiss:{tmp_path / 'f'}")
    assert qdrant.collection_settings()["sparse_modifier"] == "idf"  # the engine weighs query tokens by IDF
    for query in QUERIES:
        assert ranking(qdrant.search_sparse([query], 6)[0]) == ranking(faiss_store.search_sparse([query], 6)[0])
    on_qdrant, on_faiss = CareRetriever(qdrant, embedder), CareRetriever(faiss_store, embedder)
    for fusion in (FusionConfig("rrf", k=10), FusionConfig("dbsf"), FusionConfig("wsum", dense_weight=0.3)):
        for query in QUERIES:
            got = ranking(on_qdrant.search(query, 6, mode="hybrid", fusion=fusion))
            want = ranking(on_faiss.search(query, 6, mode="hybrid", fusion=fusion))
            assert sorted(s for _, s in got) == pytest.approx(sorted(s for _, s in want), abs=1e-4), (fusion, query)
            assert got[0] == pytest.approx(want[0], abs=1e-4) if got[0][0] == want[0][0] else got[0][1] == want[0][1]
    # upsert and delete keep Qdrant's sparse side consistent too
    changed = Document(id="a", title="头痛", text="偏头痛发作时可以在安静黑暗的房间休息。")
    write(embedder, qdrant, [changed])
    assert [h.id for h in qdrant.search_sparse(["偏头痛"], 6)[0]] == ["a"]
    assert "a" not in {h.id for h in qdrant.search_sparse(["高血压"], 6)[0]}
    writer = DocumentStoreWriter(embedder, qdrant, show_progress=False)
    writer.delete(["b"])
    assert "b" not in {h.id for h in qdrant.search_sparse(["感冒 病毒"], 6)[0]}
    qdrant.close()


def test_eval_mode_hybrid_rows(tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`eval --mode dense --mode hybrid` gives one row per mode; the random tiny model gains from BM25."""
    task = tmp_path / "task"
    (task / "qrels").mkdir(parents=True)
    (task / "corpus.jsonl").write_text(
        "\n".join(json.dumps({"_id": d.id, "title": d.title, "text": d.text}, ensure_ascii=False) for d in DOCS),
        encoding="utf-8",
    )
    queries = {"q1": "高血压降压药", "q2": "宝宝发烧", "q3": "拉肚子补充水分", "q4": "失眠咖啡"}
    (task / "queries.jsonl").write_text(
        "\n".join(json.dumps({"_id": q, "text": t}, ensure_ascii=False) for q, t in queries.items()), encoding="utf-8"
    )
    (task / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\ta\t1\nq2\tf\t1\nq3\td\t1\nq4\te\t1\n")
    code = main(
        [
            "eval",
            "--model",
            str(tiny_model_dir),
            "--task",
            str(task),
            "--mode",
            "dense",
            "--mode",
            "hybrid",
            "--fusion",
            "rrf",
            "--rrf-k",
            "10",
            "--json",
            "--no-progress",
        ]
    )
    assert code == 0
    rows = {r["model"]: r for r in map(json.loads, capsys.readouterr().out.strip().splitlines())}
    assert set(rows) == {"tiny", "tiny+bm25 (rrf k=10)"}
    assert rows["tiny+bm25 (rrf k=10)"]["main_score"] > rows["tiny"]["main_score"]


# ---------------------------------------------------------------- the FAISS store fuses hybrid itself
FUSED_TEXTS = [
    "高血压 高血压 高血压 头晕",
    "高血压 饮食 低盐",
    "糖尿病 血糖 饮食",
    "高血压 糖尿病 并发症 高血压",
    "感冒 发烧 咳嗽",
    "失眠 焦虑 高血压",
    "腹泻 脱水 补液",
    "头晕 乏力 贫血",
    "高血压 药物 降压 随访 复查 饮食 运动",
    "儿童 发烧 退烧",
]


def _by_hand(dense: list[tuple[str, float]], sparse: list[tuple[str, float]], fusion: FusionConfig) -> dict:
    """The fusion formulas written out again from the two rankings (not through care_retriever.sparse.fusion)."""
    import math

    def minmax(ranking):
        low, high = min(s for _, s in ranking), max(s for _, s in ranking)
        return {d: (s - low) / (high - low) for d, s in ranking}

    def dbsf(ranking):
        scores = [s for _, s in ranking]
        mean = sum(scores) / len(scores)
        sd = math.sqrt(sum((s - mean) ** 2 for s in scores) / (len(scores) - 1))
        return {d: (s - (mean - 3 * sd)) / (6 * sd) for d, s in ranking}

    if fusion.method == "rrf":
        parts = [{d: 1 / (fusion.k + rank) for rank, (d, _) in enumerate(side, 1)} for side in (dense, sparse)]
    elif fusion.method == "dbsf":
        parts = [dbsf(dense), dbsf(sparse)]
    else:
        w = fusion.dense_weight
        parts = [{d: w * s for d, s in minmax(dense).items()}, {d: (1 - w) * s for d, s in minmax(sparse).items()}]
    return {d: sum(p.get(d, 0.0) for p in parts) for d in {*parts[0], *parts[1]}}


@pytest.mark.parametrize(
    "fusion",
    [FusionConfig("rrf", k=3), FusionConfig("dbsf"), FusionConfig("wsum", dense_weight=0.4)],
    ids=lambda f: f.method,
)
def test_the_faiss_store_fuses_hybrid_itself_as_the_formula_says(tmp_path: Path, fusion: FusionConfig) -> None:
    """FAISS declares every fusion as its own (``hybrid_fusions``) and ``hybrid_search`` gets its ``search_hybrid``;
    that ranking equals the formula computed by hand from the store's dense and BM25 rankings, and differs from
    both."""
    import numpy as np

    from care_retriever.search.hybrid import hybrid_search
    from care_retriever.stores.faiss import FaissStore

    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((len(FUSED_TEXTS), 16)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    docs = [Document(id=f"d{i}", text=text) for i, text in enumerate(FUSED_TEXTS)]
    store = FaissStore(tmp_path / "store")
    store.prepare(16, "fp", "model")
    store.enable_sparse()
    store.upsert(docs, vectors)
    store.finalize()
    query, text, n = vectors[2:3] + 0.5 * vectors[5:6], "高血压 饮食", len(docs)
    query /= np.linalg.norm(query)
    with store:
        assert fusion.method in store.hybrid_fusions  # fused by the store itself, on its row ids
        dense = [(h.id, h.score) for h in store.search(query, n)[0]]
        sparse = [(h.id, h.score) for h in store.search_sparse([text], n)[0]]
        expected = sorted(_by_hand(dense, sparse, fusion).items(), key=lambda item: (-item[1], item[0]))
        own = store.search_hybrid(query, [text], 5, fusion=fusion)[0]
        through_the_door = hybrid_search(store, query, [text], 5, fusion=fusion)[0]
    fused_ids = [h.id for h in own]
    assert fused_ids != [d for d, _ in dense[:5]] and fused_ids != [d for d, _ in sparse[:5]]
    assert fused_ids == [d for d, _ in expected[:5]]
    np.testing.assert_allclose([h.score for h in own], [s for _, s in expected[:5]], rtol=1e-5)
    assert [(h.id, h.score, h.text) for h in through_the_door] == [(h.id, h.score, h.text) for h in own]
