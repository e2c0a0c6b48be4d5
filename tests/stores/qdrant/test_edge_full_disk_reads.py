"""A Qdrant Edge store on a full disk (a small tmpfs filled for real; root only, skipped where the mount is refused)
still answers reads: Edge cannot open a shard read-only (opening writes a 32 MiB log), so the store reads a
temporary copy on another disk, refuses writes in one line and leaves its own files unchanged; with no other disk
with room, opening is one line saying how to read it."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("qdrant_edge")

from care_retriever.cli.main import main
from care_retriever.documents import Document
from care_retriever.errors import WriteError
from care_retriever.stores.qdrant import EdgeStore, edge_space

DIM = 8


@pytest.fixture
def full_disk_store(tmp_path: Path) -> Iterator[tuple[Path, np.ndarray]]:
    """An Edge store of 100 documents on a 96 MB tmpfs, then the disk filled to half what opening a shard needs."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (not root, or no mount permission)")
    try:
        vectors = np.random.default_rng(0).normal(size=(100, DIM)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        with EdgeStore(str(disk / "q")) as store:
            store.prepare(DIM, "fp", "m")
            store.upsert([Document(id=f"d{i}", text=f"高血压 {i}") for i in range(100)], vectors)
            store.finalize()
        with open(disk / "ballast", "wb") as fh:
            fh.write(bytes(shutil.disk_usage(disk).free - edge_space.OPEN_SHARD // 2))
        yield disk / "q", vectors
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def _digest(folder: Path) -> dict[str, str]:
    files = (p for p in folder.rglob("*") if p.is_file())
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def test_reads_on_a_full_disk_answer_from_a_copy_and_writes_are_one_line(
    full_disk_store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    store_path, vectors = full_disk_store
    scratch = tmp_path / "scratch"  # another disk, with room
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    before = _digest(store_path)
    with EdgeStore(str(store_path)) as store:
        assert store.count() == store.verify() == 100
        assert store.search(vectors[3:4], 1)[0][0].id == "d3"
        with pytest.raises(WriteError, match="opened for reading from a copy") as refused:
            store.upsert([Document(id="new", text="新文档")], vectors[:1])
        assert "\n" not in str(refused.value)
    assert list(scratch.iterdir()) == []  # the copy is removed on close
    assert _digest(store_path) == before
    caplog.clear()
    assert main(["info", "--store", f"qdrant:{store_path}", "--json"]) == 0
    assert "the disk is full (opening needs 40 MB free); reading a temporary copy" in caplog.text


def test_with_no_other_disk_with_room_opening_says_how_to_read_in_one_line(
    full_disk_store, monkeypatch: pytest.MonkeyPatch
) -> None:
    store_path, _ = full_disk_store
    monkeypatch.setattr(tempfile, "tempdir", str(store_path.parent))  # the full disk itself
    with pytest.raises(WriteError, match="opening needs 40 MB free, even to read") as caught:
        EdgeStore(str(store_path))
    assert "\n" not in str(caught.value) and "set TMPDIR to a folder on a disk with" in str(caught.value)
