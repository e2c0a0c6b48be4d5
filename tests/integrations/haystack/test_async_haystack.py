"""Haystack's async path: ``run_async`` on every component, the store's ``*_async`` twins, ``run_async`` pipelines.

A *door* is a function ``(model, store, documents, queries) -> ranked (id, score) lists``: it indexes the
documents through an indexing pipeline (embedder -> DocumentWriter) and answers each query through a query
pipeline. The async door (``run_async``, queries all at once) must give the sync door's ids, order and scores.
"""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")  # offline: no usage pings
import haystack  # noqa: F401  (dev dependency: a broken install fails, never skips)
from haystack import Document, Pipeline
from haystack.components.writers import DocumentWriter
from haystack.document_stores.errors import DuplicateDocumentError
from haystack.document_stores.types import DuplicatePolicy
from haystack.testing.document_store_async import (
    CountDocumentsAsyncTest,
    CountDocumentsByFilterAsyncTest,
    DeleteAllAsyncTest,
    DeleteByFilterAsyncTest,
    DeleteDocumentsAsyncTest,
    FilterDocumentsAsyncTest,
    UpdateByFilterAsyncTest,
    WriteDocumentsAsyncTest,
)

from care_retriever.integrations import haystack as care_haystack
from care_retriever.integrations.haystack import (
    CareDocumentEmbedder,
    CareFaissDocumentStore,
    CareFaissEmbeddingRetriever,
    CareStoreRetriever,
    CareTextEmbedder,
)
from tests.support.data import SAMPLE_DIR, read_jsonl, sample_queries

Ranked = list[list[tuple[str, float]]]
K = 10


class TestCareFaissDocumentStoreAsyncSuite(
    WriteDocumentsAsyncTest,
    DeleteDocumentsAsyncTest,
    CountDocumentsAsyncTest,
    FilterDocumentsAsyncTest,
    CountDocumentsByFilterAsyncTest,
    DeleteAllAsyncTest,
    DeleteByFilterAsyncTest,
    UpdateByFilterAsyncTest,
):
    """Haystack's own async document-store suite. Embeddings come back L2-normalised float32 (the format's
    contract for a store of vectors from an unknown model), as in the sync suite."""

    @pytest.fixture
    def document_store(self, tmp_path: Path) -> Iterator[CareFaissDocumentStore]:
        store = CareFaissDocumentStore(str(tmp_path / "store"), embedding_dim=768)
        yield store
        store.close()

    def assert_documents_are_equal(self, received: list[Document], expected: list[Document]) -> None:
        assert [d.id for d in received] == [d.id for d in expected]
        for got, want in zip(received, expected, strict=True):
            assert replace(got, embedding=None) == replace(want, embedding=None)
            if want.embedding is None:
                assert got.embedding is None
            else:
                unit = np.asarray(want.embedding, dtype=np.float32)
                np.testing.assert_allclose(got.embedding, unit / np.linalg.norm(unit), rtol=1e-5, atol=1e-6)

    async def test_write_documents_async(self, document_store: CareFaissDocumentStore) -> None:
        """The default policy (NONE) behaves as FAIL, as in the sync store."""
        doc = Document(content="test doc", embedding=[0.5] * 768)
        assert await document_store.write_documents_async([doc]) == 1
        with pytest.raises(DuplicateDocumentError):
            await document_store.write_documents_async([doc])
        self.assert_documents_are_equal(await document_store.filter_documents_async(), [doc])


def corpus_documents(limit: int = 120) -> list[Document]:
    return [
        Document(id=r["_id"], content=r["text"], meta={"title": r["title"], **(r.get("metadata") or {})})
        for r in read_jsonl(SAMPLE_DIR / "corpus.jsonl")[:limit]
    ]


def _pipelines(model: Path, store: CareFaissDocumentStore) -> tuple[Pipeline, Pipeline, CareTextEmbedder]:
    index = Pipeline()
    index.add_component("embedder", CareDocumentEmbedder(str(model), progress_bar=False))
    index.add_component("writer", DocumentWriter(store, policy=DuplicatePolicy.OVERWRITE))
    index.connect("embedder.documents", "writer.documents")
    query = Pipeline()
    text_embedder = CareTextEmbedder(str(model))
    query.add_component("embedder", text_embedder)
    query.add_component("retriever", CareFaissEmbeddingRetriever(store, top_k=K))
    query.connect("embedder.embedding", "retriever.query_embedding")
    return index, query, text_embedder


def _ranked(result: dict[str, Any]) -> list[tuple[str, float]]:
    return [(d.id, float(d.score)) for d in result["retriever"]["documents"]]


def haystack_sync_door(model: Path, store: str, docs: list[Document], queries: list[str]) -> Ranked:
    document_store = CareFaissDocumentStore(store, model=str(model))
    index, query, _ = _pipelines(model, document_store)
    try:
        assert index.run({"embedder": {"documents": docs}})["writer"]["documents_written"] == len(docs)
        return [_ranked(query.run({"embedder": {"text": q}})) for q in queries]
    finally:
        document_store.close()


async def haystack_async_door(model: Path, store: str, docs: list[Document], queries: list[str]) -> Ranked:
    """The same through ``Pipeline.run_async``, the queries all at once (concurrent requests of a service)."""
    document_store = CareFaissDocumentStore(store, model=str(model))
    index, query, _ = _pipelines(model, document_store)
    try:
        written = await index.run_async({"embedder": {"documents": docs}})
        assert written["writer"]["documents_written"] == len(docs)
        answers = await asyncio.gather(*(query.run_async({"embedder": {"text": q}}) for q in queries))
        return [_ranked(a) for a in answers]
    finally:
        document_store.close()


def assert_same_ranking(got: Ranked, expected: Ranked, atol: float = 1e-5) -> None:
    assert len(got) == len(expected)
    for n, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert [i for i, _ in a] == [i for i, _ in b], f"query {n}: another order"
        np.testing.assert_allclose([s for _, s in a], [s for _, s in b], atol=atol, err_msg=f"query {n}")


@pytest.fixture(scope="module")
def doors(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, queries: list[str]) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("haystack_async")
    docs = corpus_documents()
    sync = haystack_sync_door(tiny_model_dir, str(root / "sync"), docs, queries)
    got = asyncio.run(haystack_async_door(tiny_model_dir, str(root / "async"), docs, queries))
    return {"sync": sync, "async": got, "root": root, "docs": docs}


def test_run_async_indexes_and_queries_as_run_does(doors: dict[str, Any]) -> None:
    assert all(len(r) == K for r in doors["sync"])
    assert_same_ranking(doors["async"], doors["sync"])


def test_every_component_has_its_own_run_async() -> None:
    for name in care_haystack.__all__:
        cls = getattr(care_haystack, name)
        if hasattr(cls, "run"):
            assert inspect.iscoroutinefunction(cls.__dict__.get("run_async")), name
            run, run_async = inspect.signature(cls.run), inspect.signature(cls.run_async)
            assert list(run.parameters) == list(run_async.parameters), name


async def test_concurrent_query_runs_share_forward_passes(
    tiny_model_dir: Path, doors: dict[str, Any], queries: list[str]
) -> None:
    store = CareFaissDocumentStore(str(doors["root"] / "async"), model=str(tiny_model_dir))
    _, query, text_embedder = _pipelines(tiny_model_dir, store)
    query.warm_up()
    answers = await asyncio.gather(*(query.run_async({"embedder": {"text": q}}) for q in queries))
    stats = text_embedder.async_stats
    assert stats.queries == len(queries) and stats.query_batches < len(queries), stats
    assert_same_ranking([_ranked(a) for a in answers], doors["sync"])
    store.close()


async def test_store_retriever_run_async_equals_run(tiny_model_dir: Path, doors: dict[str, Any]) -> None:
    embedder = CareTextEmbedder(str(tiny_model_dir))
    embedder.warm_up()
    retriever = CareStoreRetriever(f"faiss:{doors['root'] / 'sync'}", model=str(tiny_model_dir), top_k=K)
    try:
        for text in sample_queries()[:3]:
            vector = (await embedder.run_async(text))["embedding"]
            np.testing.assert_allclose(vector, embedder.run(text)["embedding"], atol=1e-5)
            filters = {"field": "meta.topic", "operator": "==", "value": "高血压"}
            for kwargs in ({}, {"filters": filters}):
                got = (await retriever.run_async(query_embedding=vector, **kwargs))["documents"]
                want = retriever.run(query_embedding=vector, **kwargs)["documents"]
                assert [(d.id, d.score) for d in got] == [(d.id, d.score) for d in want]
                assert got, kwargs
    finally:
        retriever.close()


async def test_store_async_twins_match_the_sync_methods(tmp_path: Path) -> None:
    store = CareFaissDocumentStore(str(tmp_path / "s"), embedding_dim=4)
    docs = [
        Document(
            id=str(i), content=f"文本{i}", meta={"group": "even" if i % 2 == 0 else "odd"}, embedding=[1.0, i, 0, 1]
        )
        for i in range(6)
    ]
    try:
        # Writes awaited together run in order, one transaction at a time.
        counts = await asyncio.gather(*(store.write_documents_async([d]) for d in docs))
        assert counts == [1] * 6 and await store.count_documents_async() == 6
        even = {"field": "meta.group", "operator": "==", "value": "even"}
        assert await store.filter_documents_async(even) == store.filter_documents(even)
        assert await store.count_documents_by_filter_async(even) == 3
        hits = await store.embedding_retrieval_async([1.0, 2.0, 0.0, 1.0], top_k=3)
        assert [(d.id, d.score) for d in hits] == [
            (d.id, d.score) for d in store.embedding_retrieval([1.0, 2.0, 0.0, 1.0], top_k=3)
        ]
        assert await store.update_by_filter_async(even, {"seen": True}) == 3
        await store.delete_documents_async(["0", "1"])
        assert await store.count_documents_async() == 4
        assert await store.delete_by_filter_async(even) == 2
        await store.delete_all_documents_async()
        assert store.count_documents() == 0
    finally:
        store.close()
