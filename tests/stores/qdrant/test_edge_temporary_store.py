"""``qdrant::memory:`` is a real Edge shard in a temporary folder: the folder goes with the store, whether the
store is closed, dropped, or never closed by a script that just ends."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("qdrant_edge")

from care_retriever.documents import Document
from care_retriever.stores import open_store
from care_retriever.stores.base import VectorStore

REPO = Path(__file__).resolve().parents[3]


def written(store: VectorStore) -> VectorStore:
    """``store`` with five documents written and committed."""
    store.prepare(8, "fp-test", "tiny")
    docs = [Document(id=f"d{i}", text=f"text {i}", metadata={"n": i}) for i in range(5)]
    vectors = np.random.default_rng(0).normal(size=(5, 8)).astype(np.float32)
    store.upsert(docs, vectors / np.linalg.norm(vectors, axis=1, keepdims=True))
    store.commit()
    return store


def _left(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("care-qdrant-*"))


def test_a_script_that_never_closes_its_store_leaves_no_folder(tmp_path: Path) -> None:
    script = (
        "from care_retriever.stores import open_store\n"
        "from tests.stores.qdrant.test_edge_temporary_store import written\n"
        "print(written(open_store('qdrant::memory:')).root)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert Path(done.stdout.strip()).parent == tmp_path  # the store did make its folder there
    assert _left(tmp_path) == []
    assert "Traceback" not in done.stderr and "panicked" not in done.stderr, done.stderr[-2000:]


def test_a_dropped_store_takes_its_folder_and_a_closed_one_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    store = written(open_store("qdrant::memory:"))
    root = store.root
    assert root.parent == tmp_path and store.count() == 5
    del store
    gc.collect()
    assert not root.exists() and _left(tmp_path) == []

    store = open_store("qdrant::memory:")
    store.prepare(8, "fp-test", "tiny")
    store.upsert([Document(id="a", text="a")], np.ones((1, 8), dtype=np.float32) / np.sqrt(8))
    root = store.root
    store.close()
    assert not root.exists()
    del store
    gc.collect()  # the finalizer then finds nothing to remove, and says nothing
    assert _left(tmp_path) == []
