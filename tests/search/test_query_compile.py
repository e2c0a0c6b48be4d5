"""The query tower compiled for a long-running server (``serve --compile``, ``load_query_embedder(compile=True)``):
the compiled tower gives the eager vectors, a compiler that fails leaves it eager with one warning line, an export
backend refuses the option in one line, and ``/health`` reports the state."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from care_retriever.errors import InputError
from care_retriever.model.compiled import is_compiled, query_compile_state
from care_retriever.search.backends import load_query_embedder
from tests.support.data import sample_queries
from tests.support.models import exported_tiny_model

QUERIES = [*sample_queries(), "感冒", "孩子发烧三十九度，精神还可以，需要马上去医院吗？" * 3]


@pytest.mark.slow  # inductor compiles the tiny tower's layers: 30 s with a cold cache on the 2-core CPU machines
def test_the_compiled_query_tower_gives_the_eager_vectors(tiny_model_dir: Path) -> None:
    eager = load_query_embedder(tiny_model_dir, "torch", device="cpu")
    compiled = load_query_embedder(tiny_model_dir, "torch", device="cpu", compile=True)
    state = query_compile_state(compiled.query_model)  # type: ignore[attr-defined]
    assert state.startswith("on (") and is_compiled(compiled.query_model), state  # type: ignore[attr-defined]
    assert query_compile_state(eager.query_model) == "off"  # type: ignore[attr-defined]
    for batch in (1, 32):  # one query at a time (a server's batch of one) and batches of mixed lengths
        a = eager.embed_queries(QUERIES, batch_size=batch)
        b = compiled.embed_queries(QUERIES, batch_size=batch)
        assert float((a * b).sum(axis=1).min()) >= 0.9999


def test_after_the_warm_up_queries_compile_nothing_more(
    tiny_model_dir: Path,
    compiled_graphs: list[int],
) -> None:
    """A server's requests (one query, or batches of mixed lengths) run the graphs the start compiled."""
    embedder = load_query_embedder(tiny_model_dir, "torch", device="cpu", compile=True)
    assert query_compile_state(embedder.query_model).startswith("on (")  # type: ignore[attr-defined]
    after_warm_up = len(compiled_graphs)
    assert after_warm_up > 0
    for size in (1, 1, 2, 3, 5, 8, 13, 21, 32):
        for start in (0, 40):
            embedder.embed_queries(QUERIES[start : start + size], batch_size=32)
    embedder.embed_queries([QUERIES[-1]])  # the longest query alone
    assert len(compiled_graphs) == after_warm_up


def test_a_query_tower_compile_that_fails_runs_eager_in_one_line(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    before = load_query_embedder(tiny_model_dir, "torch", device="cpu").embed_queries(QUERIES)

    def no_compiler(fn, **kwargs):
        def broken(*args, **kw):
            raise RuntimeError("no C++ compiler found\nsecond line")

        return broken

    monkeypatch.setattr(torch, "compile", no_compiler)
    # at the logger's own level: an earlier test in this worker may have quietened the package's logger
    with caplog.at_level("WARNING", logger="care_retriever"):
        embedder = load_query_embedder(tiny_model_dir, "torch", device="cpu", compile=True)
    assert query_compile_state(embedder.query_model) == "off (failed: no C++ compiler found)"  # type: ignore[attr-defined]
    assert not is_compiled(embedder.query_model)  # type: ignore[attr-defined]
    assert "torch.compile of the query tower failed (no C++ compiler found); running eager" in caplog.text
    np.testing.assert_allclose(embedder.embed_queries(QUERIES), before, atol=1e-6)


def test_compile_is_refused_in_one_line_for_an_export(tmp_path: Path, small_corpus_path: Path) -> None:
    model = exported_tiny_model(tmp_path, small_corpus_path, "onnx")
    with pytest.raises(InputError, match=r"^--compile compiles the torch query tower: use --backend torch \(onnx"):
        load_query_embedder(model, "auto", compile=True)


def test_health_reports_whether_the_query_tower_is_compiled(tiny_model_dir: Path, tmp_path: Path) -> None:
    from care_retriever import AsymmetricEmbedder, CareRetriever, DocumentStoreWriter
    from care_retriever.documents import Document
    from care_retriever.search.server import create_app

    spec = f"faiss:{tmp_path / 'store'}"
    embedder = AsymmetricEmbedder.from_pretrained(tiny_model_dir, load="document")
    DocumentStoreWriter(embedder, spec, show_progress=False, sparse=False).write([Document("a", "感冒多喝水")])
    retriever = CareRetriever.from_pretrained(str(tiny_model_dir), spec, backend="torch")
    try:
        for state in ("off", "on (12.5 s)"):
            with TestClient(create_app(retriever, query_compile=state)) as client:
                assert client.get("/health").json()["query_compile"] == state
    finally:
        retriever.close()
