"""A date range on a Qdrant Edge field that holds numbers and date strings across documents finds the date strings,
as on FAISS and as the reference evaluator says: the field's first value made its payload index numeric, and a
numeric index answers a date range from its numbers alone (0 hits where the reference counts the date strings)."""

from __future__ import annotations

import numpy as np
import pytest

from care_retriever.documents import Document
from care_retriever.stores import open_store
from care_retriever.stores.filter_matching import matches
from care_retriever.stores.filters import parse_filters

pytest.importorskip("qdrant_edge")

DIM = 8
# written in this order, one upsert each: the number first, so the field is first indexed as a number
WRITES = [
    [Document("n", "数", metadata={"s": 1, "l": [2.5, "a"]})],
    [Document("d", "日", metadata={"s": "2021-02-28T23:00:00-02:00", "l": ["a", "2021-03-01"]})],
    [
        Document("z", "区", metadata={"s": "1999-12-31T23:59:59Z", "l": "2000-01-01"}),
        Document("w", "字", metadata={"s": "a"}),
    ],
]
BOUNDS = ["2021-03-01", "2021-02-28T23:00:00-02:00", "2000-01-01T00:00:00+08:00"]
FILTERS = [
    {"field": f"meta.{field}", "operator": operator, "value": bound}
    for field in ("s", "l")
    for operator in (">", ">=", "<", "<=")
    for bound in BOUNDS
] + [{"field": "meta.s", "operator": ">=", "value": 0}, {"field": "meta.l", "operator": "<", "value": 3}]


@pytest.fixture(scope="module")
def edge_store(tmp_path_factory: pytest.TempPathFactory):
    store = open_store(f"qdrant:{tmp_path_factory.mktemp('edge') / 'store'}")
    store.prepare(DIM, "fp", "model")
    for i, documents in enumerate(WRITES):
        store.upsert(documents, np.eye(len(documents), DIM, k=i, dtype=np.float32))
        store.commit()
    yield store
    store.close()


@pytest.mark.parametrize("filters", FILTERS, ids=lambda f: f"{f['field']}{f['operator']}{f['value']}")
def test_a_date_range_on_a_field_of_mixed_types_gives_the_reference_answer(edge_store, filters: dict) -> None:
    documents = [d for batch in WRITES for d in batch]
    expected = sorted(d.id for d in documents if matches(parse_filters(filters), d.metadata))
    found = sorted(h.id for h in edge_store.search(np.ones((1, DIM), np.float32), 10, filters)[0])
    assert (edge_store.count(filters), found) == (len(expected), expected)


def test_the_reference_counts_date_strings_here(edge_store) -> None:
    """The cases above are not all empty answers: the date strings of the field do match."""
    assert edge_store.count({"field": "meta.s", "operator": "<=", "value": "2021-02-28T23:00:00-02:00"}) == 2
    assert edge_store.count({"field": "meta.l", "operator": ">=", "value": "2000-01-01"}) == 2
