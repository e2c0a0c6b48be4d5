"""CareFaissDocumentStore: Haystack's own document-store suite, the shared folder format, retrieval."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")  # offline: no usage pings
import haystack  # noqa: F401  (dev dependency: a broken install fails, never skips)
from haystack import Document
from haystack.document_stores.errors import DuplicateDocumentError
from haystack.document_stores.types import DuplicatePolicy
from haystack.errors import FilterError
from haystack.testing.document_store import (
    CountDocumentsByFilterTest,
    DocumentStoreBaseExtendedTests,
)

from care_retriever.errors import InputError, StoreError
from care_retriever.integrations.haystack import CareFaissDocumentStore, CareFaissEmbeddingRetriever
from care_retriever.integrations.haystack.filters import to_core_filters


def _unit(vector: list[float]) -> np.ndarray:
    v = np.asarray(vector, dtype=np.float32)
    n = np.linalg.norm(v)
    return v / n if n else v


class TestCareFaissDocumentStoreSuite(DocumentStoreBaseExtendedTests, CountDocumentsByFilterTest):
    """Haystack's base + extended suites. Embeddings come back L2-normalised float32 (the format's contract)."""

    @pytest.fixture
    def document_store(self, tmp_path: Path) -> CareFaissDocumentStore:
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
                np.testing.assert_allclose(got.embedding, _unit(want.embedding), rtol=1e-5, atol=1e-6)

    def test_write_documents(self, document_store: CareFaissDocumentStore) -> None:
        """The default policy (NONE) behaves as FAIL, like InMemoryDocumentStore."""
        doc = Document(content="test doc", embedding=[0.5] * 768)
        assert document_store.write_documents([doc]) == 1
        with pytest.raises(DuplicateDocumentError):
            document_store.write_documents([doc])
        self.assert_documents_are_equal(document_store.filter_documents(), [doc])


@pytest.fixture
def store(tmp_path: Path) -> CareFaissDocumentStore:
    return CareFaissDocumentStore(str(tmp_path / "store"), embedding_dim=4)


def _docs() -> list[Document]:
    return [
        Document(id="a", content="alpha", meta={"group": "x", "n": 1, "title": "A"}, embedding=[1.0, 0, 0, 0]),
        Document(id="b", content="beta", meta={"group": "y", "n": 2}, embedding=[0.9, 0.1, 0, 0]),
        Document(id="c", content="gamma", meta={"group": "x", "n": 3}, embedding=[0, 1.0, 0, 0]),
        Document(id="d", content="delta", meta={"group": "y", "n": 4}),
    ]


def test_retrieval_ranks_by_cosine_and_skips_documents_without_embeddings(store: CareFaissDocumentStore) -> None:
    store.write_documents(_docs())
    hits = store.embedding_retrieval([2.0, 0, 0, 0], top_k=10)
    assert [d.id for d in hits] == ["a", "b", "c"]
    assert hits[0].score == pytest.approx(1.0, abs=1e-6)
    assert hits[0].meta == {"group": "x", "n": 1, "title": "A"}
    scaled = store.embedding_retrieval([2.0, 0, 0, 0], top_k=1, scale_score=True, return_embedding=True)
    assert scaled[0].score == pytest.approx(1.0, abs=1e-6)
    np.testing.assert_allclose(scaled[0].embedding, [1.0, 0, 0, 0], atol=1e-6)


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        ({"field": "meta.group", "operator": "==", "value": "x"}, ["a", "c"]),  # core pre-filter path
        ({"field": "meta.group", "operator": "in", "value": ["y"]}, ["b"]),
        ({"field": "meta.n", "operator": ">=", "value": 2}, ["b", "c"]),  # post-filter path
        ({"field": "meta.title", "operator": "==", "value": "A"}, ["a"]),  # title is a column, not metadata
        ({"operator": "NOT", "conditions": [{"field": "meta.group", "operator": "==", "value": "x"}]}, ["b"]),
    ],
)
def test_retrieval_with_haystack_filters(store: CareFaissDocumentStore, filters: dict, expected: list[str]) -> None:
    store.write_documents(_docs())
    assert [d.id for d in store.embedding_retrieval([1.0, 0, 0, 0], filters=filters, top_k=10)] == expected


def test_post_filtering_widens_the_search_until_top_k_are_found(tmp_path: Path) -> None:
    store = CareFaissDocumentStore(str(tmp_path / "s"), embedding_dim=2)
    docs = [Document(id=f"n{i}", content=f"near {i}", meta={"rank": i}, embedding=[1.0, i * 1e-3]) for i in range(40)]
    docs += [Document(id="far", content="far", meta={"rank": 100}, embedding=[0.0, 1.0])]
    store.write_documents(docs)
    hits = store.embedding_retrieval([1.0, 0.0], top_k=1, filters={"field": "meta.rank", "operator": ">", "value": 50})
    assert [d.id for d in hits] == ["far"]


@pytest.mark.parametrize("value", [1, True, 1.0, [1], [True, 2]])
def test_an_equality_filter_finds_what_haystacks_evaluator_finds(tmp_path: Path, value: object) -> None:
    """The core store tells a boolean from the integer 1 (as Qdrant does); Haystack's evaluator has ``True == 1``.
    An ``==`` / ``in`` filter that runs inside the store still returns what InMemoryDocumentStore would."""
    from haystack.document_stores.in_memory import InMemoryDocumentStore

    docs = [
        Document(id=name, content=name, meta={"level": level}, embedding=[1.0, i * 1e-3])
        for i, (name, level) in enumerate([("flag", True), ("one", 1), ("real", 1.0), ("two", 2), ("off", False)])
    ]
    operator = "in" if isinstance(value, list) else "=="
    filters = {"field": "meta.level", "operator": operator, "value": value}
    assert to_core_filters(filters) is not None  # the store's own filter path, not the evaluator's alone
    ours = CareFaissDocumentStore(str(tmp_path / "s"), embedding_dim=2)
    theirs = InMemoryDocumentStore()
    for store in (ours, theirs):
        store.write_documents(docs)
    want = sorted(d.id for d in theirs.filter_documents(filters))
    assert len(want) >= 3  # True, 1 and 1.0 are one value to Haystack
    assert sorted(d.id for d in ours.embedding_retrieval([1.0, 0.0], filters=filters, top_k=10)) == want


def test_retriever_component_applies_filter_policy_and_round_trips(store: CareFaissDocumentStore) -> None:
    store.write_documents(_docs())
    retriever = CareFaissEmbeddingRetriever(
        store, filters={"field": "meta.group", "operator": "==", "value": "y"}, top_k=5
    )
    assert [d.id for d in retriever.run(query_embedding=[1.0, 0, 0, 0])["documents"]] == ["b"]
    merged = CareFaissEmbeddingRetriever(
        store, filters={"field": "meta.group", "operator": "==", "value": "x"}, filter_policy="merge"
    )
    runtime = {"field": "meta.n", "operator": ">", "value": 1}
    assert [d.id for d in merged.run(query_embedding=[1.0, 0, 0, 0], filters=runtime)["documents"]] == ["c"]
    clone = CareFaissEmbeddingRetriever.from_dict(merged.to_dict())
    assert clone.to_dict() == merged.to_dict()
    assert clone.document_store.count_documents() == 4


def test_store_persists_in_the_core_folder_format(store: CareFaissDocumentStore, tmp_path: Path) -> None:
    store.write_documents(_docs())
    folder = tmp_path / "store"
    assert sorted(p.name for p in folder.iterdir()) == ["docstore.sqlite", "index.faiss", "manifest.json"]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["count"] == 4 and manifest["dim"] == 4
    reopened = CareFaissDocumentStore(str(folder))
    # against what was written, not against another reader of the same folder
    got = {d.id: d for d in reopened.filter_documents()}
    assert sorted(got) == ["a", "b", "c", "d"]
    for doc in _docs():
        assert (got[doc.id].content, got[doc.id].meta) == (doc.content, doc.meta)
    hits = reopened.embedding_retrieval([0.6, 0.8, 0, 0], top_k=3)
    want = {"a": 0.6, "b": (0.54 + 0.08) / np.hypot(0.9, 0.1), "c": 0.8}
    assert [d.id for d in hits] == sorted(want, key=lambda i: -want[i])
    np.testing.assert_allclose([d.score for d in hits], sorted(want.values(), reverse=True), atol=1e-5)


def test_bad_input_writes_nothing(store: CareFaissDocumentStore, tmp_path: Path) -> None:
    store.write_documents(_docs()[:1])
    before = (tmp_path / "store" / "index.faiss").read_bytes()
    bad = [
        [Document(id="x", content="ok", embedding=[1.0, 0, 0]), Document(id="y", content="ok")],  # wrong dim
        [Document(id="x", content=None, embedding=[1.0, 0, 0, 0])],
        [Document(id="x", content="nan", embedding=[float("nan"), 0, 0, 0])],
        [Document(id="x", content="meta", meta={"obj": object()}, embedding=[1.0, 0, 0, 0])],
    ]
    for documents in bad:
        with pytest.raises(InputError):
            store.write_documents(documents)
    with pytest.raises(DuplicateDocumentError):
        store.write_documents([Document(id="new", content="n", embedding=[0, 0, 1.0, 0]), _docs()[0]])
    assert store.count_documents() == 1
    assert (tmp_path / "store" / "index.faiss").read_bytes() == before
    assert not (tmp_path / ".store.staging").exists()
    with pytest.raises(InputError, match="query_embedding"):
        store.embedding_retrieval([1.0, 0.0], top_k=1)
    with pytest.raises(FilterError):
        store.embedding_retrieval([1.0, 0, 0, 0], filters={"operator": "AND"})


def test_duplicate_policies_inside_one_batch(store: CareFaissDocumentStore) -> None:
    first = Document(id="k", content="first", embedding=[1.0, 0, 0, 0])
    second = Document(id="k", content="second", embedding=[0, 1.0, 0, 0])
    with pytest.raises(DuplicateDocumentError):
        store.write_documents([first, second])
    assert store.write_documents([first, second], policy=DuplicatePolicy.SKIP) == 1
    assert store.filter_documents()[0].content == "first"
    assert store.write_documents([first, second], policy=DuplicatePolicy.OVERWRITE) == 1
    assert store.filter_documents()[0].content == "second"


def test_empty_store_needs_a_dimension_for_documents_without_embeddings(tmp_path: Path) -> None:
    store = CareFaissDocumentStore(str(tmp_path / "s"))
    assert store.filter_documents() == [] and store.embedding_retrieval([1.0], top_k=3) == []
    with pytest.raises(InputError, match="embedding_dim"):
        store.write_documents([Document(content="no vector")])


def test_pending_interrupted_index_run_is_not_overwritten(store: CareFaissDocumentStore, tmp_path: Path) -> None:
    store.write_documents(_docs()[:1])
    staging = tmp_path / ".store.staging"
    staging.mkdir()
    (staging / "manifest.json").write_text("{}")
    with pytest.raises(StoreError, match="interrupted"):
        store.write_documents(_docs()[1:2])
    assert (staging / "manifest.json").exists() and store.count_documents() == 1


def test_a_write_failing_inside_the_store_is_rolled_back(tmp_path: Path) -> None:
    store = CareFaissDocumentStore(str(tmp_path / "ivf"), embedding_dim=4, index_options={"type": "ivf", "nlist": 8})
    with pytest.raises(InputError, match="nlist"):  # raised by the core store, mid-transaction
        store.write_documents(_docs()[:2])
    assert store.count_documents() == 0 and not (tmp_path / ".ivf.staging").exists()
    store.index_options = {"type": "ivf", "nlist": 1}  # the writer lock was released: the next write goes through
    assert store.write_documents(_docs()) == 4
    assert [d.id for d in store.embedding_retrieval([1.0, 0, 0, 0], top_k=2, return_embedding=True)] == ["a", "b"]


def test_refuses_to_write_while_another_writer_holds_the_store(store: CareFaissDocumentStore, tmp_path: Path) -> None:
    from care_retriever.stores.faiss import FaissStore

    store.write_documents(_docs()[:1])
    manifest = json.loads((tmp_path / "store" / "manifest.json").read_text())
    other = FaissStore(tmp_path / "store")
    other.prepare(manifest["dim"], manifest["space_fingerprint"], "")  # e.g. a `care-retriever index` run
    try:
        with pytest.raises(StoreError, match="another writer"):
            store.write_documents(_docs()[1:2])
    finally:
        other.finalize()
    assert store.write_documents(_docs()[1:2]) == 1
