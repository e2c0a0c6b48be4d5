"""``care-retriever serve`` in a real subprocess on loopback: malformed requests get a 4xx with a message,
concurrent clients get what the in-process retriever gives, and the server keeps serving throughout."""

from __future__ import annotations

import json
import signal
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from care_retriever import AsymmetricEmbedder, CareRetriever, DocumentStoreWriter, read_corpus
from tests.support.serve_process import ServeProcess, start_serve

QUERIES = ["血压高怎么办", "拉肚子脱水", "宝宝发烧", "失眠", "糖尿病饮食", "感冒"]
LIMITS = ["--max-top-k", "5", "--max-queries", "4", "--max-query-chars", "200", "--max-body-bytes", "4096"]


@pytest.fixture(scope="module")
def store(tiny_model_dir: Path, small_corpus_path: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    spec = f"faiss:{tmp_path_factory.mktemp('serve') / 'store'}"
    embedder = AsymmetricEmbedder.from_pretrained(tiny_model_dir, load="document")
    DocumentStoreWriter(embedder, spec, show_progress=False).write(read_corpus(small_corpus_path))
    return spec


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, store: str) -> Iterator[ServeProcess]:
    srv = start_serve(tiny_model_dir, store, *LIMITS)
    yield srv
    assert srv.stop(timeout=20) in (0, -signal.SIGTERM)
    assert "Traceback" not in srv.text()


@pytest.fixture(scope="module")
def expected(tiny_model_dir: Path, store: str) -> dict[str, list[tuple[str, float]]]:
    retriever = CareRetriever.from_pretrained(str(tiny_model_dir), store)
    out = {q: [(h.id, h.score) for h in retriever.search(q, top_k=5)] for q in QUERIES}
    retriever.close()
    return out


def test_binds_loopback_by_default_and_loads_only_the_query_tower(server: ServeProcess) -> None:
    assert server.host == "127.0.0.1"
    health = httpx.get(f"{server.url}/health", timeout=10).json()
    assert health["status"] == "ok" and health["documents"] == 6 and health["towers"] == ["query"]
    assert health["limits"]["max_top_k"] == 5


def test_search_matches_the_in_process_retriever(server: ServeProcess, expected) -> None:
    body = httpx.post(f"{server.url}/search", json={"query": QUERIES[:4], "top_k": 5}, timeout=10).json()
    for result in body["results"]:
        got = [(h["id"], h["score"]) for h in result["hits"]]
        assert [i for i, _ in got] == [i for i, _ in expected[result["query"]]]
        assert [s for _, s in got] == pytest.approx([s for _, s in expected[result["query"]]], abs=1e-5)
    one = httpx.post(f"{server.url}/search", json={"query": "感冒", "filters": {"group": "odd"}}, timeout=10)
    assert one.status_code == 200 and {h["metadata"]["group"] for h in one.json()["results"][0]["hits"]} == {"odd"}


MALFORMED: list[tuple[str, bytes | str, dict[str, str], int]] = [
    ("not json", b"{query: ", {}, 400),
    ("empty body", b"", {}, 400),
    ("array", b"[1, 2]", {}, 422),
    ("missing query", b'{"top_k": 3}', {}, 422),
    ("empty query", b'{"query": ""}', {}, 422),
    ("blank query", b'{"query": "   "}', {}, 422),
    ("empty list", b'{"query": []}', {}, 422),
    ("too many queries", b'{"query": ["a", "b", "c", "d", "e"]}', {}, 422),
    ("query too long", b'{"query": "' + "长".encode() * 201 + b'"}', {}, 422),
    ("top_k zero", b'{"query": "a", "top_k": 0}', {}, 422),
    ("top_k too big", b'{"query": "a", "top_k": 6}', {}, 422),
    ("top_k string", b'{"query": "a", "top_k": "3"}', {}, 422),
    ("top_k float", b'{"query": "a", "top_k": 2.5}', {}, 422),
    ("null query", b'{"query": null}', {}, 422),
    ("number query", b'{"query": 12}', {}, 422),
    ("unknown field", b'{"query": "a", "topk": 3}', {}, 422),
    ("bad filter key", b'{"query": "a", "filters": {"a b": 1}}', {}, 422),
    ("nested filter", b'{"query": "a", "filters": {"a": {"b": 1}}}', {}, 422),
    ("NaN filter", b'{"query": "a", "filters": {"a": NaN}}', {}, 422),
    ("lone surrogate", b'{"query": "\\ud800"}', {}, 422),
    ("invalid utf-8", b'{"query": "\xff\xfe"}', {}, 400),
    ("deep nesting", b"[" * 2000 + b"]" * 2000, {}, 400),
    ("body too large", b'{"query": "' + b"a" * 5000 + b'"}', {}, 413),
]


@pytest.mark.parametrize(("name", "body", "headers", "status"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_requests_get_4xx_with_a_message(
    server: ServeProcess, name: str, body: bytes, headers: dict, status: int
) -> None:
    response = httpx.post(
        f"{server.url}/search", content=body, headers={"content-type": "application/json", **headers}, timeout=10
    )
    assert response.status_code == status, response.text
    assert response.json()["error"]
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200


def _raw(server: ServeProcess, request: bytes) -> bytes:
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        sock.sendall(request)
        return sock.recv(4096)


def _raw_until_closed(server: ServeProcess, request: bytes) -> bytes:
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        sock.sendall(request)
        reply = b""
        while chunk := sock.recv(4096):
            reply += chunk
        return reply


def test_broken_http_gets_400(server: ServeProcess) -> None:
    """What no well-behaved client sends: a non-numeric Content-Length, a garbage request line. The answer is the
    service's one error body (docs/reference/http-service.md, "Errors"), not the HTTP server's plain text."""
    for request in (b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}", b"\x00\x01 garbage\r\n\r\n"):
        reply = _raw_until_closed(server, request)
        assert reply.startswith(b"HTTP/1.1 400"), reply
        head, _, body = reply.partition(b"\r\n\r\n")
        assert b"content-type: application/json" in head.lower(), reply
        error = json.loads(body)["error"]
        assert set(json.loads(body)) == {"error"} and "\n" not in error and "HTTP" in error, body
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200


def test_streamed_body_over_the_limit_is_cut_off(server: ServeProcess) -> None:
    def chunks() -> Iterator[bytes]:  # chunked transfer: no Content-Length to check up front
        yield b'{"query": "'
        for _ in range(100):
            yield b"a" * 100
        yield b'"}'

    response = httpx.post(f"{server.url}/search", content=chunks(), timeout=10)
    assert response.status_code == 413 and "limit" in response.json()["error"]


def test_wrong_method_and_path(server: ServeProcess) -> None:
    assert httpx.get(f"{server.url}/search", timeout=10).status_code == 405
    assert httpx.get(f"{server.url}/nope", timeout=10).status_code == 404


def test_concurrent_clients_get_serial_results(server: ServeProcess, expected) -> None:
    """8 clients x 12 requests, mixed with bad ones; bounded in time."""

    def client(worker: int) -> list[str]:
        problems = []
        with httpx.Client(base_url=server.url, timeout=30) as http:
            for i in range(12):
                query = QUERIES[(worker + i) % len(QUERIES)]
                if i % 4 == 3:
                    bad = http.post("/search", json={"query": query, "top_k": 99})
                    if bad.status_code != 422:
                        problems.append(f"bad request got {bad.status_code}")
                    continue
                r = http.post("/search", json={"query": query, "top_k": 5})
                got = [(h["id"], h["score"]) for h in r.json()["results"][0]["hits"]]
                want = expected[query]
                same = [i for i, _ in got] == [i for i, _ in want] and all(
                    abs(a - b) <= 1e-5 for (_, a), (_, b) in zip(got, want, strict=True)
                )
                if r.status_code != 200 or not same:
                    problems.append(f"{query}: {r.status_code} {got}")
        return problems

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=8) as pool:
        problems = [p for found in pool.map(client, range(8), timeout=120) for p in found]
    assert problems == []
    assert time.monotonic() - start < 120
    assert server.proc.poll() is None and "Traceback" not in server.text()
