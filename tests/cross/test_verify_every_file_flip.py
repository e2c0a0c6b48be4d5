"""``care-retriever verify`` catches a flipped byte in every file of a store, for both store kinds: a small FAISS
store after an in-place write (index, docstore, delta journal, manifest), and a small Qdrant Edge store with an
optimized segment (HNSW graph, int8 codes), an appendable one holding later writes and a deletion, payload indexes,
trackers with their journals, the write-ahead log, the shard's settings, the manifest, and the record of what the
engine changed as it opened the shard since the last commit. Each file gets a byte
flipped at its start, middle and end and at one seeded position among its non-zero bytes; each flip fails verify
with one line naming the file (or, for a stored text or vector, its document), and is undone before the next."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np

from care_retriever.documents import Document
from care_retriever.stores.config import QdrantCollectionConfig, QdrantQuantize
from care_retriever.stores.faiss import FaissStore
from care_retriever.stores.qdrant.edge_store import EdgeStore
from tests.support.cli import one_line, run_cli

DIM = 16
N = 40
VECTORS = np.random.default_rng(3).standard_normal((N + 5, DIM)).astype(np.float32)
VECTORS /= np.linalg.norm(VECTORS, axis=1, keepdims=True)
DOCUMENTS = [Document(id=f"d{i}", text=f"高血压 第{i}条", metadata={"g": i % 3}) for i in range(N + 5)]
# A file of zero bytes has no byte to flip: its recorded size (0) is checked, so a byte written into it fails
# verify (checked below). Edge keeps the BM25 side's inverted index of an optimized segment as such a file.
EMPTY_FILES = {"inverted_index.dat"}


def _positions(path: Path, seed: int) -> list[int]:
    """The start, middle and end of a file, and one seeded position among its non-zero bytes."""
    size = path.stat().st_size
    data = np.fromfile(path, dtype=np.uint8)
    nonzero = np.flatnonzero(data)
    chosen = {0, size // 2, size - 1}
    if nonzero.size:
        chosen.add(int(nonzero[random.Random(seed).randrange(nonzero.size)]))
    return sorted(chosen)


def _flip(path: Path, position: int) -> int:
    with open(path, "r+b") as fh:
        fh.seek(position)
        old = fh.read(1)[0]
        fh.seek(position)
        fh.write(bytes([old ^ (0xFF if position % 2 else 0x01)]))  # every bit of the byte, or one
    return old


def _restore(path: Path, position: int, old: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(position)
        fh.write(bytes([old]))


def _every_flip_fails(capsys, spec: str, root: Path, files: list[Path], names: list[str]) -> None:
    """Flip each position of each file in turn: verify fails in one line naming the file (its path under
    ``root``) or one of ``names``; the byte is restored, and verify passes again at the end."""
    for seed, path in enumerate(files):
        for position in _positions(path, seed):
            old = _flip(path, position)
            try:
                code, _, err = run_cli(capsys, "verify", "--store", spec)
            finally:
                _restore(path, position, old)
            line = one_line(err)
            named = path.relative_to(root).as_posix() in line or any(name in line for name in names)
            assert code == 2 and named, f"{path.relative_to(root)} at {position}: exit {code}, {line}"
    code, out, err = run_cli(capsys, "verify", "--store", spec)
    assert code == 0 and "every check passed" in out, err


def test_every_file_of_a_faiss_store_fails_verify_when_a_byte_flips(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "faiss"
    with FaissStore(folder) as store:
        store.prepare(DIM, "fp", "model")
        store.upsert(DOCUMENTS[:N], VECTORS[:N])
        store.finalize()
    with FaissStore(folder) as store, store.transaction() as tx:  # an in-place write: the delta journal
        tx.upsert(DOCUMENTS[N:], VECTORS[N:])
        tx.delete(["d3"])
    files = sorted(p for p in folder.iterdir() if p.is_file())
    assert {"index.faiss", "docstore.sqlite", "vectors.delta", "manifest.json"} <= {p.name for p in files}
    _every_flip_fails(capsys, f"faiss:{folder}", folder, files, [])


def test_every_file_of_a_qdrant_edge_store_fails_verify_when_a_byte_flips(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "edge"
    with EdgeStore(str(folder)) as store:
        store.prepare(DIM, "fp", "model", QdrantCollectionConfig(quantize=QdrantQuantize.SQ8, indexing_threshold=1))
        store.upsert(DOCUMENTS[:N], VECTORS[:N])
        store.finalize()  # an optimized segment: HNSW graph and int8 codes
        store.upsert(DOCUMENTS[N:], VECTORS[N:])  # into an appendable segment
        store.delete(["d3"])
        store.commit()
    collection = folder / "care"
    files = sorted(p for p in collection.rglob("*") if p.is_file())
    names = {p.name for p in files}
    assert {"id_tracker.mappings", "mutable_id_tracker.mappings", "tracker_journal.dat", "segment.json"} <= names
    assert any("vector_index" in p.as_posix() for p in files) and any("wal" in p.parts for p in files)
    empty = [p for p in files if p.stat().st_size == 0]
    assert {p.name for p in empty} <= EMPTY_FILES, empty
    # the files the engine reads as it opens the shard first: the stored texts and vectors (checked point by
    # point) go last, as the open they reach consumes the trackers' journals
    point_data = [p for p in files if p.name.startswith(("page_", "chunk_")) and "storage" in p.parent.as_posix()]
    ordered = [p for p in files if p not in point_data and p not in empty] + point_data
    _every_flip_fails(capsys, f"qdrant:{folder}", collection, ordered, [repr(d.id) for d in DOCUMENTS])
    # what the opens since the last commit changed (journals replayed, trackers rewritten) is kept beside the shard
    added = sorted(p for p in collection.rglob("*") if p.is_file() and p not in files)
    assert [p.name for p in added] == ["opened.json"], added
    _every_flip_fails(capsys, f"qdrant:{folder}", collection, added, [])
    for path in empty:
        with open(path, "ab") as fh:
            fh.write(b"\x01")
        code, _, err = run_cli(capsys, "verify", "--store", f"qdrant:{folder}")
        path.write_bytes(b"")
        assert code == 2 and path.relative_to(collection).as_posix() in one_line(err), err


def test_an_edge_store_verified_again_and_again_still_passes(tmp_path: Path, capsys) -> None:
    # each open changes engine files (journals replayed and removed, a tracker rewritten after a deletion): what it
    # changed is recorded, never reported as damage
    folder = tmp_path / "edge"
    with EdgeStore(str(folder)) as store:
        store.prepare(DIM, "fp", "model", QdrantCollectionConfig(indexing_threshold=1))
        store.upsert(DOCUMENTS[:N], VECTORS[:N])
        store.finalize()
        assert store.delete(["d1", "d2"]) == 2
        store.commit()
    for _ in range(3):
        code, out, err = run_cli(capsys, "verify", "--store", f"qdrant:{folder}")
        assert code == 0 and f"holds {N - 2} documents" in out, err
