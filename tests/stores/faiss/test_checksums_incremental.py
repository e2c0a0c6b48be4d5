"""A FAISS store's checksums kept incrementally: a small write hashes the docstore blocks it changed (damage in
blocks it did not touch stays caught), and ``verify`` catches a single flipped byte anywhere in any store file,
stores whose docstore was hashed whole included."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from care_retriever.documents import Document
from care_retriever.errors import StoreError
from care_retriever.stores.config import FaissIndexConfig, Quantize
from care_retriever.stores.faiss import DELTA, DOCSTORE, INDEX, MANIFEST, VECTORS, FaissStore
from tests.support.faiss_files import as_docstore_hashed_whole

DIM = 16
FILLER = "高血压患者应低盐饮食，规律服用降压药，定期监测血压。" * 40  # ~3 KB a text: a docstore of many blocks


def _documents(start: int, count: int) -> list[Document]:
    return [Document(id=f"d{i:05d}", text=f"{i} {FILLER}", metadata={"g": i % 3}) for i in range(start, start + count)]


def _vectors(count: int, seed: int) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((count, DIM)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def _build(folder: Path, count: int, options: FaissIndexConfig | None = None) -> None:
    store = FaissStore(folder)
    store.prepare(DIM, "fp", "model", options)
    store.upsert(_documents(0, count), _vectors(count, 0))
    store.finalize()
    store.close()


def _small_write(folder: Path, start: int, count: int = 3) -> None:
    with FaissStore(folder) as store, store.transaction() as tx:
        tx.upsert(_documents(start, count), _vectors(count, start))


def _verify(folder: Path) -> None:
    with FaissStore(folder) as store:
        store.verify()


def _flip(path: Path, offset: int) -> int:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        old = fh.read(1)[0]
        fh.seek(offset)
        fh.write(bytes([old ^ 0x5A]))
    return old


def _restore(path: Path, offset: int, old: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(bytes([old]))


def _offsets(size: int, rng: random.Random) -> list[int]:
    """The first and last bytes, SQLite's header fields a journal-mode switch rewrites, and random ones."""
    fixed = [0, 18, 19, 24, 27, 92, 95, size // 2, size - 1]
    return sorted({o for o in fixed if o < size} | {rng.randrange(size) for _ in range(12)})


def test_a_small_write_leaves_damage_in_blocks_it_did_not_change_caught(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    _build(folder, 400)  # ~1.3 MB of docstore: several checksum blocks
    _verify(folder)
    size = (folder / DOCSTORE).stat().st_size
    assert size > 1 << 20
    # a byte inside a stored text near the file's middle: no page a 3-document write at the end touches
    offset = (folder / DOCSTORE).read_bytes().index(f"200 {FILLER[:20]}".encode()) + 100
    _flip(folder / DOCSTORE, offset)
    _small_write(folder, 400)
    with pytest.raises(StoreError, match=r"docstore\.sqlite: checksum mismatch with manifest\.json in bytes"):
        _verify(folder)


@pytest.mark.parametrize("options", [None, FaissIndexConfig(quantize=Quantize.SQ8)], ids=["flat", "sq8"])
def test_verify_catches_a_flipped_byte_at_every_sampled_offset_of_every_file(
    tmp_path: Path, options: FaissIndexConfig | None
) -> None:
    folder = tmp_path / "store"
    _build(folder, 300, options)  # sq8 trains on its first 256 vectors
    _small_write(folder, 300)  # the delta, and the docstore's blocks recorded by a small write
    _small_write(folder, 303)
    names = [MANIFEST, INDEX, DOCSTORE, DELTA] + ([VECTORS] if options else [])
    assert sorted(p.name for p in folder.iterdir()) == sorted(names)
    _verify(folder)
    rng = random.Random(7)
    missed = []
    for name in names:
        path = folder / name
        for offset in _offsets(path.stat().st_size, rng):
            old = _flip(path, offset)
            try:
                _verify(folder)
                missed.append(f"{name}@{offset}")
            except StoreError:
                pass
            finally:
                _restore(path, offset, old)
    assert missed == []
    _verify(folder)  # every byte restored: it passes again


def test_a_store_whose_docstore_was_hashed_whole_verifies_and_takes_blocks_on_its_next_write(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    _build(folder, 50)
    as_docstore_hashed_whole(folder)
    _verify(folder)
    old = _flip(folder / DOCSTORE, 5000)
    with pytest.raises(StoreError, match=r"docstore\.sqlite: checksum mismatch"):
        _verify(folder)
    _restore(folder / DOCSTORE, 5000, old)
    _small_write(folder, 50)
    data = json.loads((folder / MANIFEST).read_text("utf-8"))
    assert DOCSTORE not in data["checksums"] and len(data["block_checksums"][DOCSTORE]) >= 1
    _verify(folder)
    with FaissStore(folder) as store:
        assert store.count() == 53


def _journal_mode_byte(folder: Path) -> int:
    """SQLite's header byte 18: 1 for the rollback journal, 2 for the write-ahead log."""
    with open(folder / DOCSTORE, "rb") as fh:
        return fh.read(19)[18]


def test_a_docstore_held_open_by_another_reader_stays_checked_and_returns_to_its_rollback_journal(
    tmp_path: Path,
) -> None:
    import sqlite3

    folder = tmp_path / "store"
    _build(folder, 50)
    _small_write(folder, 50)
    assert _journal_mode_byte(folder) == 1  # the write's log folded, the rollback journal back
    # a docstore in WAL mode (as a store upgraded from format 1 kept it) and a reader of it in another connection
    reader = sqlite3.connect(str(folder / DOCSTORE))
    try:
        assert reader.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
        _verify(folder)  # the journal-mode bytes are left out of the checksum, and consistent
        assert reader.execute("SELECT COUNT(*) FROM documents").fetchone()[0] == 53
        _small_write(folder, 53)  # the reader's connection keeps the docstore in WAL mode
        assert _journal_mode_byte(folder) == 2
        _small_write(folder, 56)
        _verify(folder)
        assert reader.execute("SELECT COUNT(*) FROM documents").fetchone()[0] == 59
    finally:
        reader.close()
    _small_write(folder, 59)
    assert _journal_mode_byte(folder) == 1
    _verify(folder)
