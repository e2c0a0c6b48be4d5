"""The index writer's store writes on a thread of their own while the next slice encodes: they overlap encoding,
an error raised there reaches the caller as itself, nothing after it is written or checkpointed, and a run
stopped by one resumes with every document once."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from care_retriever.errors import ModelError, StoreError
from care_retriever.indexing.corpus import Document
from care_retriever.indexing.writer import DocumentStoreWriter
from care_retriever.model.embedder import AsymmetricEmbedder
from care_retriever.stores.faiss import FaissStore
from tests.support.faiss_files import published_faiss_state

CHARS = "高血压患者应低盐饮食规律服用降压药定期监测感冒多由病毒引起休息喝水糖尿病控制运动遵医嘱使用降糖药物"
# slices of 50 documents, each checkpointed: six slices for 300 documents
SIZES = {"batch_size": 16, "chunk_size": 50, "checkpoint_every": 50}


def documents(n: int = 300) -> list[Document]:
    return [Document(id=f"d{i}", text=CHARS[i % 20 :][: 3 + (i * 7) % 40], metadata={"i": i}) for i in range(n)]


def write(embedder: AsymmetricEmbedder, folder: Path, docs: list[Document], **options: object) -> object:
    writer = DocumentStoreWriter(embedder, f"faiss:{folder}", show_progress=False, **SIZES, **options)  # type: ignore[arg-type]
    try:
        return writer.write(docs)
    finally:
        writer.store.close()


def test_a_slice_is_written_while_the_next_one_encodes(
    embedder: AsymmetricEmbedder, tmp_path: Path, monkeypatch
) -> None:
    """Each upsert waits (up to 5 s) for the next slice's encoding to start: inline, it never would."""
    encoding_started = threading.Event()
    overlapped: list[bool] = []
    threads: set[str] = set()
    original_upsert, original_embed = FaissStore.upsert, AsymmetricEmbedder.embed_documents

    def upsert(self, docs, vectors, **kwargs):
        threads.add(threading.current_thread().name)
        encoding_started.clear()
        original_upsert(self, docs, vectors, **kwargs)
        if len(overlapped) < 3:  # the first slices: a later one may be the last
            overlapped.append(encoding_started.wait(timeout=5))

    def embed(self, texts, **kwargs):
        encoding_started.set()
        return original_embed(self, texts, **kwargs)

    monkeypatch.setattr(FaissStore, "upsert", upsert)
    monkeypatch.setattr(AsymmetricEmbedder, "embed_documents", embed)
    report = write(embedder, tmp_path / "store", documents())
    assert overlapped == [True, True, True]
    assert threads == {"care-store-writes"}
    assert report.added == report.count == 300  # type: ignore[attr-defined]
    assert not [t for t in threading.enumerate() if t.name == "care-store-writes" and t.is_alive()]


@pytest.mark.parametrize("overlap", [True, False])
def test_an_error_in_a_store_write_is_raised_as_itself_and_the_run_resumes(
    embedder: AsymmetricEmbedder, tmp_path: Path, monkeypatch, overlap: bool
) -> None:
    """The third slice's write fails after its rows reached the staging store: the caller gets that error, the two
    checkpoints before it are all that is kept, and a second run adds the rest: every document once, the vectors
    a clean run gives."""
    docs = documents()
    boom = StoreError("faiss:store: disk full")
    calls = {"upsert": 0, "commit": 0}
    original_upsert, original_commit = FaissStore.upsert, FaissStore.commit

    def upsert(self, *args, **kwargs):
        calls["upsert"] += 1
        original_upsert(self, *args, **kwargs)
        if calls["upsert"] == 3:
            raise boom

    def commit(self):
        calls["commit"] += 1
        original_commit(self)

    folder = tmp_path / "store"
    with monkeypatch.context() as patch:
        patch.setattr(FaissStore, "upsert", upsert)
        patch.setattr(FaissStore, "commit", commit)
        with pytest.raises(StoreError) as raised:
            write(embedder, folder, docs, overlap_writes=overlap)
    assert raised.value is boom and str(raised.value) == "faiss:store: disk full"
    # nothing after the failing write: no upsert, no checkpoint (the half-written third slice is not recorded)
    assert calls == {"upsert": 3, "commit": 2}
    assert not [t for t in threading.enumerate() if t.name == "care-store-writes" and t.is_alive()]
    resumed = write(embedder, folder, docs, overlap_writes=overlap)
    assert (resumed.unchanged, resumed.added, resumed.count) == (100, 200, 300)  # type: ignore[attr-defined]
    write(embedder, tmp_path / "clean", docs, overlap_writes=False)
    got, want = published_faiss_state(folder), published_faiss_state(tmp_path / "clean")
    assert sorted(got) == sorted(want) == sorted(d.id for d in docs)
    np.testing.assert_allclose(np.stack(list(got.values())), np.stack(list(want.values())), atol=1e-5)


def test_an_encoding_error_lets_the_encoded_slices_be_written_first(
    embedder: AsymmetricEmbedder, tmp_path: Path, monkeypatch
) -> None:
    """As when each slice was written before the next encoded: the slices encoded before the error are written and
    checkpointed, and the encoding error is the one raised."""
    calls = {"n": 0}
    original = AsymmetricEmbedder.embed_documents

    def embed(self, texts, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4:
            raise ModelError("the tower broke")
        return original(self, texts, **kwargs)

    folder = tmp_path / "store"
    with monkeypatch.context() as patch:
        patch.setattr(AsymmetricEmbedder, "embed_documents", embed)
        with pytest.raises(ModelError, match="the tower broke"):
            write(embedder, folder, documents())
    resumed = write(embedder, folder, documents())
    assert (resumed.unchanged, resumed.added, resumed.count) == (150, 150, 300)  # type: ignore[attr-defined]


def test_writes_overlap_by_default_only_where_measured(embedder: AsymmetricEmbedder, tmp_path: Path) -> None:
    """A FAISS store written by this process overlaps its writes; torchrun's rank 0 (an encoder of its own, which
    runs the job's collectives) and a Qdrant store keep them inline."""
    assert DocumentStoreWriter(embedder, f"faiss:{tmp_path / 'a'}", show_progress=False).overlap_writes
    sharded = DocumentStoreWriter(
        embedder, f"faiss:{tmp_path / 'b'}", show_progress=False, encoder=embedder.embed_documents
    )
    assert not sharded.overlap_writes
    assert not DocumentStoreWriter(embedder, "qdrant::memory:", show_progress=False).overlap_writes
