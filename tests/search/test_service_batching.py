"""The batching service in process (real retriever, real FAISS store, the ASGI app over httpx): concurrent
requests share forward passes yet each gets the hits of its own queries, top_k and filters; a full
queue answers 503 with Retry-After; the bearer token gates every route; /metrics parses as Prometheus."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from care_retriever import AsymmetricEmbedder, CareRetriever, DocumentStoreWriter, read_corpus
from care_retriever.errors import InputError
from care_retriever.search.server import ServiceLimits, create_app
from tests.support.data import sample_queries

SAMPLE = Path(__file__).resolve().parents[2] / "care_retriever" / "data" / "sample"
TOKEN = "care-token-5c1d0e9b"
FILTERS: list[dict | None] = [None, {"topic": "高血压"}, {"topic": ["感冒", "失眠", "胃炎"]}, None]


@pytest.fixture(scope="module")
def retriever(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    spec = f"faiss:{tmp_path_factory.mktemp('batching') / 'store'}"
    embedder = AsymmetricEmbedder.from_pretrained(tiny_model_dir, load="document")
    DocumentStoreWriter(embedder, spec, show_progress=False).write(read_corpus(SAMPLE / "corpus.jsonl"))
    found = CareRetriever.from_pretrained(str(tiny_model_dir), spec)
    yield found
    found.close()


def _hits(rows: list[dict]) -> list[tuple[str, float]]:
    return [(h["id"], h["score"]) for h in rows]


def _same(got: list[tuple[str, float]], want: list[tuple[str, float]]) -> bool:
    return [i for i, _ in got] == [i for i, _ in want] and all(
        abs(a - b) <= 1e-5 for (_, a), (_, b) in zip(got, want, strict=True)
    )


def _metrics(text: str) -> dict[str, float]:
    """Every sample of the exposition as ``name{label="v",...}`` -> value."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out


async def _post_all(app, bodies: list[dict], headers: dict | None = None) -> list[httpx.Response]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test", headers=headers) as client:
        return await asyncio.gather(*(client.post("/search", json=b) for b in bodies))


def test_concurrent_requests_share_forward_passes_and_get_their_own_hits(retriever) -> None:
    """48 concurrent requests, each with its own query, top_k and filter (some with two queries), are
    batched together, and every one gets what a direct single-query search gives for it."""
    rng = random.Random(7)
    queries = sample_queries()
    bodies = []
    for i in range(48):
        qs = rng.sample(queries, 2 if i % 5 == 0 else 1)
        body: dict = {"query": qs if len(qs) > 1 else qs[0], "top_k": rng.randint(1, 8)}
        if FILTERS[i % len(FILTERS)] is not None:
            body["filters"] = FILTERS[i % len(FILTERS)]
        bodies.append(body)
    expected = [
        [
            _hits([h.to_dict() for h in retriever.search(q, top_k=b["top_k"], filters=b.get("filters"))])
            for q in ([b["query"]] if isinstance(b["query"], str) else b["query"])
        ]
        for b in bodies
    ]
    # The check can tell requests apart: no two distinct (query, top_k, filters) give the same hits.
    distinct = {json.dumps(b, sort_keys=True, ensure_ascii=False): e for b, e in zip(bodies, expected, strict=True)}
    keys = list(distinct)
    for a in range(len(keys)):
        for b in range(a + 1, len(keys)):
            assert not all(_same(x, y) for x, y in zip(distinct[keys[a]], distinct[keys[b]], strict=False)), (
                "the model cannot tell these requests apart",
                keys[a],
                keys[b],
            )

    app = create_app(retriever, ServiceLimits(max_top_k=10, max_batch_size=16, max_wait_ms=50, max_queue=256))
    responses = asyncio.run(_post_all(app, bodies))
    for body, want, response in zip(bodies, expected, responses, strict=True):
        assert response.status_code == 200, response.text
        results = response.json()["results"]
        asked = [body["query"]] if isinstance(body["query"], str) else body["query"]
        assert [r["query"] for r in results] == asked
        for result, hits in zip(results, want, strict=True):
            assert _same(_hits(result["hits"]), hits), (body, _hits(result["hits"]), hits)
            if body.get("filters") == {"topic": "高血压"}:
                assert {h["metadata"]["topic"] for h in result["hits"]} <= {"高血压"}

    seen = _metrics(asyncio.run(_get(app, "/metrics")).text)
    batches, queries = seen["care_batch_queries_count"], seen["care_batch_queries_sum"]
    assert queries == sum(len(w) for w in expected)  # every query went through the tower exactly once
    assert batches < len(bodies) / 2 and seen['care_batch_queries_bucket{le="16.0"}'] == batches  # batched, <= 16


async def _get(app, path: str, headers: dict | None = None) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test", headers=headers) as client:
        return await client.get(path)


def test_batching_off_runs_one_request_per_forward_pass(retriever) -> None:
    app = create_app(retriever, ServiceLimits(max_batch_size=1, max_wait_ms=50))
    bodies = [{"query": q, "top_k": 3} for q in sample_queries()[:12]]
    responses = asyncio.run(_post_all(app, bodies))
    assert [r.status_code for r in responses] == [200] * 12
    seen = _metrics(asyncio.run(_get(app, "/metrics")).text)
    assert seen["care_batch_queries_count"] == 12 and seen["care_batch_queries_sum"] == 12


def test_a_bad_request_in_a_batch_fails_alone(retriever, monkeypatch) -> None:
    """A search the store refuses fails its own request (422), not the others searched in the same batch. (The
    service's schema refuses every filter the stores refuse before a request joins a batch: the store's search is
    made to refuse one filter value here.)"""
    search = retriever.store.search

    def refusing(vectors, top_k, filters=None):
        if filters == {"topic": "refused"}:
            raise InputError("filter 'topic': the store refuses this value")
        return search(vectors, top_k, filters)

    monkeypatch.setattr(retriever.store, "search", refusing)
    queries = sample_queries()[:6]
    bodies = [{"query": q, "top_k": 3} for q in queries]
    bodies[2]["filters"] = {"topic": "refused"}
    app = create_app(retriever, ServiceLimits(max_batch_size=16, max_wait_ms=50))
    responses = asyncio.run(_post_all(app, bodies))
    assert [r.status_code for r in responses] == [200, 200, 422, 200, 200, 200]
    assert "refuses" in responses[2].json()["error"]
    for q, r in zip(queries, responses, strict=True):
        if r.status_code == 200:
            assert _same(_hits(r.json()["results"][0]["hits"]), _hits([h.to_dict() for h in retriever.search(q, 3)]))


def test_a_full_queue_answers_503_with_retry_after(retriever) -> None:
    app = create_app(retriever, ServiceLimits(max_queries=2, max_batch_size=1, max_queue=2, max_concurrency=1))
    queries = sample_queries()[:30]
    responses = asyncio.run(_post_all(app, [{"query": q, "top_k": 2} for q in queries]))
    codes = [r.status_code for r in responses]
    assert set(codes) == {200, 503} and codes.count(200) >= 2, codes
    for q, r in zip(queries, responses, strict=True):
        if r.status_code == 503:
            assert int(r.headers["retry-after"]) >= 1 and "busy" in r.json()["error"]
        else:
            assert _same(_hits(r.json()["results"][0]["hits"]), _hits([h.to_dict() for h in retriever.search(q, 2)]))
    seen = _metrics(asyncio.run(_get(app, "/metrics")).text)
    assert seen['care_errors_total{kind="overloaded"}'] == codes.count(503)
    assert seen['care_requests_total{route="/search",status="503"}'] == codes.count(503)
    assert seen["care_queue_depth"] == 0 and seen["care_queue_limit"] == 2


def test_bearer_token_gates_every_route_and_is_never_echoed(retriever) -> None:
    app = create_app(retriever, ServiceLimits(), api_token=TOKEN)
    answers = []
    for headers in (
        None,
        {"authorization": f"Bearer {TOKEN}x"},
        {"authorization": TOKEN},
        {"authorization": f"Basic {TOKEN}"},
        {"authorization": f"Bearer {TOKEN[:-1]}"},
    ):
        for path in ("/health", "/metrics"):
            answers.append(asyncio.run(_get(app, path, headers)))
        answers.append(asyncio.run(_post_all(app, [{"query": "感冒"}], headers))[0])
    assert [a.status_code for a in answers] == [401] * len(answers)
    assert all(a.headers["www-authenticate"].startswith("Bearer") and a.json()["error"] for a in answers)
    good = {"authorization": f"Bearer {TOKEN}"}
    answers += [
        asyncio.run(_get(app, "/health", good)),
        asyncio.run(_get(app, "/metrics", good)),
        asyncio.run(_post_all(app, [{"query": "感冒"}], good))[0],
    ]
    assert [a.status_code for a in answers[-3:]] == [200, 200, 200]
    for a in answers:
        assert TOKEN not in a.text and all(TOKEN not in v for v in a.headers.values())
        assert TOKEN[:8] not in a.text
    assert TOKEN not in repr(app) and TOKEN not in repr(vars(app))
    seen = _metrics(answers[-2].text)
    assert seen['care_errors_total{kind="unauthorized"}'] == 15


def test_metrics_count_requests_latency_and_errors(retriever) -> None:
    app = create_app(retriever, ServiceLimits(max_top_k=5, max_body_bytes=512))
    asyncio.run(_post_all(app, [{"query": "感冒", "top_k": 2}, {"query": "失眠", "top_k": 9}, {"query": "x" * 600}]))
    text = asyncio.run(_get(app, "/metrics"))
    assert text.status_code == 200 and text.headers["content-type"].startswith("text/plain")
    seen = _metrics(text.text)
    assert seen['care_requests_total{route="/search",status="200"}'] == 1
    assert seen['care_requests_total{route="/search",status="422"}'] == 1
    assert seen['care_requests_total{route="/search",status="413"}'] == 1
    assert seen['care_errors_total{kind="client"}'] == 2
    assert seen['care_request_duration_seconds_count{route="/search"}'] == 3
    assert seen['care_request_duration_seconds_sum{route="/search"}'] > 0
    assert seen["care_batch_duration_seconds_count"] == 1 and seen["care_queue_wait_seconds_count"] == 1
    assert not any(k.startswith("care_errors_total") and "internal" in k and v for k, v in seen.items())
