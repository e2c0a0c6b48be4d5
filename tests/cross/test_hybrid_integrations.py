"""Haystack's hybrid pipeline and LangChain's hybrid retriever return `care-retriever search --mode hybrid`'s hits."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import haystack  # noqa: F401  (dev dependency: a missing one fails, it does not skip)
import langchain_core  # noqa: F401
import pytest

from care_retriever.cli.main import main

REPO = Path(__file__).resolve().parents[2]
QUERIES = ["高血压吃什么药", "宝宝发烧怎么办", "拉肚子脱水怎么办"]


@pytest.fixture(scope="module")
def hybrid_store(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, small_corpus_path: Path) -> str:
    spec = f"faiss:{tmp_path_factory.mktemp('hy') / 'store'}"
    assert (
        main(
            [
                "index",
                "--model",
                str(tiny_model_dir),
                "--corpus",
                str(small_corpus_path),
                "--store",
                spec,
                "--no-progress",
            ]
        )
        == 0
    )
    return spec


def cli_hits(capsys, model: Path, spec: str, query: str, *extra: str) -> list[tuple[str, float]]:
    assert (
        main(
            [
                "search",
                query,
                "--model",
                str(model),
                "--store",
                spec,
                "--top-k",
                "5",
                "--mode",
                "hybrid",
                "--json",
                *extra,
            ]
        )
        == 0
    )
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    return [(h["id"], h["score"]) for h in row["hits"]]


def same_order(got: list[str], want: list[tuple[str, float]]) -> bool:
    """Equal ids in order, up to the order inside groups of equal fused scores (tie-breaks differ)."""
    if len(got) != len(want):
        return False
    groups: dict[float, set[str]] = {}
    for doc, score in want:
        groups.setdefault(round(score, 6), set()).add(doc)
    expected = [groups[round(score, 6)] for _, score in want]
    return all(doc in allowed for doc, allowed in zip(got, expected, strict=True))


def test_haystack_joiner_pipeline_matches_cli(capsys, tiny_model_dir: Path, hybrid_store: str) -> None:
    sys.path.insert(0, str(REPO / "examples"))
    try:
        import haystack_hybrid
    finally:
        sys.path.remove(str(REPO / "examples"))
    for query in QUERIES:
        want = cli_hits(capsys, tiny_model_dir, hybrid_store, query, "--fusion", "rrf", "--rrf-k", "60")
        got = [d.id for d in haystack_hybrid.main([query, "--model", str(tiny_model_dir), "--store", hybrid_store])]
        capsys.readouterr()
        assert same_order(got, want), (query, got, want)


def test_haystack_store_retriever_hybrid_mode_matches_cli(capsys, tiny_model_dir: Path, hybrid_store: str) -> None:
    from care_retriever.integrations.haystack import CareStoreRetriever, CareTextEmbedder

    embedder = CareTextEmbedder(str(tiny_model_dir))
    embedder.warm_up()
    retriever = CareStoreRetriever(hybrid_store, model=str(tiny_model_dir), top_k=5, mode="hybrid")
    for query in QUERIES:
        want = cli_hits(capsys, tiny_model_dir, hybrid_store, query)
        docs = retriever.run(query_embedding=embedder.run(text=query)["embedding"], query=query)["documents"]
        assert [(d.id, pytest.approx(d.score, abs=1e-5)) for d in docs] == want
    retriever.close()


def test_langchain_hybrid_retriever_matches_cli(capsys, tiny_model_dir: Path, hybrid_store: str) -> None:
    from care_retriever.integrations.langchain import CareEmbeddings, CareVectorStore

    store = CareVectorStore(hybrid_store, CareEmbeddings(model=str(tiny_model_dir)))
    retriever = store.as_retriever(search_type="hybrid", search_kwargs={"k": 5})
    dbsf = store.as_retriever(search_type="hybrid", search_kwargs={"k": 5, "fusion": "dbsf"})
    for query in QUERIES:
        want = cli_hits(capsys, tiny_model_dir, hybrid_store, query)
        assert [d.id for d in retriever.invoke(query)] == [doc for doc, _ in want]
        want_dbsf = cli_hits(capsys, tiny_model_dir, hybrid_store, query, "--fusion", "dbsf")
        assert [d.id for d in dbsf.invoke(query)] == [doc for doc, _ in want_dbsf]
    assert [d.id for d in store.as_retriever(search_type="sparse").invoke("高血压")][:1] == ["a"]
    with pytest.raises(ValueError, match="hybrid"):
        store.as_retriever(search_type="fuzzy")
    store.close()


def test_server_mode_field_matches_cli(capsys, tiny_model_dir: Path, hybrid_store: str) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from care_retriever.search.retriever import CareRetriever
    from care_retriever.search.server import create_app

    retriever = CareRetriever.from_pretrained(str(tiny_model_dir), hybrid_store)
    client = TestClient(create_app(retriever))
    want = cli_hits(capsys, tiny_model_dir, hybrid_store, QUERIES[0])
    reply = client.post("/search", json={"query": QUERIES[0], "top_k": 5, "mode": "hybrid"})
    assert reply.status_code == 200
    assert [(h["id"], pytest.approx(h["score"], abs=1e-5)) for h in reply.json()["results"][0]["hits"]] == want
    bad = client.post("/search", json={"query": QUERIES[0], "mode": "fuzzy"})
    assert bad.status_code == 422 and "mode" in bad.json()["error"]
    retriever.close()
