"""Filter values as a hostile user writes them give one line or the reference's answer on every engine, never a
traceback: a string holding a lone surrogate (no engine's query can hold it), a date whose instant in UTC falls
before year 1 or after 9999, and a date in year 1 (FAISS wrote the bound's year unpadded, "1-01-01")."""

from __future__ import annotations

import numpy as np
import pytest

from care_retriever.documents import Document
from care_retriever.errors import InputError
from care_retriever.stores import open_store
from care_retriever.stores.filter_matching import matches
from care_retriever.stores.filters import parse_filters

DIM = 4
DOCS = [
    Document("first", "一", metadata={"d": "0001-01-01", "s": "a"}),
    Document("last", "二", metadata={"d": "9999-12-31T23:59:59Z", "s": "b"}),
    Document("now", "三", metadata={"d": "2021-03-01T08:00:00+08:00"}),
]


@pytest.fixture(scope="module", params=["faiss", "qdrant"])
def store(request, tmp_path_factory: pytest.TempPathFactory):
    pytest.importorskip("qdrant_edge" if request.param == "qdrant" else "faiss")
    opened = open_store(f"{request.param}:{tmp_path_factory.mktemp(request.param) / 'store'}")
    opened.prepare(DIM, "fp", "model")
    opened.upsert(DOCS, np.eye(len(DOCS), DIM, dtype=np.float32))
    opened.finalize()
    yield opened
    opened.close()


@pytest.mark.parametrize(
    ("filters", "message"),
    [
        ({"s": "\ud800"}, "filter 's': the value is not valid Unicode (lone surrogate at character 0)"),
        (
            {"field": "meta.s", "operator": "in", "value": ["a", "x\udfff"]},
            "filter 'meta.s': the value is not valid Unicode (lone surrogate at character 1)",
        ),
        ({"field": "meta.d", "operator": ">", "value": "0001-01-01T00:00:00+08:00"}, "filter 'meta.d': '>' compares"),
        ({"field": "meta.d", "operator": "<=", "value": "9999-12-31T23:59:59-08:00"}, "filter 'meta.d': '<=' compares"),
    ],
)
def test_a_value_no_engine_can_compare_is_one_line(store, filters: dict, message: str) -> None:
    for call in (lambda: store.count(filters), lambda: store.search(np.ones((1, DIM), np.float32), 3, filters)):
        with pytest.raises(InputError) as raised:
            call()
        assert str(raised.value).startswith(message) and "\n" not in str(raised.value)
        assert "compares" not in message or str(raised.value).endswith("within years 1 to 9999 in UTC)")


@pytest.mark.parametrize("operator", [">", ">=", "<", "<="])
@pytest.mark.parametrize("bound", ["0001-01-01", "0001-01-01T00:00:00.001Z", "9999-12-31T23:59:59Z"])
def test_dates_at_the_ends_of_the_calendar_give_the_reference_answer(store, operator: str, bound: str) -> None:
    filters = {"field": "meta.d", "operator": operator, "value": bound}
    expected = sorted(d.id for d in DOCS if matches(parse_filters(filters), d.metadata))
    assert sorted(h.id for h in store.search(np.ones((1, DIM), np.float32), 5, filters)[0]) == expected
