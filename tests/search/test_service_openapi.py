"""The service publishes its request format: the OpenAPI schema at /openapi.json and its page at /docs (behind
the bearer token when one is set; both off with ``api_docs=False`` / ``serve --no-api-docs``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
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


# ------------------------------------------------------------------------------------- the schema against the bodies
def _declared(schema: dict, path: str, method: str, status: int) -> dict:
    """The schema ``/openapi.json`` declares for ``status`` of ``method path`` (a JSON body), or a failed test."""
    responses = schema["paths"][path][method]["responses"]
    assert str(status) in responses, f"{method.upper()} {path} answers {status}, which its schema does not declare"
    return responses[str(status)]["content"]["application/json"]["schema"]


def _check(schema: dict, declared: dict, body: object) -> None:
    """``body`` validated against ``declared`` (a $ref into the schema's components), with jsonschema."""
    import jsonschema

    jsonschema.Draft202012Validator({**declared, "components": schema["components"]}).validate(body)


async def _answers(app, token: str | None) -> list[tuple[str, str, httpx.Response]]:
    """One request for each way the service answers, through the ASGI app (no socket)."""
    good = {"authorization": f"Bearer {token}"} if token else {}
    json_headers = {**good, "content-type": "application/json"}

    async def slow_body() -> AsyncIterator[bytes]:
        yield b'{"query": '
        await asyncio.sleep(0.5)
        yield b'"x"}'

    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    out: list[tuple[str, str, httpx.Response]] = []
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:

        async def post(body: bytes | AsyncIterator[bytes], headers: dict | None = None) -> None:
            out.append(("/search", "post", await client.post("/search", content=body, headers=headers or json_headers)))

        for body in (
            '{"query": "感冒", "top_k": 2}'.encode(),  # 200
            b"{query: ",  # 400: not JSON
            b"",  # 400: empty
            b'{"query": "\xff\xfe"}',  # 400: not UTF-8
            b"[" * 2000 + b"]" * 2000,  # 400: too deep
            b"[1, 2]",  # 422: not an object
            b'{"query": []}',  # 422 ...
            b'{"query": "   "}',
            b'{"query": "a", "top_k": 99}',
            b'{"query": "a", "filters": {"a b": 1}}',
            b'{"query": "a", "filters": {"a": NaN}}',
            b'{"query": "a", "extra": 1}',
            b'{"query": "' + b"a" * 5000 + b'"}',  # 413
        ):
            await post(body)
        await post(slow_body())  # 408
        for path in ("/health", "/metrics"):
            out.append((path, "get", await client.get(path, headers=good)))
        if token:
            out.append(("/search", "post", await client.post("/search", json={"query": "a"})))  # 401
            out.append(("/health", "get", await client.get("/health")))
        crowd = [client.post("/search", json={"query": f"感冒{i}", "top_k": 1}, headers=good) for i in range(24)]
        out.extend(("/search", "post", r) for r in await asyncio.gather(*crowd))  # 200s and 503s
    return out


def test_every_body_the_service_answers_is_the_one_its_schema_declares(retriever, monkeypatch) -> None:
    limits = ServiceLimits(max_body_bytes=2048, body_timeout_s=0.2, max_queries=2, max_batch_size=1, max_queue=2)
    seen: set[tuple[str, int]] = set()
    for token in (None, TOKEN):
        app = create_app(retriever, limits, api_token=token)
        with TestClient(app) as client:
            schema = client.get("/openapi.json", headers={"authorization": f"Bearer {TOKEN}"} if token else {}).json()
        assert "HTTPValidationError" not in schema["components"]["schemas"]  # FastAPI's {"detail": [...]} is gone
        for path, method, response in asyncio.run(_answers(app, token)):
            if path == "/metrics" and response.status_code == 200:
                assert response.headers["content-type"].startswith("text/plain")
                continue
            _check(schema, _declared(schema, path, method, response.status_code), response.json())
            seen.add((path, response.status_code))
        # a bug: 500 with the same body (a store that breaks, as a failing disk would make it)
        monkeypatch.setattr(retriever.store, "count", lambda *a, **k: 1 / 0)
        response = asyncio.run(_get_async(app, "/health", token))
        monkeypatch.undo()
        assert response.status_code == 500 and "ZeroDivisionError" in response.json()["error"]
        _check(schema, _declared(schema, "/health", "get", 500), response.json())
        # paths and methods the schema does not have still answer the one error body
        for bad in (asyncio.run(_get_async(app, "/nope", token)), asyncio.run(_get_async(app, "/search", token))):
            assert bad.status_code in (404, 405)
            _check(schema, {"$ref": "#/components/schemas/ErrorBody"}, bad.json())
    assert {status for _, status in seen} >= {200, 400, 401, 408, 413, 422, 503}, seen


async def _get_async(app, path: str, token: str | None) -> httpx.Response:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        return await client.get(path, headers={"authorization": f"Bearer {token}"} if token else {})


# One status for one mistake, and the field named: 400 for a body that is not JSON, 422 for JSON the schema refuses.
MISTAKES: list[tuple[bytes, int, str]] = [
    (b'{"query": 1,\n "top_k": }', 400, "request body is not valid JSON (line 2 column 11: Expecting value)"),
    (b"{query: ", 400, "request body is not valid JSON (line 1 column 2: Expecting property name"),
    (b"", 400, "request body is empty"),
    (b'{"query": "\xff"}', 400, "request body is not valid UTF-8 (byte 11)"),
    (b"[1]", 422, "request body must be a JSON object, got an array"),
    (b'{"query": ""}', 422, "query: empty query"),
    (b'{"query": " \\n "}', 422, "query: empty query"),
    (b'{"query": []}', 422, "query: no queries: send a query, or a list of 1 to 4"),
    (b'{"query": ["a", " "]}', 422, "query: query 1 is empty"),
    (b'{"query": ["a", 2]}', 422, "query: query 1 must be a string, got a number"),
    (b'{"query": null}', 422, "query: must be a string or a list of strings, got null"),
    (b'{"query": ["a", "b", "c", "d", "e"]}', 422, "query: 5 queries; at most 4 in one request"),
    (b'{"query": "' + "长".encode() * 30 + b'"}', 422, "query: the query has 30 characters; at most 20"),
    (b'{"query": "\\ud800"}', 422, "query: the query is not valid Unicode (lone surrogate at character 0)"),
    (b'{"top_k": 3}', 422, "query: Field required"),
    (b'{"query": "a", "top_k": 0}', 422, "top_k: Input should be greater than or equal to 1"),
    (b'{"query": "a", "filters": {"a b": 1}}', 422, "filters: invalid filter field 'a b'"),
    (b'{"query": "a", "filters": {"a": {"b": 1}}}', 422, "filters: filter 'a': values must be str, int, float"),
    (b'{"query": "a", "filters": {"a": Infinity}}', 422, "filters: filter 'a': values must be finite numbers"),
    (b'{"query": "a", "filters": [{"a": 1}]}', 422, "filters: filters must be a dict of metadata field"),
    (b'{"query": "a", "mode": "fuzzy"}', 422, "mode: Input should be 'dense', 'sparse' or 'hybrid'"),
]


@pytest.mark.parametrize(("body", "status", "message"), MISTAKES, ids=[m[2][:40] for m in MISTAKES])
def test_one_status_for_one_mistake_naming_the_field(retriever, body: bytes, status: int, message: str) -> None:
    with TestClient(create_app(retriever, ServiceLimits(max_queries=4, max_query_chars=20))) as client:
        response = client.post("/search", content=body, headers={"content-type": "application/json"})
    assert (response.status_code, response.json()["error"][: len(message)]) == (status, message), response.text
    assert "body." not in response.json()["error"]  # no FastAPI location: a byte offset is never a field


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_a_body_sent_without_the_json_content_type_is_judged_by_its_bytes(retriever, content_type: str | None) -> None:
    """Malformed JSON is 400 whatever the header says (a client that names no content type, or curl -d's form
    type, used to get 422 and a message about bytes); well-formed JSON sent so is one line naming the header."""
    headers = {"content-type": content_type} if content_type else {}
    with TestClient(create_app(retriever)) as client:
        malformed = client.post("/search", content='{"query": "感冒", '.encode(), headers=headers)
        well_formed = client.post("/search", content='{"query": "感冒"}'.encode(), headers=headers)
    assert malformed.status_code == 400 and malformed.json()["error"].startswith("request body is not valid JSON")
    assert well_formed.status_code == 422 and "Content-Type: application/json" in well_formed.json()["error"]


def test_a_mode_the_store_cannot_search_is_named(tiny_model_dir: Path, small_corpus_path: Path, tmp_path: Path) -> None:
    from care_retriever import AsymmetricEmbedder, CareRetriever, DocumentStoreWriter, read_corpus

    spec = f"faiss:{tmp_path / 'dense-only'}"
    embedder = AsymmetricEmbedder.from_pretrained(tiny_model_dir, load="document")
    DocumentStoreWriter(embedder, spec, show_progress=False, sparse=False).write(read_corpus(small_corpus_path))
    dense_only = CareRetriever.from_pretrained(str(tiny_model_dir), spec, backend="torch")
    try:
        with TestClient(create_app(dense_only)) as client:
            response = client.post("/search", json={"query": "感冒", "mode": "hybrid"})
            assert response.status_code == 422
            assert response.json()["error"].startswith("mode: 'hybrid' needs the store's BM25 side")
            assert client.post("/search", json={"query": "感冒"}).status_code == 200
    finally:
        dense_only.close()


def test_the_guide_tabulates_every_error_status_the_schema_declares() -> None:
    from care_retriever.search.service_schema import ERROR_STATUSES

    guide = (Path(__file__).resolve().parents[2] / "docs" / "reference" / "http-service.md").read_text("utf-8")
    table = guide.split("## Errors", 1)[1]
    rows = {line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ")}
    assert {str(status) for status in ERROR_STATUSES} <= rows, rows
