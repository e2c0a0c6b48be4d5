"""Hostile input, property-based: arbitrary Unicode, empty and blank strings, control characters, mixed
scripts, texts far beyond max_length, huge batches, broken weights. Never a crash, never a wrong width,
never garbage: either correct output or a one-line :class:`CareError`."""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from care_retriever import AsymmetricEmbedder, CareRetriever, DocumentStoreWriter, read_corpus
from care_retriever.errors import CareError, InputError, ModelError
from care_retriever.indexing.corpus import Document

SETTINGS = settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)

CONTROL = st.characters(categories=["Cc", "Cf", "Zs", "Zl", "Zp", "Mn"])
SCRIPTS = st.sampled_from(
    [
        "高血压",
        "感冒发烧",
        "😷🩺",
        "العربية",
        "हिन्दी",
        "Ελληνικά",
        "кириллица",
        "abc",
        "123",
        "\u200b",
        "\ufeff",
        "\u202e",
        "e\u0301",
        "ﬁ",
        "\x00",
        "\t\n\r",
        " ",
    ]
)
TEXT = st.one_of(
    st.text(max_size=80),  # any code point except lone surrogates
    st.text(alphabet=CONTROL, max_size=20),
    st.lists(SCRIPTS, max_size=12).map("".join),
    st.just(""),
)


@pytest.fixture(scope="module")
def retriever(embedder: AsymmetricEmbedder, small_corpus_path: Path, tmp_path_factory) -> CareRetriever:
    spec = f"faiss:{tmp_path_factory.mktemp('hyp') / 'store'}"
    DocumentStoreWriter(embedder, spec, show_progress=False).write(read_corpus(small_corpus_path))
    return CareRetriever(spec, embedder)


def _check_rows(vectors: np.ndarray, n: int, dim: int) -> None:
    assert vectors.shape == (n, dim) and vectors.dtype == np.float32
    assert np.isfinite(vectors).all()
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-3)


@SETTINGS
@given(texts=st.lists(TEXT, min_size=1, max_size=12))
def test_any_texts_encode_to_unit_rows_of_the_right_width(embedder, texts: list[str]) -> None:
    queries = embedder.embed_queries(texts, batch_size=5)
    documents = embedder.embed_documents(texts, batch_size=5)
    _check_rows(queries, len(texts), embedder.dim)
    _check_rows(documents, len(texts), embedder.dim)
    # A row does not depend on its batch (padding, length sorting): encode the first text alone.
    np.testing.assert_allclose(embedder.embed_queries(texts[:1]), queries[:1], atol=1e-4)
    np.testing.assert_allclose(embedder.embed_documents(texts[:1]), documents[:1], atol=1e-4)


@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(pieces=st.lists(SCRIPTS, min_size=1, max_size=5), repeat=st.integers(600, 3000))
def test_texts_far_beyond_max_length_are_truncated_and_reported_once(
    embedder, caplog, pieces: list[str], repeat: int
) -> None:
    long_text = ("高血压" + "".join(pieces)) * repeat
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="care_retriever"):
        vectors = embedder.embed_documents([long_text, "短", long_text[::-1]], batch_size=2)
    _check_rows(vectors, 3, embedder.dim)
    reports = [r for r in caplog.records if "truncated" in r.getMessage()]
    assert len(reports) == 1 and "2 of 3" in reports[0].getMessage()


def test_huge_batch(embedder) -> None:
    rng = np.random.default_rng(0)
    texts = [
        "".join(rng.choice(list("高血压感冒糖尿病腹泻失眠发烧 abc"), size=int(rng.integers(0, 12))))
        for _ in range(4000)
    ]
    vectors = embedder.embed_queries(texts, batch_size=512)
    _check_rows(vectors, 4000, embedder.dim)
    np.testing.assert_allclose(embedder.embed_queries(texts[1234:1236]), vectors[1234:1236], atol=1e-4)


@pytest.mark.parametrize("bad", [["ok", "\ud800"], ["ok", None], ["ok", b"bytes"], "a bare string"])
def test_invalid_text_lists_raise_input_error(embedder, bad) -> None:
    with pytest.raises(InputError):
        embedder.embed_queries(bad)
    with pytest.raises(InputError):
        embedder.embed_documents(bad)


def test_non_finite_embeddings_raise_instead_of_being_stored(tiny_model_dir: Path) -> None:
    broken = AsymmetricEmbedder.from_pretrained(tiny_model_dir, load="query")
    with torch.no_grad():
        next(broken.query_model.parameters()).fill_(float("nan"))
    with pytest.raises(ModelError, match="non-finite embeddings for input"):
        broken.embed_queries(["高血压", "感冒"])


@SETTINGS
@given(query=TEXT, top_k=st.integers(1, 20))
def test_any_query_searches_or_raises_input_error(retriever, query: str, top_k: int) -> None:
    try:
        hits = retriever.search(query, top_k=top_k)
    except InputError:
        assert not query.strip()
        return
    assert len(hits) == min(top_k, 6) and len({h.id for h in hits}) == len(hits)
    assert {h.id for h in hits} <= set("abcdef")
    assert all(-1.0001 <= h.score <= 1.0001 for h in hits)


DOC_IDS = st.text(min_size=1, max_size=12)
METADATA = st.dictionaries(
    st.text(max_size=8), st.one_of(st.text(max_size=8), st.integers(), st.booleans()), max_size=3
)
# A document with neither text nor title is refused at every door (test_conformance_doors): any other one round-trips.
STORABLE = st.builds(Document, id=DOC_IDS, text=TEXT, title=TEXT, metadata=METADATA).filter(
    lambda d: bool(d.text.strip() or d.title.strip())
)
DOCS = st.lists(STORABLE, min_size=1, max_size=8)


@settings(SETTINGS, max_examples=12)
@given(docs=DOCS)
def test_any_documents_round_trip_through_both_stores(embedder, docs: list[Document]) -> None:
    latest = {d.id: d for d in docs}  # repeated ids: the last one wins, as an upsert would
    with tempfile.TemporaryDirectory() as tmp:
        for spec in (f"faiss:{Path(tmp) / 'f'}", "qdrant::memory:"):
            writer = DocumentStoreWriter(embedder, spec, show_progress=False, chunk_size=3)
            report = writer.write(docs)
            assert report.count == len(latest) == writer.store.count()
            assert writer.store.get(list(latest)) == list(latest.values())
            hits = CareRetriever(writer.store, embedder).search("高血压", top_k=len(latest))
            assert sorted(h.id for h in hits) == sorted(latest)
            writer.store.close()


@SETTINGS
@given(
    lines=st.lists(
        st.one_of(
            st.binary(max_size=40),
            st.text(max_size=40).map(lambda t: t.encode()),
            st.builds(
                lambda i, t: json.dumps({"_id": i, "text": t}).encode(),
                st.one_of(st.text(max_size=5), st.integers(), st.none()),
                TEXT,
            ),
        ),
        max_size=8,
    )
)
def test_any_corpus_bytes_read_or_raise_input_error(lines: list[bytes]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "corpus.jsonl"
        path.write_bytes(b"\n".join(line.replace(b"\n", b" ") for line in lines))
        try:
            docs = list(read_corpus(path))
        except InputError as exc:
            assert "corpus.jsonl" in str(exc) and "\n" not in str(exc)
            return
        assert all(isinstance(d, Document) and d.id and (d.text.strip() or d.title.strip()) for d in docs)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
BODIES = st.one_of(
    JSON,
    st.fixed_dictionaries({"query": JSON}, optional={"top_k": JSON, "filters": JSON}),
    st.fixed_dictionaries(
        {"query": TEXT}, optional={"top_k": st.integers(-5, 200), "filters": st.dictionaries(st.text(max_size=6), JSON)}
    ),
)


@SETTINGS
@given(body=BODIES)
def test_the_service_answers_any_json_body_without_a_5xx(retriever, body) -> None:
    from fastapi.testclient import TestClient

    from care_retriever.search.server import ServiceLimits, create_app

    client = TestClient(create_app(retriever, ServiceLimits(max_top_k=10)), raise_server_exceptions=False)
    response = client.post(
        "/search", content=json.dumps(body, allow_nan=True), headers={"content-type": "application/json"}
    )
    assert response.status_code < 500, (body, response.text)
    if response.status_code != 200:
        assert response.json()["error"]
    else:
        results = response.json()["results"]
        assert all(len(r["hits"]) <= 10 for r in results)


def test_care_errors_are_one_line(embedder) -> None:
    with pytest.raises(CareError) as info:
        embedder.embed_queries(["\ud83d"])
    assert "\n" not in str(info.value) and "queries[0]" in str(info.value)
