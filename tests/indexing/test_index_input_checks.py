"""The index writer's input checks, made in bulk for a chunk of valid documents: a chunk holding a bad document
still gets the one-line error that names the first bad one (as a check of each document in turn gives), nothing is
written, and a new document's content hash is computed once (by the store that keeps it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from care_retriever.documents import Document
from care_retriever.errors import InputError
from care_retriever.indexing.writer import DocumentStoreWriter
from care_retriever.model.embedder import AsymmetricEmbedder
from care_retriever.model.text_checks import all_unicode, check_texts


def good(n: int = 50) -> list[Any]:
    return [
        Document(id=f"d{i}", text=f"高血压患者{i}", title="指南" if i % 2 else "", metadata={"i": i}) for i in range(n)
    ]


BAD: dict[str, tuple[Any, str]] = {
    "lone surrogate in the text": (Document(id="d30", text="高\ud800血压"), r"document 'd30' text: not valid Unicode"),
    "lone surrogate in the id": (Document(id="d\udc80", text="高血压"), r"document 'd\\udc80' id: not valid Unicode"),
    "title not a str": (Document(id="d30", text="高血压", title=3), "document 'd30': title must be a str, got int"),  # type: ignore[arg-type]
    "text as bytes": (Document(id="d30", text=b"x"), "document 'd30': text must be a str, got bytes"),  # type: ignore[arg-type]
    "empty id": (Document(id="", text="高血压"), "document id must be a non-empty str, got ''"),
    "id not a str": (Document(id=30, text="高血压"), "document id must be a non-empty str, got 30"),  # type: ignore[arg-type]
    "no text": (Document(id="d30", text="  ", title=""), "empty text for document 'd30'"),
    "surrogate in metadata": (
        Document(id="d30", text="高血压", metadata={"k": "\ud83d"}),
        "document 'd30' metadata: not valid Unicode",
    ),
    "metadata not JSON": (
        Document(id="d30", text="高血压", metadata={"k": object()}),
        "document 'd30': metadata is not JSON-serialisable",
    ),
    "not a document": ({"id": "d30", "text": "高血压"}, "expected care_retriever.documents.Document, got dict"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_document_among_good_ones_is_named_and_nothing_is_written(
    embedder: AsymmetricEmbedder, tmp_path: Path, case: str
) -> None:
    bad, message = BAD[case]
    docs = good()
    docs[30] = bad
    docs[40] = Document(id="d40", text="")  # a later bad document: the first one's error is the one raised
    writer = DocumentStoreWriter(embedder, f"faiss:{tmp_path / 's'}", show_progress=False, sparse=False)
    with pytest.raises(InputError, match=message) as info:
        writer.write(docs)
    assert "\n" not in str(info.value)
    writer.store.close()
    assert not (tmp_path / "s").exists()  # refused before anything was published


def test_texts_to_encode_name_the_first_bad_one(embedder: AsymmetricEmbedder) -> None:
    texts: list[Any] = ["高血压"] * 2000
    assert check_texts(texts, "documents") == texts and all_unicode(texts)
    for bad, message in (
        ("感\udfff冒", r"documents\[1500\]: not valid Unicode"),
        (None, r"documents\[1500\]: expected str"),
    ):
        texts[1500], texts[1800] = bad, "\ud800"
        assert not all_unicode(texts)
        with pytest.raises(InputError, match=message):
            embedder.embed_documents(texts)
    # two lone halves of one pair, each in its own text: not a pair once joined
    assert not all_unicode(["高\ud83d", "\ude00血压"])


def test_a_new_document_is_hashed_once_by_the_store(
    embedder: AsymmetricEmbedder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    original = Document.content_hash
    monkeypatch.setattr(Document, "content_hash", lambda self: calls.append(self.id) or original(self))
    docs = good()
    store = f"faiss:{tmp_path / 's'}"
    report = DocumentStoreWriter(embedder, store, show_progress=False, sparse=False).write(docs)
    assert report.added == 50 and sorted(calls) == sorted(d.id for d in docs)  # by the docstore, not the writer
    calls.clear()
    docs[7] = Document(id="d7", text="感冒多由病毒引起")
    report = DocumentStoreWriter(embedder, store, show_progress=False, sparse=False).write(docs)
    # held ids are compared by hash: one changed document re-encoded, stored (hashed again) and the rest skipped
    assert (report.updated, report.unchanged) == (1, 49) and sorted(calls) == sorted([d.id for d in docs] + ["d7"])


def test_a_corpus_too_small_to_train_a_new_quantized_index_is_one_line_before_encoding(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """sq8 trains on its first 256 vectors: a corpus of 5 cannot fill that batch whatever the chunk size, so the
    line says what to do instead (not "raise the chunk size") and nothing is written."""
    from tests.support.cli import run_cli
    from tests.support.data import write_jsonl

    corpus = write_jsonl(tmp_path / "c.jsonl", [{"_id": f"d{i}", "text": f"高血压 第{i}条"} for i in range(5)])
    store = tmp_path / "store"
    code, _, err = run_cli(
        capsys, "index", "--model", tiny_model_dir, "--corpus", corpus, "--store", f"faiss:{store}", "--quantize", "sq8"
    )
    line = err.strip()
    assert code == 2 and "\n" not in line and "chunk size" not in line, err
    assert f"--quantize sq8 trains on the first 256 vectors written and {corpus} holds 5 documents" in line, line
    assert "leave out --quantize" in line and not store.exists()
