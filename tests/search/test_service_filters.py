"""The service's answer to a filter it refuses is the stores' one line, quoted as they wrote it: a message quoting
a dict keeps its single braces (it was escaped for a template no one formats, so ``{{`` reached the client); a
value no engine can match (a lone surrogate) is 422, not a 500 from deep in the store."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient

from care_retriever.documents import Document
from care_retriever.search.retriever import CareRetriever
from care_retriever.search.server import create_app
from care_retriever.stores import open_store


@pytest.fixture(scope="module")
def client(embedder, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    store = open_store(f"faiss:{tmp_path_factory.mktemp('service') / 'store'}")
    store.prepare(embedder.dim, embedder.space_fingerprint, "tiny")
    documents = [Document("a", "高血压", metadata={"year": 2021}), Document("b", "感冒", metadata={"year": 2019})]
    store.upsert(documents, np.eye(2, embedder.dim, dtype=np.float32))
    store.finalize()
    with TestClient(create_app(CareRetriever(store, embedder))) as opened:
        yield opened
    store.close()


def _search(client: TestClient, filters: object) -> tuple[int, dict]:
    # ensure_ascii: a lone surrogate travels as the JSON escape \ud800, which JSON allows
    body = json.dumps({"query": "血压高", "top_k": 2, "filters": filters})
    response = client.post("/search", content=body, headers={"content-type": "application/json"})
    return response.status_code, response.json()


def test_a_refused_filter_quoting_a_dict_keeps_single_braces(client) -> None:
    condition = {"field": "meta.year", "operator": "==", "value": 1, "extra": 2}
    status, body = _search(client, {"operator": "AND", "conditions": [condition]})
    assert status == 422
    assert body["error"] == f"filters: filter condition {condition!r}: unknown keys ['extra']"


def test_a_filter_value_that_is_no_text_is_one_line(client) -> None:
    status, body = _search(client, {"field": "meta.year", "operator": "in", "value": [2021, "\ud800"]})
    assert (status, body["error"]) == (
        422,
        "filters: filter 'meta.year': the value is not valid Unicode (lone surrogate at character 0)",
    )


def test_a_filter_the_stores_take_answers(client) -> None:
    status, body = _search(client, {"field": "meta.year", "operator": ">=", "value": 2020})
    assert status == 200 and [h["id"] for h in body["results"][0]["hits"]] == ["a"]
