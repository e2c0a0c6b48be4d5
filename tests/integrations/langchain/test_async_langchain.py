"""LangChain's async methods of CareEmbeddings and CareVectorStore: the class's own, and the sync answers.

A *door* is a function ``(model, store spec, documents, queries) -> ranked (id, score) lists``: it indexes the
documents into the store and answers each query. The sync and async doors must agree on ids, order and scores.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import langchain_core  # noqa: F401  (dev dependency: a broken install fails, never skips)
import numpy as np
import pytest
from langchain_core.embeddings import Embeddings
from langchain_core.vectorstores import VectorStore

from care_retriever.integrations.langchain import CareEmbeddings, CareVectorStore
from tests.support.data import SAMPLE_DIR, read_jsonl

Ranked = list[list[tuple[str, float]]]
K = 10


def corpus_rows(limit: int = 120) -> list[dict[str, Any]]:
    return read_jsonl(SAMPLE_DIR / "corpus.jsonl")[:limit]


def _texts(docs: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]], list[str]]:
    return (
        [d["text"] for d in docs],
        [{"title": d["title"], **(d.get("metadata") or {})} for d in docs],
        [d["_id"] for d in docs],
    )


def langchain_sync_door(model: Path, store: str, docs: list[dict[str, Any]], queries: list[str]) -> Ranked:
    texts, metadatas, ids = _texts(docs)
    vectorstore = CareVectorStore.from_texts(texts, CareEmbeddings(model=str(model)), metadatas, ids=ids, store=store)
    try:
        return [[(d.id or "", s) for d, s in vectorstore.similarity_search_with_score(q, k=K)] for q in queries]
    finally:
        vectorstore.close()


async def langchain_async_door(model: Path, store: str, docs: list[dict[str, Any]], queries: list[str]) -> Ranked:
    """The same through the async methods, the queries all at once (as concurrent requests of a service)."""
    texts, metadatas, ids = _texts(docs)
    vectorstore = await CareVectorStore.afrom_texts(
        texts, CareEmbeddings(model=str(model)), metadatas, ids=ids, store=store
    )
    try:
        answers = await asyncio.gather(*(vectorstore.asimilarity_search_with_score(q, k=K) for q in queries))
        return [[(d.id or "", s) for d, s in answer] for answer in answers]
    finally:
        await vectorstore.aclose()


def assert_same_ranking(got: Ranked, expected: Ranked, atol: float = 1e-5) -> None:
    assert len(got) == len(expected)
    for n, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert [i for i, _ in a] == [i for i, _ in b], f"query {n}: another order"
        np.testing.assert_allclose([s for _, s in a], [s for _, s in b], atol=atol, err_msg=f"query {n}")


@pytest.mark.parametrize("kind", ["faiss", "qdrant"])
async def test_async_door_gives_the_sync_answers(
    kind: str, tiny_model_dir: Path, tmp_path: Path, queries: list[str]
) -> None:
    docs = corpus_rows()
    expected = await asyncio.to_thread(
        langchain_sync_door, tiny_model_dir, f"{kind}:{tmp_path / 'sync'}", docs, queries
    )
    got = await langchain_async_door(tiny_model_dir, f"{kind}:{tmp_path / 'async'}", docs, queries)
    assert all(len(r) == K for r in expected)
    assert_same_ranking(got, expected)


@pytest.fixture(scope="module")
def embeddings(tiny_model_dir: Path) -> CareEmbeddings:
    return CareEmbeddings(model=str(tiny_model_dir))


def test_the_async_methods_are_the_classes_own() -> None:
    """Not LangChain's base implementations (which run the sync method in an executor)."""
    for name in ("aembed_query", "aembed_documents"):
        assert getattr(CareEmbeddings, name) is not getattr(Embeddings, name), name
    for name in (
        "aadd_texts",
        "adelete",
        "aget_by_ids",
        "asimilarity_search",
        "asimilarity_search_with_score",
        "asimilarity_search_by_vector",
        "amax_marginal_relevance_search",
        "amax_marginal_relevance_search_by_vector",
        "afrom_texts",
    ):
        assert getattr(CareVectorStore, name).__qualname__.startswith("CareVectorStore."), name
        assert getattr(CareVectorStore, name) is not getattr(VectorStore, name, None), name


async def test_concurrent_aembed_query_calls_share_forward_passes(
    embeddings: CareEmbeddings, queries: list[str]
) -> None:
    before = embeddings.async_stats
    vectors = await asyncio.gather(*(embeddings.aembed_query(q) for q in queries))
    after = embeddings.async_stats
    assert after.queries - before.queries == len(queries)
    assert after.query_batches - before.query_batches < len(queries), (before, after)
    np.testing.assert_allclose(vectors, [embeddings.embed_query(q) for q in queries], atol=1e-5)


async def test_aembed_documents_keeps_the_loop_running(embeddings: CareEmbeddings) -> None:
    texts = [f"{d['title']}\n{d['text']}" for d in corpus_rows(300)] * 4
    beats: list[float] = []
    done = asyncio.Event()

    async def heartbeat() -> None:
        while not done.is_set():
            beats.append(time.perf_counter())
            await asyncio.sleep(0.01)

    beat = asyncio.create_task(heartbeat())
    await asyncio.sleep(0)
    started = time.perf_counter()
    vectors = await embeddings.aembed_documents(texts)
    elapsed = time.perf_counter() - started
    done.set()
    await beat
    assert elapsed > 0.2 and len(vectors) == len(texts)
    gaps = np.diff(beats)
    assert len(gaps) >= 5 and max(gaps) < max(elapsed / 2, 0.2), (elapsed, gaps)  # blocked: one gap, ~elapsed
    np.testing.assert_allclose(vectors[:4], embeddings.embed_documents(texts[:4]), atol=1e-5)


async def test_async_reads_and_writes_match_the_sync_ones(
    embeddings: CareEmbeddings, tmp_path: Path, queries: list[str]
) -> None:
    docs = corpus_rows(40)
    texts, metadatas, ids = _texts(docs)
    store = CareVectorStore(f"faiss:{tmp_path / 's'}", embeddings)
    try:
        assert await store.aadd_texts(texts, metadatas, ids=ids) == ids
        got = await store.aget_by_ids([ids[3], "missing", ids[0]])
        assert [d.id for d in got] == [ids[3], ids[0]] and got == store.get_by_ids([ids[3], "missing", ids[0]])
        query = queries[0]
        assert await store.amax_marginal_relevance_search(query, k=3, fetch_k=10) == (
            store.max_marginal_relevance_search(query, k=3, fetch_k=10)
        )
        relevance = await store.asimilarity_search_with_relevance_scores(query, k=3)
        assert [(d.id, pytest.approx(s, abs=1e-5)) for d, s in relevance] == [
            (d.id, s) for d, s in store.similarity_search_with_relevance_scores(query, k=3)
        ]
        retriever = store.as_retriever(search_kwargs={"k": 4})
        assert [d.id for d in await retriever.ainvoke(query)] == [d.id for d in retriever.invoke(query)]
        # Writes awaited together run one after the other, in order: the delete sees the re-add.
        await asyncio.gather(store.aadd_texts(["新文本"], ids=[ids[1]]), store.adelete([ids[1], ids[2]]))
        assert store.get_by_ids([ids[1], ids[2]]) == [] and store.store.count() == len(ids) - 2
    finally:
        await store.aclose()
