"""``care-retriever serve`` under load, in a real uvicorn subprocess on loopback: well-formed clients mixed
with hostile ones (malformed JSON, oversized, slow and stalled bodies, disconnects mid-request, wrong
tokens) get zero 5xx, and each well-formed response holds the hits of its own query (compared with a
direct single-query search, scores included); SIGTERM lets the requests in flight finish."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from care_retriever import AsymmetricEmbedder, CareRetriever, DocumentStoreWriter, read_corpus
from tests.support.data import sample_queries
from tests.support.serve_process import start_serve

pytestmark = pytest.mark.slow  # end-to-end runs: scheduled first (tests/conftest.py)

SAMPLE = Path(__file__).resolve().parents[2] / "care_retriever" / "data" / "sample"
TOKEN = "care-load-token-93be2f17a4"
FILTERS: list[dict | None] = [None, {"topic": "高血压"}, {"topic": ["感冒", "失眠", "胃炎", "哮喘"]}]
# The slow body below takes about 0.75 s to send: a timeout 5x that keeps it answered on a loaded machine,
# where the client's and the server's event loops both run late.
BODY_TIMEOUT = 4.0
LIMITS = [
    "--max-top-k",
    "10",
    "--max-queries",
    "4",
    "--max-body-bytes",
    "4096",
    "--max-batch-size",
    "16",
    "--max-wait-ms",
    "10",
    "--max-queue",
    "512",
    "--body-timeout",
    str(BODY_TIMEOUT),
]


def _metrics(text: str) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """The direct searches run in this process while the server works: one intra-op thread each, not two
    processes spinning two OpenMP threads apiece on a shared machine (10x slower here under load)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def store(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    spec = f"faiss:{tmp_path_factory.mktemp('load') / 'store'}"
    embedder = AsymmetricEmbedder.from_pretrained(tiny_model_dir, load="document")
    DocumentStoreWriter(embedder, spec, show_progress=False).write(read_corpus(SAMPLE / "corpus.jsonl"))
    return spec


@pytest.fixture(scope="module")
def direct(tiny_model_dir: Path, store: str) -> Iterator[CareRetriever]:
    retriever = CareRetriever.from_pretrained(str(tiny_model_dir), store)
    yield retriever
    retriever.close()


def _expected(direct: CareRetriever, body: dict) -> list[list[tuple[str, float]]]:
    queries = [body["query"]] if isinstance(body["query"], str) else body["query"]
    return [
        [(h.id, h.score) for h in direct.search(q, top_k=body["top_k"], filters=body.get("filters"))] for q in queries
    ]


def _matches(result: list[dict], want: list[tuple[str, float]]) -> bool:
    return [h["id"] for h in result] == [i for i, _ in want] and all(
        abs(h["score"] - s) <= 1e-5 for h, (_, s) in zip(result, want, strict=True)
    )


def _plan(n_clients: int, per_client: int, seed: int = 11) -> list[list[dict]]:
    rng = random.Random(seed)
    queries = sample_queries()
    plan = []
    for _ in range(n_clients):
        bodies = []
        for _ in range(per_client):
            picked = rng.sample(queries, rng.choice([1, 1, 1, 2, 3]))
            body: dict = {"query": picked[0] if len(picked) == 1 else picked, "top_k": rng.randint(1, 10)}
            if (f := rng.choice(FILTERS)) is not None:
                body["filters"] = f
            bodies.append(body)
        plan.append(bodies)
    return plan


async def _raw(
    port: int, head: bytes, body_parts: list[bytes], gap: float = 0.0, *, read: bool = True, timeout: float = 10
) -> bytes:
    """Send a request by hand (a head, then the body in parts with pauses); the reply's bytes, or b"" if
    ``read`` is False (the client hangs up without reading).

    During each pause the client listens: a server that answers before the body is all sent (a 408 or 413)
    closes the connection, and writing on would lose its reply to a broken pipe."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    early = b""
    try:
        try:
            writer.write(head)
            for part in body_parts:
                await writer.drain()
                if gap:
                    with contextlib.suppress(TimeoutError):
                        early = await asyncio.wait_for(reader.read(65536), gap)
                        break
                writer.write(part)
            await writer.drain()
        except (ConnectionResetError, BrokenPipeError):
            if read:
                raise
        if not read:
            return b""
        return early + await asyncio.wait_for(reader.read(), timeout)  # to EOF: the head asks for Connection: close
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def _head(port: int, length: int | None, token: str = TOKEN) -> bytes:
    lines = [
        b"POST /search HTTP/1.1",
        f"Host: 127.0.0.1:{port}".encode(),
        b"Content-Type: application/json",
        f"Authorization: Bearer {token}".encode(),
        b"Connection: close",
    ]
    if length is not None:
        lines.append(f"Content-Length: {length}".encode())
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _status(reply: bytes) -> int:
    match = re.match(rb"HTTP/1\.1 (\d{3})", reply)
    return int(match.group(1)) if match else 0


def _json_body(reply: bytes) -> dict:
    return json.loads(reply.split(b"\r\n\r\n", 1)[1])


async def _hostile(port: int, url: str, rounds: int, direct: CareRetriever) -> list[str]:
    """Every kind of bad client, ``rounds`` times each; returns the problems seen."""
    problems: list[str] = []
    slow_body = json.dumps({"query": "孩子发烧怎么办", "top_k": 3}, ensure_ascii=False).encode()
    slow_want = _expected(direct, {"query": "孩子发烧怎么办", "top_k": 3})[0]
    good = {"authorization": f"Bearer {TOKEN}"}

    def expect(what: str, got: int, want: set[int]) -> None:
        if got not in want:
            problems.append(f"{what}: got {got}, want {sorted(want)}")

    async with httpx.AsyncClient(base_url=url, timeout=20) as http:
        for _ in range(rounds):
            r = await http.post("/search", content=b'{"query": "\xe6\x84\x9f\xe5\x86\x92", ', headers=good)
            expect("malformed JSON", r.status_code, {400})
            r = await http.post("/search", content=b'{"query": "x"' + b" " * 6000 + b"}", headers=good)
            expect("oversized body", r.status_code, {413})

            async def chunks():  # no Content-Length: cut off while streaming
                yield b'{"query": "'
                for _ in range(50):
                    yield b"a" * 200

            r = await http.post("/search", content=chunks(), headers=good)
            expect("oversized chunked body", r.status_code, {413})
            r = await http.post("/search", json={"query": "感冒"}, headers={"authorization": f"Bearer {TOKEN}0"})
            expect("wrong token", r.status_code, {401})
            if TOKEN in r.text:
                problems.append("the token was echoed")
            r = await http.post("/search", json={"query": ["感冒"] * 5}, headers=good)
            expect("too many queries", r.status_code, {422})
        for _ in range(rounds):
            # A slow body that arrives in time is answered, with its own hits.
            reply = await _raw(
                port,
                _head(port, len(slow_body)),
                [slow_body[i : i + 8] for i in range(0, 40, 8)] + [slow_body[40:]],
                gap=0.15,
            )
            expect("slow body", _status(reply), {200})
            if _status(reply) == 200 and not _matches(_json_body(reply)["results"][0]["hits"], slow_want):
                problems.append("slow body: hits of another query")
            # A body that stops half way gets 408 once the body timeout passes.
            started = time.monotonic()
            reply = await _raw(port, _head(port, len(slow_body)), [slow_body[:10]], timeout=BODY_TIMEOUT + 10)
            expect("stalled body", _status(reply), {408})
            if time.monotonic() - started > BODY_TIMEOUT + 5:
                problems.append("stalled body held past the body timeout")
            # Hang-ups: mid-body, and right after sending a whole request without reading the reply.
            await _raw(port, _head(port, len(slow_body)), [slow_body[:12]], read=False)
            await _raw(port, _head(port, len(slow_body)), [slow_body], read=False)
            await _raw(port, _head(port, 10**6), [b"{"], read=False)
            # Not HTTP at all.
            expect("garbage", _status(await _raw(port, b"\x16\x03\x01 hello\r\n\r\n", [])), {400})
    return problems


async def _well_formed(url: str, bodies: list[dict], expected: list[list[list[tuple[str, float]]]]) -> list[str]:
    problems = []
    async with httpx.AsyncClient(base_url=url, timeout=30, headers={"authorization": f"Bearer {TOKEN}"}) as http:
        for body, want in zip(bodies, expected, strict=True):
            r = await http.post("/search", json=body)
            if r.status_code != 200:
                problems.append(f"{body}: {r.status_code} {r.text[:200]}")
                continue
            results = r.json()["results"]
            asked = [body["query"]] if isinstance(body["query"], str) else body["query"]
            if [x["query"] for x in results] != asked:
                problems.append(f"{body}: answered for {[x['query'] for x in results]}")
            for result, hits in zip(results, want, strict=True):
                if not _matches(result["hits"], hits):
                    problems.append(f"{body}: {[(h['id'], h['score']) for h in result['hits']]} != {hits}")
    return problems


def test_load_with_hostile_clients_gets_no_5xx_and_no_mixed_up_answers(
    tiny_model_dir: Path, store: str, direct: CareRetriever
) -> None:
    plan = _plan(n_clients=12, per_client=10)
    expected = [[_expected(direct, body) for body in bodies] for bodies in plan]
    flat = {
        json.dumps(b, sort_keys=True, ensure_ascii=False): e
        for bs, es in zip(plan, expected, strict=True)
        for b, e in zip(bs, es, strict=True)
    }
    # Precondition: the check can tell the requests apart (no two distinct requests' hits match each other).
    wants = list(flat.values())
    for a in range(len(wants)):
        for b in range(a + 1, len(wants)):
            assert len(wants[a]) != len(wants[b]) or not all(
                _matches([{"id": i, "score": s} for i, s in x], y) for x, y in zip(wants[a], wants[b], strict=True)
            )

    server = start_serve(tiny_model_dir, store, *LIMITS, "--log-level", "debug", token=TOKEN)
    try:

        async def run() -> list[str]:
            tasks = [_well_formed(server.url, bodies, want) for bodies, want in zip(plan, expected, strict=True)]
            tasks += [_hostile(server.port, server.url, 2, direct) for _ in range(3)]
            return [p for found in await asyncio.gather(*tasks) for p in found]

        started = time.monotonic()
        problems = asyncio.run(asyncio.wait_for(run(), 60))
        assert problems == []
        assert time.monotonic() - started < 60
        auth = {"authorization": f"Bearer {TOKEN}"}
        assert httpx.get(f"{server.url}/health", headers=auth, timeout=10).json()["status"] == "ok"
        metrics = _metrics(httpx.get(f"{server.url}/metrics", headers=auth, timeout=10).text)
        statuses = {k: v for k, v in metrics.items() if k.startswith("care_requests_total")}
        assert not [k for k, v in statuses.items() if v and re.search(r'status="5\d\d"', k)], statuses
        assert metrics.get('care_errors_total{kind="internal"}', 0) == 0
        assert metrics['care_requests_total{route="/search",status="200"}'] >= 120
        assert metrics['care_requests_total{route="/search",status="408"}'] == 6
        # Batching happened: fewer forward passes than requests.
        assert metrics["care_batch_queries_sum"] > 1.5 * metrics["care_batch_queries_count"]
        # The queue drains: requests whose clients hung up right after sending can still be waiting for
        # their batch when the clients return, so the depth is polled, not read once.
        deadline = time.monotonic() + 10
        while metrics["care_queue_depth"] and time.monotonic() < deadline:
            time.sleep(0.1)
            metrics = _metrics(httpx.get(f"{server.url}/metrics", headers=auth, timeout=10).text)
        assert metrics["care_queue_depth"] == 0
        assert server.proc.poll() is None
    finally:
        code = server.stop()
    log = server.text()
    assert code in (0, -signal.SIGTERM), log[-2000:]
    assert "Traceback" not in log and "Exception" not in log, log[-3000:]
    assert TOKEN not in log and TOKEN[:10] not in log


def test_sigterm_lets_requests_in_flight_finish(tiny_model_dir: Path, store: str, direct: CareRetriever) -> None:
    """Requests waiting in a batch when SIGTERM arrives are answered in full; new connections are refused."""
    # The batch waits 10 s for more queries: time, on a loaded machine, for all four to queue and for the server
    # to close its door before the batch runs.
    server = start_serve(
        tiny_model_dir, store, "--max-batch-size", "64", "--max-wait-ms", "10000", "--shutdown-timeout", "30"
    )
    bodies = [{"query": q, "top_k": 4} for q in sample_queries()[:4]]
    try:
        with ThreadPoolExecutor(max_workers=4) as pool:
            futures = [pool.submit(httpx.post, f"{server.url}/search", json=b, timeout=30) for b in bodies]
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # all four are queued in the batch being collected
                if _metrics(httpx.get(f"{server.url}/metrics", timeout=5).text)["care_queue_depth"] == 4:
                    break
                time.sleep(0.02)
            else:
                pytest.fail("the requests never queued")
            server.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 5
            while True:  # new connections are refused once the server has the signal
                try:
                    httpx.get(f"{server.url}/health", timeout=2)
                except httpx.TransportError:
                    break
                assert time.monotonic() < deadline, "new connections were still accepted 5 s after SIGTERM"
                time.sleep(0.05)
            assert not any(f.done() for f in futures)  # the four were in flight when the door closed
            responses = [f.result(timeout=30) for f in futures]
        assert [r.status_code for r in responses] == [200] * 4
        for body, r in zip(bodies, responses, strict=True):
            assert _matches(r.json()["results"][0]["hits"], _expected(direct, body)[0])
        assert server.proc.wait(timeout=20) in (0, -signal.SIGTERM)
    finally:
        server.stop()
    assert "Traceback" not in server.text(), server.text()[-2000:]
