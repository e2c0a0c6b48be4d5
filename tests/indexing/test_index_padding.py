"""Indexing batches: sorted by length over the whole input (a window of documents, not one chunk), the padding
reported, a token budget smaller than one document, the background tokenising thread, and repeated ids across
the chunks of one window."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch

from care_retriever.documents import Document
from care_retriever.indexing.config import EncodeConfig
from care_retriever.indexing.writer import DocumentStoreWriter
from care_retriever.model.embedder import AsymmetricEmbedder
from care_retriever.model.encoding import BatchLimits, auto_batch_limits, encode_texts
from care_retriever.stores.faiss import FaissStore
from tests.support.cli import run_cli

CHARS = "高血压患者应低盐饮食规律服用降压药定期监测感冒多由病毒引起休息喝水糖尿病控制运动遵医嘱使用降糖药物"


def mixed_documents(n: int = 256) -> list[Document]:
    """Lengths cycle from 2 to 49 characters, so every chunk of 16 holds short and long documents."""
    return [Document(id=f"d{i}", text=CHARS[(i * 5) % 10 :][: 2 + (i * 7) % 48] or CHARS[:2]) for i in range(n)]


@contextmanager
def forward_shapes(embedder: AsymmetricEmbedder) -> Iterator[list[tuple[int, int, int]]]:
    """(texts, padded width, real tokens) of every forward pass of the document tower."""
    shapes: list[tuple[int, int, int]] = []

    def record(_module, args) -> None:
        features = args[0]
        shapes.append((*features["input_ids"].shape, int(features["attention_mask"].sum())))

    handle = embedder.document_model[0].register_forward_pre_hook(record)
    try:
        yield shapes
    finally:
        handle.remove()


@contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """Fail instead of hanging: a batching loop that never moves on is an error here."""

    def expired(*_args) -> None:
        raise TimeoutError(f"still running after {seconds} s: the batching loop does not move on")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_batches_are_sorted_over_the_whole_input_not_per_chunk(embedder: AsymmetricEmbedder, tmp_path: Path) -> None:
    """Chunks of 16 mixed-length documents: sorted per chunk, each batch of 16 pads to the chunk's longest (about
    twice the real tokens); sorted over the window, a batch holds documents of one length."""
    docs = mixed_documents()
    writer = DocumentStoreWriter(
        embedder,
        f"faiss:{tmp_path / 's'}",
        show_progress=False,
        encode=EncodeConfig(batch_size=16, chunk_size=16, checkpoint_every=64),
    )
    with forward_shapes(embedder) as shapes:
        report = writer.write(docs)
    writer.store.close()
    padded = sum(n * width for n, width, _ in shapes)
    real = sum(tokens for _, _, tokens in shapes)
    assert report.added == len(docs) and sum(n for n, _, _ in shapes) == len(docs)
    assert padded / real <= 1.1, (padded / real, shapes)
    assert (report.tokens, report.padded_tokens) == (real, padded)
    assert report.padding_ratio == pytest.approx(padded / real)


def test_a_new_store_that_trains_on_its_first_vectors_gets_the_first_chunk_first(
    embedder: AsymmetricEmbedder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sq8 takes its value ranges from the first vectors written: those of the corpus's first documents, as before
    (not of its longest); the rest is sorted by length."""
    docs = mixed_documents(512)
    encoded: list[list[str]] = []
    for spec, options in ((f"faiss:{tmp_path / 'q'}", {"quantize": "sq8"}), (f"faiss:{tmp_path / 'f'}", None)):
        writer = DocumentStoreWriter(
            embedder,
            spec,
            index=options,
            show_progress=False,
            encode=EncodeConfig(chunk_size=256, checkpoint_every=256),
        )
        calls: list[list[str]] = []
        # the texts of each encode call, in the order the writer hands them to the embedder
        original = embedder.embed_documents

        def recording(texts, *args, _original=original, _calls=calls, **kwargs):
            _calls.append(list(texts))
            return _original(texts, *args, **kwargs)

        monkeypatch.setattr(embedder, "embed_documents", recording)
        writer.write(docs)
        writer.store.close()
        encoded.append(calls[0])
    quantized_first, flat_first = encoded
    assert quantized_first == [d.embedding_text() for d in docs[:256]]
    assert sorted(len(t) for t in flat_first) == sorted((len(d.text) for d in docs), reverse=True)[:256][::-1]


def test_window_sorted_vectors_are_the_documents_own(embedder: AsymmetricEmbedder, tmp_path: Path) -> None:
    """Documents encoded out of input order, a window at a time, still get their own vectors (by id)."""
    docs = mixed_documents(120)
    writer = DocumentStoreWriter(
        embedder,
        f"faiss:{tmp_path / 's'}",
        show_progress=False,
        encode=EncodeConfig(chunk_size=8, sort_window=50, checkpoint_every=20),
    )
    writer.write(docs)
    writer.store.close()
    store = FaissStore(tmp_path / "s")
    expected = embedder.embed_documents([d.embedding_text() for d in docs], batch_size=1)
    np.testing.assert_allclose(np.stack(store.vectors([d.id for d in docs])), expected, atol=1e-5)
    assert store.count() == len(docs)


def test_a_repeated_id_in_one_window_is_written_once_the_last_version(
    embedder: AsymmetricEmbedder, tmp_path: Path
) -> None:
    docs = [*mixed_documents(40), Document(id="d3", text="最后的版本：高血压患者应低盐饮食")]
    writer = DocumentStoreWriter(
        embedder, f"faiss:{tmp_path / 's'}", show_progress=False, encode=EncodeConfig(chunk_size=8)
    )
    report = writer.write(docs)
    writer.store.close()
    store = FaissStore(tmp_path / "s")
    assert store.count() == 40 and report.added == 40
    (vector,) = store.vectors(["d3"])
    np.testing.assert_allclose(vector, embedder.embed_documents(["最后的版本：高血压患者应低盐饮食"])[0], atol=1e-5)


def test_a_budget_smaller_than_one_document_sends_it_alone(embedder: AsymmetricEmbedder) -> None:
    texts = [d.text for d in mixed_documents(30)]
    reference = encode_texts(embedder.document_model, texts, batch_size=1)
    for prefetch in (False, True):
        with forward_shapes(embedder) as shapes, deadline(60):
            vectors = encode_texts(embedder.document_model, texts, batch_size=8, max_batch_tokens=1, prefetch=prefetch)
        np.testing.assert_allclose(vectors, reference, atol=1e-5)
        assert [n for n, _, _ in shapes] == [1] * len(texts)


def test_index_with_a_budget_smaller_than_one_document(capsys, tmp_path: Path, tiny_model_dir: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "".join(json.dumps({"_id": d.id, "text": d.text}, ensure_ascii=False) + "\n" for d in mixed_documents(24)),
        encoding="utf-8",
    )
    args = ["--model", tiny_model_dir, "--corpus", corpus, "--store", f"faiss:{tmp_path / 's'}", "--no-progress"]
    with deadline(120):
        code, out, err = run_cli(capsys, "index", *args, "--max-batch-tokens", "1", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["added"] == 24 and report["max_batch_tokens"] == 1
    # one document a pass: nothing padded
    assert report["padded_tokens"] == report["tokens"] > 0 and report["padding_ratio"] == 1.0


def test_index_json_reports_tokens_and_padding(capsys, tmp_path: Path, tiny_model_dir: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "".join(json.dumps({"_id": d.id, "text": d.text}, ensure_ascii=False) + "\n" for d in mixed_documents(64)),
        encoding="utf-8",
    )
    args = ["--model", tiny_model_dir, "--corpus", corpus, "--store", f"faiss:{tmp_path / 's'}", "--no-progress"]
    code, out, err = run_cli(capsys, "index", *args, "--json", "--batch-size", "8")
    assert code == 0, err
    report = json.loads(out)
    assert report["padded_tokens"] >= report["tokens"] > 64
    assert report["padding_ratio"] == pytest.approx(report["padded_tokens"] / report["tokens"], abs=1e-4)
    assert report["tokens_per_second"] > 0 and report["batch_size"] == 8
    assert report["max_batch_tokens"] is None  # auto: no budget on CPU
    code, _, err = run_cli(capsys, "index", *args, "--max-batch-tokens", "lots")
    assert code == 2 and "--max-batch-tokens must be an integer >= 1, auto or none" in err


def test_the_background_thread_gives_the_same_vectors_and_stops(embedder: AsymmetricEmbedder) -> None:
    import threading

    texts = [d.text for d in mixed_documents(200)]
    reference = encode_texts(embedder.document_model, texts, batch_size=1)
    stats: dict[str, int] = {}
    vectors = encode_texts(embedder.document_model, texts, batch_size=16, prefetch=True, stats=stats)
    np.testing.assert_allclose(vectors, reference, atol=1e-5)
    assert stats["tokens"] <= stats["padded_tokens"] <= 1.1 * stats["tokens"]
    assert not [t for t in threading.enumerate() if t.name == "care-encoding-prefetch"]


def test_an_error_in_the_background_thread_reaches_the_caller(embedder: AsymmetricEmbedder, monkeypatch) -> None:
    import threading

    from care_retriever.runtime import tokenised

    calls = {"n": 0}
    original = tokenised.TokenisedTexts.add

    def failing(self, idx, more=False):
        calls["n"] += 1
        if calls["n"] > 1:
            raise RuntimeError("tokenizer broke")
        return original(self, idx, more)

    monkeypatch.setattr(tokenised.TokenisedTexts, "add", failing)
    monkeypatch.setattr(tokenised, "GROUP_TEXTS", 64)
    texts = [d.text for d in mixed_documents(400)]
    with pytest.raises(RuntimeError, match="tokenizer broke"):
        encode_texts(embedder.document_model, texts, batch_size=16, prefetch=True)
    assert not [t for t in threading.enumerate() if t.name == "care-encoding-prefetch" and t.is_alive()]


def test_the_tokenizer_backend_gives_the_towers_own_batches(embedder: AsymmetricEmbedder, monkeypatch) -> None:
    """After the first group, texts are tokenised by the Rust backend directly once it gave the tower's own ids
    for that group; a text that may reach the max length goes through the tower's preprocess (its truncation)."""
    from care_retriever.runtime import tokenised

    monkeypatch.setattr(tokenised, "GROUP_TEXTS", 32)
    model = embedder.document_model
    texts = [d.text for d in mixed_documents(300)] + ["高血压" * 400]  # the last one is truncated
    reference = encode_texts(model, texts, batch_size=1)  # one group at a time of one text: no backend
    seen: list[bool | None] = []
    original = tokenised.TokenisedTexts.collate
    monkeypatch.setattr(
        tokenised.TokenisedTexts, "collate", lambda self, *a: seen.append(self.fast) or original(self, *a)
    )
    stats: dict[str, int] = {}
    vectors = encode_texts(model, texts, batch_size=16, stats=stats)
    np.testing.assert_allclose(vectors, reference, atol=1e-5)
    assert seen[-1] is True and stats["truncated"] == 1


def test_auto_limits_on_cpu_are_the_cpu_defaults(embedder: AsymmetricEmbedder) -> None:
    """``auto`` measures a token budget on CUDA only (measure_token_budget; not testable without a GPU)."""
    assert auto_batch_limits(embedder.document_model, None, "auto") == BatchLimits(16, None)
    assert auto_batch_limits(embedder.document_model, 64, 500) == BatchLimits(64, 500)
    assert auto_batch_limits(None, None, None) == BatchLimits(16, None)
    assert torch.device(embedder.document_model.device).type == "cpu"


def test_the_backend_verdict_holds_for_the_towers_later_calls(embedder: AsymmetricEmbedder, monkeypatch) -> None:
    """The index writer encodes a slice per call: once the backend gave the tower's own ids for a prompt, later calls
    with it tokenise with the backend from their first group instead of tokenising that group twice."""
    from care_retriever.runtime import tokenised

    monkeypatch.setattr(tokenised, "GROUP_TEXTS", 32)
    model = embedder.document_model
    texts = [d.text for d in mixed_documents(100)]
    reference = encode_texts(model, texts, batch_size=1)
    assert tokenised.fast_verdict(model, None) is True
    calls: list[int] = []
    original = tokenised.TokenisedTexts.preprocess
    monkeypatch.setattr(
        tokenised.TokenisedTexts, "preprocess", lambda self, idx: calls.append(len(idx)) or original(self, idx)
    )
    vectors = encode_texts(model, texts, batch_size=16)
    np.testing.assert_allclose(vectors, reference, atol=1e-5)
    assert calls == []  # no group through the tower's preprocess: none holds a text that may be truncated
