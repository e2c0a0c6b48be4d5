"""One metadata filter, one answer, whatever the store: a FAISS store and a Qdrant Edge store holding the same
documents return the same hits for booleans, integers and floats (an integer filter matches a float of the same
value and back, as Python's ``2 == 2.0``; a boolean is not the integer 1) and for stored lists (any element matches,
as in Qdrant: FAISS matched no list). Qdrant Edge's binding reads a Python ``True`` as the integer 1, which matches
no stored boolean, so a boolean filter found nothing there."""

from __future__ import annotations

import numpy as np
import pytest

from care_retriever.documents import Document
from care_retriever.errors import InputError
from care_retriever.stores import open_store

DIM = 8
DOCS = [
    Document("a", "一", metadata={"flag": True, "n": 1, "x": 1.5, "ratio": 2.0}),
    Document("b", "二", metadata={"flag": False, "n": 2, "x": 2.0, "ratio": 3}),
    Document("c", "三", metadata={"flag": True, "n": 1.0, "x": 1, "ratio": 2}),
    Document("d", "四", metadata={"n": 3}),
    Document("e", "五", metadata={"tags": ["高血压", "糖尿病"], "level": 1}),
    Document("f", "六", metadata={"tags": "高血压", "level": True}),
    Document("g", "七", metadata={"tags": {"main": "高血压"}}),  # an object's members are not its values
]
VECTORS = np.eye(len(DOCS), DIM, dtype=np.float32)
CASES = [
    ({"flag": True}, ["a", "c"]),
    ({"flag": False}, ["b"]),
    ({"flag": [True, False]}, ["a", "b", "c"]),
    ({"n": 1}, ["a", "c"]),
    ({"n": 1.0}, ["a", "c"]),
    ({"n": [2, 3]}, ["b", "d"]),
    ({"x": 2}, ["b"]),  # an integer filter, a float stored
    ({"x": 1}, ["c"]),
    ({"x": 1.5}, ["a"]),
    ({"ratio": 2}, ["a", "c"]),
    ({"ratio": [3, 2.0]}, ["a", "b", "c"]),
    ({"flag": True, "n": 1}, ["a", "c"]),
    ({"tags": "高血压"}, ["e", "f"]),  # a list stored: any of its values matches
    ({"tags": "糖尿病"}, ["e"]),
    ({"tags": ["糖尿病", "感冒"]}, ["e"]),
    ({"level": 1}, ["e"]),  # an integer is not a boolean, nor a boolean an integer
    ({"level": True}, ["f"]),
    ({"flag": 1}, []),
    ({"n": True}, []),
]


@pytest.fixture(scope="module", params=["faiss", "qdrant"])
def store(request, tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp(request.param) / "store"
    opened = open_store(f"{request.param}:{folder}")
    opened.prepare(DIM, "fp", "model")
    opened.upsert(DOCS, VECTORS)
    opened.finalize()
    yield opened
    opened.close()


@pytest.mark.parametrize(("filters", "expected"), CASES, ids=[str(f) for f, _ in CASES])
def test_a_filter_finds_the_same_documents_in_every_store(store, filters: dict, expected: list[str]) -> None:
    hits = store.search(np.ones((1, DIM), dtype=np.float32), top_k=10, filters=filters)[0]
    assert sorted(h.id for h in hits) == expected
    assert store.count(filters) == len(expected)


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, [1, 2**64]])
def test_an_integer_no_store_can_hold_is_refused_in_one_line(store, value: object) -> None:
    # SQLite and Qdrant keep 64-bit integers: past them FAISS's filter raised OverflowError and Qdrant Edge's
    # binding a TypeError of several lines
    with pytest.raises(InputError, match=r"^filter 'n': integers must be within 64 bits"):
        store.search(np.ones((1, DIM), dtype=np.float32), top_k=10, filters={"n": value})
    with pytest.raises(InputError, match=r"^filter 'n': integers must be within 64 bits"):
        store.count({"n": value})
