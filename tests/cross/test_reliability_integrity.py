"""Damaged stores and interrupted writes give a one-line error naming the file, never garbage results."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from care_retriever import CareRetriever, DocumentStoreWriter
from care_retriever.cli.main import main
from care_retriever.documents import Document
from care_retriever.errors import StoreError
from care_retriever.stores import open_store
from care_retriever.stores.faiss import DOCSTORE, INDEX, MANIFEST, FaissStore
from care_retriever.stores.faiss import files as faiss_files
from care_retriever.stores.qdrant import QdrantStore


@pytest.fixture
def faiss_dir(embedder, docs, tmp_path: Path) -> Path:
    folder = tmp_path / "store"
    DocumentStoreWriter(embedder, f"faiss:{folder}", show_progress=False).write(docs)
    return folder


def _drop_checksums(folder: Path) -> None:
    """The manifest of a store written before checksums were kept (nothing for verify to compare)."""
    manifest = json.loads((folder / MANIFEST).read_text())
    legacy = {k: v for k, v in manifest.items() if k not in ("block_checksums", "sealed", "manifest_sha256")}
    (folder / MANIFEST).write_text(json.dumps({**legacy, "checksums": {}}))


def test_truncated_index_without_checksums_is_reported_by_faiss(faiss_dir: Path) -> None:
    _drop_checksums(faiss_dir)  # even with no checksum to compare, FAISS's own reader must fail cleanly
    data = bytearray((faiss_dir / INDEX).read_bytes())
    data[:4] = b"XXXX"  # same size: the size check passes, the header is garbage
    (faiss_dir / INDEX).write_bytes(bytes(data))
    with pytest.raises(StoreError, match=r"index\.faiss: corrupted FAISS index"):
        open_store(f"faiss:{faiss_dir}")


def test_flipped_bytes_in_docstore_fail_the_checksum(faiss_dir: Path, capsys) -> None:
    data = bytearray((faiss_dir / DOCSTORE).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (faiss_dir / DOCSTORE).write_bytes(bytes(data))
    # Opening checks sizes and counts only; `verify` reads every byte.
    assert main(["verify", "--store", f"faiss:{faiss_dir}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "docstore.sqlite: checksum mismatch" in err


def test_garbage_docstore_without_checksums_is_named(faiss_dir: Path) -> None:
    _drop_checksums(faiss_dir)
    (faiss_dir / DOCSTORE).write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match=r"docstore\.sqlite: corrupted docstore"):
        open_store(f"faiss:{faiss_dir}")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", r"manifest\.json: unreadable manifest"),
        ('{"backend": "faiss", "dim": 32, "mystery": 1}', r"manifest\.json: malformed manifest"),
    ],
)
def test_bad_manifest_is_named(faiss_dir: Path, content: str, message: str) -> None:
    (faiss_dir / MANIFEST).write_text(content)
    with pytest.raises(StoreError, match=message):
        open_store(f"faiss:{faiss_dir}")


def test_cli_prints_one_line_for_a_corrupted_store(faiss_dir: Path, tiny_model_dir: Path, capsys) -> None:
    data = (faiss_dir / INDEX).read_bytes()
    (faiss_dir / INDEX).write_bytes(data[:-7])
    code = main(["search", "血压", "--model", str(tiny_model_dir), "--store", f"faiss:{faiss_dir}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "Traceback" not in err and len(err.splitlines()) == 1
    assert err.startswith("error: ") and "index.faiss: size mismatch" in err
    code = main(["verify", "--store", f"faiss:{faiss_dir}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "index.faiss: size mismatch" in err


def test_corrupted_checkpoint_names_the_staging_folder(embedder, docs, tmp_path: Path) -> None:
    folder = tmp_path / "s"
    store = FaissStore(folder)
    store.prepare(embedder.dim, embedder.space_fingerprint, "tiny")
    store.upsert(docs[:3], embedder.embed_documents([d.embedding_text() for d in docs[:3]]))
    store.commit()
    store.close()  # a writer that died after a checkpoint
    (store.staging / INDEX).write_bytes(b"\x00" * 40)
    with pytest.raises(StoreError, match=r"\.s\.staging/index\.faiss: corrupted checkpoint .* remove"):
        DocumentStoreWriter(embedder, f"faiss:{folder}", show_progress=False).write(docs)


def test_resume_reconciles_a_docstore_ahead_of_its_index(
    embedder, docs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kill between the docstore commit and the index write: rows without vectors are dropped and re-encoded."""
    folder = tmp_path / "s"
    vectors = embedder.embed_documents([d.embedding_text() for d in docs])
    store = FaissStore(folder)
    store.prepare(embedder.dim, embedder.space_fingerprint, "tiny")
    store.upsert(docs[:2], vectors[:2])
    store.commit()
    store.upsert(docs[2:4], vectors[2:4])

    def killed(*args: object) -> None:  # the process dies as the checkpoint writes its index
        raise KeyboardInterrupt

    with monkeypatch.context() as patch, pytest.raises(KeyboardInterrupt):
        patch.setattr(faiss_files, "write_index_atomic", killed)
        store.commit()  # the docstore is committed; the index file still holds 2 vectors
    store.close()
    report = DocumentStoreWriter(embedder, f"faiss:{folder}", show_progress=False).write(docs)
    assert (report.unchanged, report.added, report.count) == (2, 4, 6)
    reopened = FaissStore(folder)
    assert reopened.verify() == 6  # each document has its vector, and no vector is left without a document
    clean = tmp_path / "clean"
    DocumentStoreWriter(embedder, f"faiss:{clean}", show_progress=False).write(docs)
    query = embedder.embed_queries(["高血压"])
    assert [h.id for h in reopened.search(query, 6)[0]] == [h.id for h in FaissStore(clean).search(query, 6)[0]]


def test_a_kill_between_the_two_renames_of_finalize_serves_the_old_version(embedder, docs, faiss_dir: Path) -> None:
    writer = DocumentStoreWriter(embedder, f"faiss:{faiss_dir}", show_progress=False)
    store = writer.store
    assert isinstance(store, FaissStore)
    store.prepare(embedder.dim, embedder.space_fingerprint, "tiny")
    store.upsert([Document("new", "新增：痛风患者少吃海鲜")], embedder.embed_documents(["新增：痛风患者少吃海鲜"]))
    store.commit()
    store.close()
    faiss_dir.rename(faiss_dir.with_name(f".{faiss_dir.name}.old"))  # finalize() died right here
    reader = open_store(f"faiss:{faiss_dir}")
    assert reader.count() == len(docs) and reader.get(["new"]) == [None]
    reader.close()
    report = DocumentStoreWriter(embedder, f"faiss:{faiss_dir}", show_progress=False).write(docs)
    assert report.count == len(docs) + 1 and faiss_dir.is_dir()
    assert not faiss_dir.with_name(f".{faiss_dir.name}.old").exists()


def test_one_writer_at_a_time(embedder, docs, faiss_dir: Path) -> None:
    first, second = FaissStore(faiss_dir), FaissStore(faiss_dir)
    first.prepare(embedder.dim, embedder.space_fingerprint, "tiny")
    with pytest.raises(StoreError, match="another writer is indexing"):
        second.prepare(embedder.dim, embedder.space_fingerprint, "tiny")
    first.finalize()
    second.prepare(embedder.dim, embedder.space_fingerprint, "tiny")  # free again
    second.finalize()


def test_readers_see_the_published_store_while_a_writer_works(embedder, docs, faiss_dir: Path) -> None:
    reader = CareRetriever(f"faiss:{faiss_dir}", embedder)
    before = reader.search("高血压", top_k=10)
    writer = DocumentStoreWriter(embedder, f"faiss:{faiss_dir}", show_progress=False)
    writer.store.prepare(embedder.dim, embedder.space_fingerprint, "tiny")
    writer.store.upsert([Document("z", "高血压高血压")], embedder.embed_documents(["高血压高血压"]))
    writer.store.commit()
    assert reader.search("高血压", top_k=10) == before and open_store(f"faiss:{faiss_dir}").count() == len(docs)
    writer.store.finalize()
    assert open_store(f"faiss:{faiss_dir}").count() == len(docs) + 1
    # published: an open reader moves to the new version (no search mixes the two), as a fresh open answers
    after = reader.search("高血压", top_k=10)
    assert after == CareRetriever(f"faiss:{faiss_dir}", embedder).search("高血压", top_k=10)
    assert "z" in {hit.id for hit in after}


# ---------------------------------------------------------------- Qdrant local
def test_qdrant_newer_format_version_is_refused(embedder, docs, tmp_path: Path) -> None:
    path = str(tmp_path / "q")
    writer = DocumentStoreWriter(embedder, f"qdrant:{path}", show_progress=False)
    writer.write(docs)
    store = writer.store
    assert isinstance(store, QdrantStore) and store.manifest is not None
    store.close()
    manifest = tmp_path / "q" / "care" / "manifest.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "format_version": 7}))
    with pytest.raises(StoreError, match="format_version 7 is newer"):
        open_store(f"qdrant:{path}")


@pytest.mark.parametrize(
    ("damage", "message"),
    [("manifest.json", "damaged .*manifest.json"), ("shard/edge_config.json", "Qdrant Edge: ")],
)
def test_qdrant_corrupted_storage_is_named(embedder, docs, tmp_path: Path, damage: str, message: str) -> None:
    path = tmp_path / "q"
    writer = DocumentStoreWriter(embedder, f"qdrant:{path}", show_progress=False)
    writer.write(docs)
    writer.store.close()
    (path / "care" / damage).write_text('{"vectors": {"": {"size": 12')
    with pytest.raises(StoreError, match=message) as caught:
        open_store(f"qdrant:{path}")
    assert "\n" not in str(caught.value) and str(path) in str(caught.value)


def test_qdrant_folder_has_one_owner_at_a_time(embedder, docs, tmp_path: Path) -> None:
    path = f"qdrant:{tmp_path / 'q'}"
    writer = DocumentStoreWriter(embedder, path, show_progress=False)
    writer.write(docs)
    writer.store.close()
    first = open_store(path)
    with pytest.raises(StoreError, match="is open in another process") as caught:
        open_store(path)
    assert "\n" not in str(caught.value)
    first.close()
    open_store(path).close()  # released by close


def test_search_never_returns_rows_missing_from_the_docstore(embedder, docs, faiss_dir: Path) -> None:
    """A docstore row deleted behind the store's back (count check off): hits skip it instead of inventing text."""
    _drop_checksums(faiss_dir)
    con = sqlite3.connect(faiss_dir / DOCSTORE)
    con.execute("DELETE FROM documents WHERE id = 'a'")
    con.commit()
    con.close()
    store = open_store(f"faiss:{faiss_dir}")  # open does not count rows; verify does
    with pytest.raises(StoreError, match="count mismatch"):
        store.verify()
    hits = store.search(np.asarray(embedder.embed_queries(["高血压"])), 10)[0]
    assert {h.id for h in hits} == {"b", "c", "d", "e", "f"}
    shutil.rmtree(faiss_dir)
