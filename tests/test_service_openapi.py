"""The service publishes its request format: the OpenAPI schema at /openapi.json and its page at /docs (behind
the bearer token when one is set; both off with ``api_docs=False`` / ``serve --no-api-docs``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient

from care_retriever.search.server import ServiceLimits, create_app

TOKEN = "care-token-0a9f3c2e"


@pytest.fixture(scope="module")
def retriever(tiny_model_dir: Path, small_corpus_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    from care_retriever import AsymmetricEmbedder, CareRetriever, DocumentStoreWriter, read_corpus

    spec = f"faiss:{tmp_path_factory.mktemp('openapi') / 'store'}"
    embedder = AsymmetricEmbedder.from_pretrained(tiny_model_dir, load="document")
    DocumentStoreWriter(embedder, spec, show_progress=False).write(read_corpus(small_corpus_path))
    found = CareRetriever.from_pretrained(str(tiny_model_dir), spec, backend="torch")
    yield found
    found.close()


def test_the_schema_describes_search_with_the_limits(retriever) -> None:
    with TestClient(create_app(retriever, ServiceLimits(max_top_k=7))) as client:
        schema = client.get("/openapi.json")
        assert schema.status_code == 200
        paths = schema.json()["paths"]
        assert {"/search", "/health", "/metrics"} <= set(paths)
        body = schema.json()["components"]["schemas"]["SearchRequest"]["properties"]
        assert {"query", "top_k", "filters", "mode"} <= set(body)
        assert body["top_k"]["maximum"] == 7  # the served limits, not a docstring
        page = client.get("/docs")
        assert page.status_code == 200 and "/openapi.json" in page.text and "swagger" in page.text.lower()
        health = client.get("/health").json()
        assert health["similarity"] == "cosine"  # what the scores are, from the store's manifest


def test_the_token_guards_the_schema_and_the_page(retriever) -> None:
    with TestClient(create_app(retriever, api_token=TOKEN)) as client:
        for path in ("/openapi.json", "/docs"):
            assert client.get(path).status_code == 401
            assert client.get(path, headers={"authorization": f"Bearer {TOKEN}x"}).status_code == 401
            assert client.get(path, headers={"authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_switched_off_there_is_no_schema(retriever) -> None:
    with TestClient(create_app(retriever, api_docs=False)) as client:
        assert client.get("/openapi.json").status_code == 404
        assert client.get("/docs").status_code == 404
        assert client.post("/search", json={"query": "感冒", "top_k": 2}).status_code == 200
