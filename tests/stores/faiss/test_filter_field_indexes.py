"""A filtered FAISS search selects its rows through per-field SQLite indexes held in the docstore connection's
temp schema: SQLite's plan reads the index, the rows equal the reference evaluator's for every kind of comparison,
a write (on the connection or from another) drops the indexes, and the store's file is never changed by them, so
verify stays green and a store on a read-only file system filters the same."""

from __future__ import annotations

import hashlib
import math
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from care_retriever.documents import Document
from care_retriever.stores import open_store
from care_retriever.stores.config import FaissIndexConfig
from care_retriever.stores.faiss import docstore, filter_plan, index_factory
from care_retriever.stores.faiss.field_index import FieldIndexes
from care_retriever.stores.faiss.filter_plan import Plan
from care_retriever.stores.faiss.index_factory import BITMAP_ROWS
from care_retriever.stores.filter_matching import matches
from care_retriever.stores.filters import parse_filters

DIM = 8
KINDS = [
    1,
    2.0,
    2.5,
    -3,
    True,
    False,
    "a",
    "b",
    "2021-03-01",
    "2021-03-01T08:00:00+08:00",
    None,
    [1, "a"],
    [2.5, True],
    ["b", "c"],
    [],
    {"x": 1},
]


def _documents() -> list[Document]:
    docs = []
    for i in range(3 * len(KINDS)):
        meta: dict[str, object] = {"v": KINDS[i % len(KINDS)], "src": {"kind": KINDS[(i * 7) % len(KINDS)]}}
        if i % 5 == 4:
            del meta["v"]  # a missing field
        docs.append(Document(f"d{i}", "x", metadata=meta))
    return docs


FILTERS = [
    {"v": 1},
    {"v": 2},
    {"v": "a"},
    {"v": True},
    {"v": False},
    {"v": ["b", 2.5, False]},
    {"v": None},
    {"field": "meta.v", "operator": "!=", "value": "a"},
    {"field": "meta.v", "operator": "not in", "value": [1, "b"]},
    {"field": "meta.v", "operator": ">", "value": 1},
    {"field": "meta.v", "operator": "<=", "value": 2},
    {"field": "meta.v", "operator": ">=", "value": "2021-01-01"},
    {"field": "meta.src.kind", "operator": "==", "value": "b"},
    {"field": "meta.src.kind", "operator": "<", "value": 2.5},
    {"field": "meta.x", "operator": "==", "value": 1},  # a member of an object is no value of the field
    {
        "operator": "AND",
        "conditions": [
            {"field": "meta.v", "operator": ">=", "value": -3},
            {"field": "meta.src.kind", "operator": "!=", "value": 1},
        ],
    },
    {
        "operator": "OR",
        "conditions": [
            {"field": "meta.v", "operator": "==", "value": "c"},
            {"field": "meta.src.kind", "operator": "in", "value": [True, "a"]},
        ],
    },
    {"operator": "NOT", "conditions": [{"field": "meta.v", "operator": "<", "value": 2}]},
]


BOTH = {"operator": "AND", "conditions": [FILTERS[9], FILTERS[12]]}


@pytest.fixture
def db(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    connection = docstore.connect(tmp_path / "docstore.sqlite")
    docs = _documents()
    docstore.insert(connection, list(range(len(docs))), docs)
    connection.commit()
    yield connection
    connection.close()


def _reference(node: object, docs: list[Document]) -> list[int]:
    return [i for i, d in enumerate(docs) if matches(node, d.metadata)]  # type: ignore[arg-type]


@pytest.mark.parametrize("filters", [*FILTERS, BOTH], ids=[str(i) for i in range(len(FILTERS) + 1)])
def test_the_selection_equals_the_reference_evaluator(db: sqlite3.Connection, filters: dict) -> None:
    node = parse_filters(filters)
    assert FieldIndexes(db).select(node).tolist() == _reference(node, _documents())


@pytest.mark.parametrize("filters", [FILTERS[9], FILTERS[5], BOTH, FILTERS[16]], ids=["<", "in", "AND", "OR"])
def test_the_plan_reads_the_field_indexes_and_no_document(db: sqlite3.Connection, filters: dict) -> None:
    plan = FieldIndexes(db).plan(parse_filters(filters))
    assert any("USING INDEX care_field_" in step for step in plan), plan
    assert not any("documents" in step for step in plan), plan


def test_a_write_drops_the_indexes(db: sqlite3.Connection, tmp_path: Path) -> None:
    indexes, node = FieldIndexes(db), parse_filters({"v": "new"})
    assert indexes.select(node).tolist() == []
    docstore.insert(db, [1000], [Document("own", "x", metadata={"v": "new"})])  # this connection's write
    db.commit()
    assert indexes.select(node).tolist() == [1000]
    other = docstore.connect(tmp_path / "docstore.sqlite")  # another connection's commit
    docstore.insert(other, [1001], [Document("other", "x", metadata={"v": ["new"]})])
    other.commit()
    other.close()
    assert indexes.select(node).tolist() == [1000, 1001]


def _store(folder: Path) -> list[Document]:
    docs = _documents()
    store = open_store(f"faiss:{folder}")
    store.prepare(DIM, "fp", "model")
    vectors = np.random.default_rng(0).normal(size=(len(docs), DIM)).astype(np.float32)
    store.upsert(docs, vectors / np.linalg.norm(vectors, axis=1, keepdims=True))
    store.finalize()
    store.close()
    return docs


def _filtered_ids(folder: Path) -> list[list[str]]:
    store = open_store(f"faiss:{folder}")
    try:
        query = np.ones((1, DIM), dtype=np.float32)
        return [sorted(h.id for h in store.search(query, 100, f)[0]) for f in FILTERS]
    finally:
        store.close()


def test_filtering_changes_no_file_of_the_store_and_verify_stays_green(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    docs = _store(folder)
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir() if p.is_file()}
    found = _filtered_ids(folder)
    assert found == [sorted(docs[i].id for i in _reference(parse_filters(f), docs)) for f in FILTERS]
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir() if p.is_file()} == before
    store = open_store(f"faiss:{folder}")
    store.search(np.ones((1, DIM), dtype=np.float32), 5, {"v": 1})  # indexes held by the open connection
    assert store.verify() == len(docs)
    store.close()


def test_a_store_on_a_read_only_file_system_filters(tmp_path: Path) -> None:
    where = tmp_path / "ro"
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root, or no mount permission)")
    try:
        _store(where / "store")
        writable = _filtered_ids(where / "store")
        subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)
        assert _filtered_ids(where / "store") == writable
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.mark.parametrize("quantize", [None, "sq8"])
def test_a_large_selection_searches_through_the_id_bitmap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, quantize: str | None
) -> None:
    monkeypatch.setattr(index_factory, "EXACT_SCAN_ROWS", 0)  # every filter through the index's id selector
    monkeypatch.setattr(filter_plan, "CANDIDATE_COST", math.inf)  # never an unfiltered search widened instead
    rng = np.random.default_rng(1)
    n = BITMAP_ROWS + 2000
    vectors = rng.normal(size=(n, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    store = open_store(f"faiss:{tmp_path / 's'}")
    store.prepare(DIM, "fp", "model", FaissIndexConfig(quantize=quantize))
    store.upsert([Document(f"d{i}", "x", metadata={"b": i % 7}) for i in range(n)], vectors)
    store.finalize()
    queries = vectors[:5]
    allowed = np.flatnonzero(np.arange(n) % 7 != 3)  # BITMAP_ROWS or more rows, the ids past the first byte
    assert len(allowed) >= BITMAP_ROWS
    filters = {"field": "meta.b", "operator": "!=", "value": 3}
    assert store.filter_plan(filters, 10) is Plan.SELECTOR
    found = store.search(queries, 10, filters)
    for query, hits in zip(queries, found, strict=True):
        best = allowed[np.argsort(-(vectors[allowed] @ query), kind="stable")[:10]]
        assert {h.id for h in hits} <= {f"d{i}" for i in allowed}
        if quantize is None:
            assert [h.id for h in hits] == [f"d{i}" for i in best]
    store.close()


def test_a_filtered_hnsw_graph_search_widens_with_the_filter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index_factory, "EXACT_SCAN_ROWS", 0)  # no floor: the rows above the crossover use the graph
    monkeypatch.setattr(filter_plan, "HNSW_CANDIDATE_COST", math.inf)  # the graph search under the id selector
    rng = np.random.default_rng(2)
    n, dim = 3000, 16
    vectors = rng.normal(size=(n, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    store = open_store(f"faiss:{tmp_path / 's'}")
    store.prepare(dim, "fp", "model", FaissIndexConfig(index_type="hnsw", m=8, ef_construction=40, ef_search=16))
    store.upsert([Document(f"d{i}", "x", metadata={"b": i % 25}) for i in range(n)], vectors)
    store.finalize()
    allowed = np.flatnonzero(np.arange(n) % 25 < 7)  # 28% of the rows: above sqrt(16 x 8 x 3000) = 619
    queries = rng.normal(size=(40, dim)).astype(np.float32)
    filters = {"field": "meta.b", "operator": "<", "value": 7}
    assert store.filter_plan(filters, 10) is Plan.SELECTOR
    found = store.search(queries, 10, filters)
    recall = np.mean(
        [
            len({h.id for h in hits} & {f"d{i}" for i in allowed[np.argsort(-(vectors[allowed] @ q))[:10]]}) / 10
            for q, hits in zip(queries, found, strict=True)
        ]
    )
    assert recall >= 0.9, recall
    store.close()
