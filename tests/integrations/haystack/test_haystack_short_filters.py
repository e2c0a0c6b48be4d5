"""The Haystack doors take the filter language's short forms (``{"year": 2021}``, ``{"dept": [a, b]}``) as the
core does: they AND a filter with their own bookkeeping condition, which nested a short form where only Haystack's
syntax may stand (a one-line FilterError for a filter the stores take)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("haystack")

from care_retriever.documents import Document
from care_retriever.integrations.haystack import CareFaissDocumentStore, CareStoreRetriever
from care_retriever.stores import open_store
from care_retriever.stores.filters import haystack_form, parse_filters

DIM = 4
DOCS = [
    Document("a", "一", metadata={"year": 2021, "dept": "心内科"}),
    Document("b", "二", metadata={"year": 2019.0, "dept": "内科"}),
    Document("c", "三", metadata={"year": 2021, "dept": "外科"}),
]
SHORT_FORMS = [
    ({"year": 2021}, ["a", "c"]),
    ({"dept": ["内科", "外科"]}, ["b", "c"]),
    ({"year": 2021, "dept": ["外科"]}, ["c"]),
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("haystack") / "store"
    store = open_store(f"faiss:{path}")
    store.prepare(DIM, "fp", "model")
    store.upsert(DOCS, np.eye(len(DOCS), DIM, dtype=np.float32))
    store.finalize()
    store.close()
    return path


@pytest.mark.parametrize(("filters", "expected"), SHORT_FORMS)
def test_haystack_retrievers_take_short_forms(folder, filters: dict, expected: list[str]) -> None:
    retriever = CareStoreRetriever(f"faiss:{folder}")
    found = retriever.run(query_embedding=[1.0] * DIM, filters=filters, top_k=5)["documents"]
    retriever.close()
    assert sorted(d.id for d in found) == expected
    store = CareFaissDocumentStore(str(folder))
    assert sorted(d.id for d in store.embedding_retrieval([1.0] * DIM, filters=filters, top_k=5)) == expected


@pytest.mark.parametrize(("filters", "expected"), SHORT_FORMS)
def test_the_haystack_form_of_a_short_form_means_the_same(filters: dict, expected: list[str]) -> None:
    assert parse_filters(haystack_form(filters)) == parse_filters(filters)
    assert "field" in haystack_form(filters) or haystack_form(filters)["operator"] == "AND"
