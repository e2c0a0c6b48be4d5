"""A filtered FAISS search selects its rows through per-field SQLite indexes held in the docstore connection's
temp schema: SQLite's plan reads the index, the rows equal the reference evaluator's for every kind of comparison,
a write (on the connection or from another) is read into the indexes, and the store's file is never changed by them, so
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
    {"operator": "NOT", "conditions": [{"field": "meta.v", "operator": ">=", "value": "2021-03-01T00:00:00Z"}]},
    {  # not both
        "operator": "NOT",
        "conditions": [
            {"field": "meta.v", "operator": ">", "value": 0},
            {"field": "meta.src.kind", "operator": "!=", "value": "a"},
        ],
    },
    {"operator": "NOT", "conditions": [{"field": "meta.v", "operator": "in", "value": ["a", 1]}]},
    {
        "operator": "NOT",
        "conditions": [{"field": "meta.v", "operator": "==", "value": None}],
    },  # a missing field: every row read
    {  # the AND's index rows are more than its matches (== None has none): the NOT reads every row
        "operator": "NOT",
        "conditions": [
            {
                "operator": "AND",
                "conditions": [
                    {"field": "meta.v", "operator": ">", "value": 1},
                    {"field": "meta.src.kind", "operator": "==", "value": None},
                ],
            }
        ],
    },
    {
        "operator": "OR",
        "conditions": [
            {"operator": "NOT", "conditions": [{"field": "meta.v", "operator": "in", "value": ["a", "b", 1]}]},
            {"field": "meta.src.kind", "operator": "==", "value": True},
        ],
    },
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


@pytest.mark.parametrize(
    "filters",
    [FILTERS[9], FILTERS[5], BOTH, FILTERS[16], FILTERS[18], FILTERS[19], FILTERS[23]],
    ids=["<", "in", "AND", "OR", "NOT date", "NOT AND", "OR NOT"],
)
def test_the_plan_reads_the_field_indexes_and_no_document(db: sqlite3.Connection, filters: dict) -> None:
    plan = FieldIndexes(db).plan(parse_filters(filters))
    assert any("USING INDEX care_field_" in step for step in plan), plan
    # a NOT lists the row ids (the primary key's smallest index), no document is read
    assert all("documents" not in step or "COVERING INDEX" in step for step in plan), plan


def _temp_tables(db: sqlite3.Connection) -> list[str]:
    return sorted(n for (n,) in db.execute("SELECT name FROM sqlite_temp_master WHERE type = 'table'"))


def test_a_write_is_read_into_the_indexes_not_rebuilt(db: sqlite3.Connection, tmp_path: Path) -> None:
    indexes, node = FieldIndexes(db), parse_filters({"v": "new"})
    dated = parse_filters({"field": "meta.v", "operator": ">=", "value": "2021-03-01T00:00:00Z"})
    assert indexes.select(node).tolist() == [] and indexes.select(dated).tolist() == [8, 25, 40, 41]
    tables = _temp_tables(db)
    docstore.insert(db, [1000], [Document("own", "x", metadata={"v": "new"})])  # this connection's write
    db.commit()
    assert indexes.select(node).tolist() == [1000]
    other = docstore.connect(tmp_path / "docstore.sqlite")  # another connection's commit
    docstore.insert(other, [1001], [Document("other", "x", metadata={"v": ["new", "2022-01-01"]})])
    docstore.delete_rows(other, [8])
    other.commit()
    other.close()
    assert indexes.select(node).tolist() == [1000, 1001]
    assert indexes.select(dated).tolist() == [25, 40, 41, 1001]  # the new row's date has its instant; row 8 is gone
    assert _temp_tables(db) == tables  # the same tables, brought up to date
    docstore.insert(db, [999], [Document("below", "x", metadata={"v": "new"})])  # under a row id already read:
    db.commit()  # not how a store numbers rows, so the indexes are read again from the start
    assert indexes.select(node).tolist() == [999, 1000, 1001]


VALUES = ["a", "b", 1, 2.5, True, "2021-03-01", "2021-03-01T08:00:00+08:00", "2020-12-31T23:59:59.5Z", ["a", 2]]
MIXED = [
    {"v": "a"},
    {"v": [1, True]},
    {"field": "meta.v", "operator": ">", "value": 1},
    {"field": "meta.v", "operator": ">=", "value": "2021-03-01T00:00:00Z"},
    {"field": "meta.v", "operator": "<", "value": "2021-01-01"},
    {"field": "meta.w", "operator": "==", "value": 2},
]


@pytest.mark.parametrize("seed", range(4))
def test_indexes_kept_up_to_date_through_writes_and_deletes_answer_as_the_reference(tmp_path: Path, seed: int) -> None:
    """Random adds (above every row id, as a store numbers them) and deletes, on the filtering connection or
    another one, then every filter: the rows equal the reference evaluator's on the documents stored then."""
    rng = np.random.default_rng(seed)
    path = tmp_path / "docstore.sqlite"
    db, other = docstore.connect(path), docstore.connect(path)
    stored: dict[int, Document] = {}
    indexes = FieldIndexes(db)
    next_row = 0
    for _ in range(12):
        writer = db if rng.random() < 0.5 else other
        added = [
            Document(
                f"d{next_row + k}", "x", metadata={"v": VALUES[rng.integers(len(VALUES))], "w": int(rng.integers(3))}
            )
            for k in range(int(rng.integers(0, 6)))
        ]
        docstore.insert(writer, list(range(next_row, next_row + len(added))), added)
        stored.update(zip(range(next_row, next_row + len(added)), added, strict=True))
        next_row += len(added)
        gone = [r for r in stored if rng.random() < 0.15]
        docstore.delete_rows(writer, gone)
        for r in gone:
            del stored[r]
        writer.commit()
        for filters in MIXED:
            node = parse_filters(filters)
            want = [r for r, d in sorted(stored.items()) if matches(node, d.metadata)]
            assert indexes.select(node).tolist() == want, filters
    db.close()
    other.close()


def test_a_store_filters_right_after_small_writes_in_place(tmp_path: Path) -> None:
    """Filters between in-place writes (new documents, deletes, a document written again with other metadata):
    each count and filtered search equals the reference evaluator on the documents stored then."""
    docs = {d.id: d for d in _documents()}
    store = open_store(f"faiss:{tmp_path / 's'}")
    store.prepare(DIM, "fp", "model")
    rng = np.random.default_rng(1)

    def unit(n: int) -> np.ndarray:
        v = rng.normal(size=(n, DIM)).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    store.upsert(list(docs.values()), unit(len(docs)))
    store.finalize()
    query = np.ones((1, DIM), dtype=np.float32)
    for step in range(4):
        for filters in FILTERS:
            node = parse_filters(filters)
            want = sorted(i for i, d in docs.items() if matches(node, d.metadata))
            assert store.count(filters) == len(want), (step, filters)
            assert sorted(h.id for h in store.search(query, 100, filters)[0]) == want, (step, filters)
        if step == 3:  # the last writes have been checked
            break
        written = [Document(f"n{step}-{k}", "x", metadata={"v": KINDS[(step * 5 + k) % len(KINDS)]}) for k in range(4)]
        written.append(Document("d0", "x", metadata={"v": ["a", "2022-01-01"], "src": {"kind": step}}))  # again
        gone = [f"d{3 * step + 1}", f"d{3 * step + 2}"]
        with store.transaction() as tx:
            tx.upsert(written, unit(len(written)))
            tx.delete(gone)
        docs.update({d.id: d for d in written})
        for i in gone:
            del docs[i]
    store.close()


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
