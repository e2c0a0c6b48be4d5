"""AsyncEncoder on a real event loop: the towers run in a worker thread, concurrent queries share a forward pass."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from care_retriever.errors import ModelError
from care_retriever.model.embedder import AsymmetricEmbedder
from care_retriever.search.async_encoding import AsyncEncoder
from tests.support.data import SAMPLE_DIR, read_jsonl, sample_queries

TICK_S = 0.01


@pytest.fixture(scope="module")
def corpus_texts() -> list[str]:
    return [f"{r['title']}\n{r['text']}" for r in read_jsonl(SAMPLE_DIR / "corpus.jsonl")]


async def heartbeat_gaps(work) -> tuple[float, list[float], object]:
    """Run ``work`` (a coroutine) beside a coroutine that wakes every 10 ms; return (seconds ``work`` took,
    the gaps between the heartbeat's wake-ups meanwhile, ``work``'s result)."""
    beats: list[float] = []
    done = asyncio.Event()

    async def heartbeat() -> None:
        while not done.is_set():
            beats.append(time.perf_counter())
            await asyncio.sleep(TICK_S)

    beat = asyncio.create_task(heartbeat())
    await asyncio.sleep(0)  # the heartbeat has started before the work does
    started = time.perf_counter()
    result = await work
    elapsed = time.perf_counter() - started
    done.set()
    await beat
    return elapsed, list(np.diff(beats)), result


async def test_heartbeat_keeps_ticking_while_a_document_batch_encodes(
    embedder: AsymmetricEmbedder, corpus_texts: list[str]
) -> None:
    texts = corpus_texts * 4  # long enough (~0.4 s here) that a blocked loop would show a long gap
    encoder = AsyncEncoder(document_encoder=lambda: embedder)
    elapsed, gaps, vectors = await heartbeat_gaps(encoder.embed_documents(texts, batch_size=32))
    assert elapsed > 0.2, f"the batch took {elapsed:.3f} s: too short to tell a blocked loop from a free one"
    # Blocked, the loop would not wake for the whole batch (one gap ~ elapsed). Free, the heartbeat wakes every
    # few tens of ms; half the batch's time leaves room for a machine shared with other jobs.
    assert len(gaps) >= 5 and max(gaps) < max(elapsed / 2, 0.2), (elapsed, gaps)
    assert encoder.stats.document_calls == 1 and encoder.stats.documents == len(texts)
    expected = embedder.embed_documents(texts[:8], batch_size=8)
    np.testing.assert_allclose(np.asarray(vectors)[:8], expected, atol=1e-5)


async def test_concurrent_queries_share_a_forward_pass(embedder: AsymmetricEmbedder) -> None:
    queries = sample_queries()[:12]
    encoder = AsyncEncoder(query_encoder=lambda: embedder, max_batch_size=32)
    vectors = await asyncio.gather(*(encoder.embed_queries([q]) for q in queries))
    stats = encoder.stats
    assert stats.queries == len(queries)
    assert stats.query_batches < len(queries), stats  # one pass for all (they were all waiting at once)
    for query, vector in zip(queries, vectors, strict=True):
        np.testing.assert_allclose(vector, embedder.embed_queries([query]), atol=1e-5)


async def test_batches_respect_the_size_limit_and_each_instruction_is_its_own_pass(
    embedder: AsymmetricEmbedder,
) -> None:
    """Batches of at most ``max_batch_size`` queries; jobs with another instruction are encoded apart, and its error
    (this tower takes no instruction) reaches those jobs alone."""
    queries = sample_queries()[:10]
    encoder = AsyncEncoder(query_encoder=lambda: embedder, max_batch_size=4)
    plain = asyncio.gather(*(encoder.embed_queries([q]) for q in queries))
    instructed = encoder.embed_queries(queries[:2], instruction="Given a question, retrieve passages")
    results, other = await asyncio.gather(plain, instructed, return_exceptions=True)
    assert isinstance(other, ModelError), other
    assert encoder.stats.queries == 10 and encoder.stats.query_batches >= 3  # 10 queries, at most 4 a pass
    np.testing.assert_allclose(np.vstack(results), embedder.embed_queries(queries), atol=1e-5)


async def test_a_heartbeat_ticks_while_queries_encode(embedder: AsymmetricEmbedder) -> None:
    queries = sample_queries() * 3
    encoder = AsyncEncoder(query_encoder=lambda: embedder, max_batch_size=8)
    elapsed, gaps, _ = await heartbeat_gaps(asyncio.gather(*(encoder.embed_queries([q]) for q in queries)))
    assert encoder.stats.query_batches >= len(queries) // 8
    assert len(gaps) >= 3 and max(gaps) < max(elapsed / 2, 0.1), (elapsed, gaps)


def test_each_loop_gets_its_own_batcher(embedder: AsymmetricEmbedder) -> None:
    """Loops of two threads (and a loop run after another closed) all get answers from one encoder."""
    queries = sample_queries()[:4]
    encoder = AsyncEncoder(query_encoder=lambda: embedder)
    out: dict[int, np.ndarray] = {}

    def in_thread(n: int) -> None:
        out[n] = np.vstack(asyncio.run(asyncio.wait_for(_all(encoder, queries), 60)))

    threads = [threading.Thread(target=in_thread, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out[2] = np.vstack(asyncio.run(_all(encoder, queries)))  # a third loop, after the others closed
    expected = embedder.embed_queries(queries)
    assert sorted(out) == [0, 1, 2]
    for vectors in out.values():
        np.testing.assert_allclose(vectors, expected, atol=1e-5)


async def _all(encoder: AsyncEncoder, queries: list[str]) -> list[np.ndarray]:
    return list(await asyncio.gather(*(encoder.embed_queries([q]) for q in queries)))


async def test_an_encoder_error_reaches_the_caller_and_the_next_call_works(embedder: AsymmetricEmbedder) -> None:
    calls = {"n": 0}

    def flaky() -> AsymmetricEmbedder:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("tower failed to load")
        return embedder

    encoder = AsyncEncoder(query_encoder=flaky)
    with pytest.raises(RuntimeError, match="tower failed to load"):
        await encoder.embed_queries(["头痛"])
    np.testing.assert_allclose(await encoder.embed_queries(["头痛"]), embedder.embed_queries(["头痛"]), atol=1e-5)


async def test_qdrant_async_reads_go_through_async_qdrant_client(embedder: AsymmetricEmbedder, tmp_path: Path) -> None:
    """A server store's async reads awaiting an ``AsyncQdrantClient`` (here on qdrant-client's local mode, the
    stand-in for a server, which it supports; a server store opens one itself) give the sync client's hits,
    documents and counts."""
    from qdrant_client import AsyncQdrantClient, QdrantClient

    from care_retriever.documents import Document
    from care_retriever.stores.qdrant import QdrantStore

    rows = read_jsonl(SAMPLE_DIR / "corpus.jsonl")[:60]
    docs = [Document(id=r["_id"], text=r["text"], title=r["title"], metadata=r.get("metadata") or {}) for r in rows]
    folder = str(tmp_path / "qdrant")
    client = QdrantClient(path=folder)
    store = QdrantStore(folder, client=client)
    with store.transaction(embedder.dim, embedder.space_fingerprint, "tiny") as writer:
        writer.upsert(docs, embedder.embed_documents([d.embedding_text() for d in docs]))
    topic = docs[0].metadata["topic"]
    queries = embedder.embed_queries(sample_queries()[:5])
    expected = (store.search(queries, 5), store.search(queries, 5, {"topic": topic}))
    ids = [docs[2].id, "missing", docs[0].id]
    expected_get, expected_count = store.get(ids), (store.count(), store.count({"topic": topic}))
    client.close()  # local mode: one client per folder, the async one from here on
    store.async_client = AsyncQdrantClient(path=folder)
    try:
        got = (await store.search_async(queries, 5), await store.search_async(queries, 5, {"topic": topic}))
        assert all(len(hits) == 5 for hits in got[0]) and any(len(hits) for hits in got[1])
        for got_hits, expected_hits in zip([*got[0], *got[1]], [*expected[0], *expected[1]], strict=True):
            assert [replace(h, score=0.0) for h in got_hits] == [replace(h, score=0.0) for h in expected_hits]
            np.testing.assert_allclose([h.score for h in got_hits], [h.score for h in expected_hits], atol=1e-5)
        assert await store.get_async(ids) == expected_get and expected_get[1] is None
        assert (await store.count_async(), await store.count_async({"topic": topic})) == expected_count
    finally:
        await store.aclose()
    assert store.async_client is None


async def test_qdrant_edge_async_reads_run_off_the_event_loop(embedder: AsymmetricEmbedder, tmp_path: Path) -> None:
    """Qdrant Edge's binding holds the GIL for each call: an Edge store's async reads run in a worker thread, never
    on the loop's own, and give the sync reads' hits, documents and counts."""
    import threading

    from care_retriever.documents import Document
    from care_retriever.stores.qdrant import EdgeStore, QdrantStore

    rows = read_jsonl(SAMPLE_DIR / "corpus.jsonl")[:40]
    docs = [Document(id=r["_id"], text=r["text"], title=r["title"], metadata=r.get("metadata") or {}) for r in rows]
    store = QdrantStore(str(tmp_path / "edge"))
    assert isinstance(store, EdgeStore)
    with store.transaction(embedder.dim, embedder.space_fingerprint, "tiny") as writer:
        writer.upsert(docs, embedder.embed_documents([d.embedding_text() for d in docs]))
    queries = embedder.embed_queries(sample_queries()[:3])
    expected, expected_get = store.search(queries, 5), store.get([docs[1].id, "missing"])
    threads: list[int] = []
    real_search = store.search

    def search(*args: object, **kwargs: object) -> object:
        threads.append(threading.get_ident())
        return real_search(*args, **kwargs)  # type: ignore[arg-type]

    store.search = search  # type: ignore[method-assign]
    try:
        assert await store.search_async(queries, 5) == expected
        assert await store.get_async([docs[1].id, "missing"]) == expected_get
        assert await store.count_async() == len(docs)
    finally:
        await store.aclose()
    assert threads and threading.get_ident() not in threads
