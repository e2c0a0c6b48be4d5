"""Dates as filters compare them: the spellings of the filter language (a date, a time to the minute, second or
microsecond, a zone after the seconds) are the same instant on every engine, to the microsecond; FAISS reads no
other spelling as a date (it gives the reference's answer for every stored string); a FAISS date range reads the
field's index rather than every row."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from care_retriever.documents import Document
from care_retriever.stores import open_store
from care_retriever.stores.faiss import docstore
from care_retriever.stores.faiss.field_index import FieldIndexes
from care_retriever.stores.filter_matching import matches
from care_retriever.stores.filters import parse_date, parse_filters

DIM = 4
# the filter language's spellings, a microsecond apart where it matters
CANONICAL = [
    "2021-03-01",
    "2021-03-01T08:00",
    "2021-03-01 08:00:00",
    "2021-03-01T08:00:00.0004Z",
    "2021-03-01T08:00:00.0005Z",
    "2021-03-01T16:00:00.000401+08:00",
    "2021-03-01T03:00:00.5-05:00",
]
# spellings outside the language: no engine must read them as these instants (Qdrant reads some of them)
OTHER = ["2021-3-1", "2021-03-01T08:00:00+0800", "2021-03-01T08:00:00z", "2021-03-01T24:00:00", "20210301"]
BOUNDS = ["2021-03-01T08:00:00.0004Z", "2021-03-01T08:00:00.000401Z", "2021-03-01 08:00", "2021-03-01T08:00:00.5Z"]
VECTORS = np.eye(len(CANONICAL) + len(OTHER), DIM, dtype=np.float32) + 0.01


def _documents(spellings: list[str]) -> list[Document]:
    return [
        Document(f"d{i}", f"文本{i}", metadata={"d": s, "l": [s, 1] if i % 2 else [s]}) for i, s in enumerate(spellings)
    ]


@pytest.fixture(scope="module", params=["faiss", "qdrant"])
def store(request, tmp_path_factory: pytest.TempPathFactory):
    pytest.importorskip("qdrant_edge" if request.param == "qdrant" else "faiss")
    opened = open_store(f"{request.param}:{tmp_path_factory.mktemp(request.param) / 'store'}")
    opened.prepare(DIM, "fp", "model")
    opened.upsert(_documents(CANONICAL), VECTORS[: len(CANONICAL)])
    opened.finalize()
    yield opened
    opened.close()


def _reference(documents: list[Document], filters: dict) -> list[str]:
    return sorted(d.id for d in documents if matches(parse_filters(filters), d.metadata))


@pytest.mark.parametrize("field", ["meta.d", "meta.l"])
@pytest.mark.parametrize("operator", [">", ">=", "<", "<="])
@pytest.mark.parametrize("bound", BOUNDS)
def test_every_engine_orders_the_languages_spellings_to_the_microsecond(
    store, field: str, operator: str, bound: str
) -> None:
    filters = {"field": field, "operator": operator, "value": bound}
    expected = _reference(_documents(CANONICAL), filters)
    assert sorted(h.id for h in store.search(np.ones((1, DIM), np.float32), 20, filters)[0]) == expected
    assert store.count(filters) == len(expected)


def test_faiss_reads_no_other_spelling_as_a_date(tmp_path: Path) -> None:
    documents = _documents(CANONICAL + OTHER)
    store = open_store(f"faiss:{tmp_path / 's'}")
    store.prepare(DIM, "fp", "model")
    store.upsert(documents, VECTORS)
    store.finalize()
    for bound in BOUNDS:
        for operator in (">", "<="):
            filters = {"field": "meta.d", "operator": operator, "value": bound}
            found = sorted(h.id for h in store.search(np.ones((1, DIM), np.float32), 20, filters)[0])
            assert found == _reference(documents, filters), filters
            assert not {f"d{len(CANONICAL) + i}" for i in range(len(OTHER))} & set(found)
    store.close()


def test_a_zone_only_after_the_seconds_and_ascii_digits_only() -> None:
    assert parse_date("2021-03-01T08:00:00+08:00") is not None and parse_date("2021-03-01T08:00") is not None
    for spelling in ["2021-03-01+08:00", "2021-03-01Z", "2021-03-01T08:00Z", "٢٠٢١-٠٣-٠١", "2021-03-01\n"]:
        assert parse_date(spelling) is None, spelling


def test_a_faiss_date_range_reads_the_fields_index(tmp_path: Path) -> None:
    db = docstore.connect(tmp_path / "docstore.sqlite")
    documents = [*_documents(CANONICAL + OTHER), Document("n", "数", metadata={"d": 5, "l": [5]})]
    for row, document in enumerate(documents):
        db.execute(
            "INSERT INTO documents (row_id, id, text, metadata, content_hash) VALUES (?, ?, ?, ?, '')",
            (row, document.id, document.text, json.dumps(document.metadata)),
        )
    db.commit()
    indexes = FieldIndexes(db)
    for field in ("meta.d", "meta.l"):
        node = parse_filters({"field": field, "operator": ">=", "value": "2021-03-01T08:00:00.0004Z"})
        plan = " ".join(indexes.plan(node))
        assert "_instant" in plan and "SCAN documents" not in plan, plan
        expected = [i for i, d in enumerate(documents) if matches(node, d.metadata)]
        assert indexes.select(node).tolist() == expected
    db.close()
