"""``verify`` of a Qdrant Edge store catches every single-byte flip in what the engine stores of each point: the
payload records (text, title, metadata, content hash, vector checksum, field names and the record's own
compression bytes) and the dense vectors, over sampled offsets, as FAISS's test does over its files."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from care_retriever.documents import Document
from care_retriever.errors import StoreError
from care_retriever.stores.qdrant.edge_store import EdgeStore

DIM = 16
POINTS = 40
BLOCK = 128  # Edge's payload storage keeps each record from a block of this many bytes (its config.json)


@pytest.fixture(scope="module")
def edge_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("edge-flips") / "store"
    vectors = np.random.default_rng(0).standard_normal((POINTS, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    documents = [
        Document(id=f"d{i}", text=f"高血压{i}", title=f"t{i}" if i % 2 else "", metadata={"g": i % 3, "tag": f"x{i}"})
        for i in range(POINTS)
    ]
    with EdgeStore(str(folder)) as store:
        store.prepare(DIM, "fp", "model")
        store.upsert(documents, vectors)
        store.finalize()
        assert store.verify() == POINTS
    return folder


def _file(folder: Path, pattern: str) -> Path:
    found = sorted(folder.rglob(pattern))
    assert len(found) == 1, found
    return found[0]


def _record_offsets(page: Path) -> list[int]:
    """The offsets of the bytes each payload record holds: from its block's start to its last non-zero byte
    (the zeros after it, up to the next block, are no record's)."""
    data = page.read_bytes()
    end = len(data.rstrip(b"\0"))
    starts = [s for s in range(0, end, BLOCK) if any(data[s : s + 4])]
    offsets: list[int] = []
    for start, following in zip(starts, [*starts[1:], end], strict=True):
        last = len(data[start:following].rstrip(b"\0"))
        offsets.extend(range(start, start + last))
    return offsets


def _verify_fails(folder: Path) -> str | None:
    """The line ``verify`` fails with, or None where it passes."""
    try:
        with EdgeStore(str(folder)) as store:
            store.verify()
    except StoreError as exc:
        return str(exc)
    return None


def _flipped(folder: Path, path: Path, offsets: list[int]) -> list[int]:
    """The offsets whose flip ``verify`` misses, each byte restored after its check."""
    missed = []
    for offset in offsets:
        with open(path, "r+b") as fh:
            fh.seek(offset)
            old = fh.read(1)[0]
            fh.seek(offset)
            fh.write(bytes([old ^ 0x5A]))
        try:
            if _verify_fails(folder) is None:
                missed.append(offset)
        finally:
            with open(path, "r+b") as fh:
                fh.seek(offset)
                fh.write(bytes([old]))
    return missed


def test_every_sampled_flip_in_the_payload_records_fails_verify(edge_folder: Path) -> None:
    page = _file(edge_folder, "payload_storage/page_0.dat")
    offsets = _record_offsets(page)
    assert len(offsets) > POINTS * 60  # every record's bytes, no padding
    assert _flipped(edge_folder, page, random.Random(1).sample(offsets, 30)) == []
    assert _verify_fails(edge_folder) is None  # every byte restored: it passes again


def test_every_sampled_flip_in_the_vector_storage_fails_verify(edge_folder: Path) -> None:
    chunk = _file(edge_folder, "vector_storage/vectors/chunk_*.mmap")
    assert _flipped(edge_folder, chunk, random.Random(2).sample(range(POINTS * DIM * 4), 15)) == []
    assert _verify_fails(edge_folder) is None


def _replace_in_page(folder: Path, old: bytes, new: bytes) -> None:
    page = _file(folder, "payload_storage/page_0.dat")
    data = page.read_bytes()
    assert data.count(old) == 1 and len(old) == len(new)
    page.write_bytes(data.replace(old, new))


def test_changed_metadata_and_a_renamed_payload_field_fail_verify_by_name(edge_folder: Path) -> None:
    _replace_in_page(edge_folder, b'"tag":"x7"', b'"tag":"y7"')  # a metadata value
    try:
        line = _verify_fails(edge_folder)
        assert line is not None and "'d7'" in line and "metadata no longer matches its content hash" in line, line
    finally:
        _replace_in_page(edge_folder, b'"tag":"y7"', b'"tag":"x7"')
    # the name of the vector's checksum: without the field the point would pass as written by an earlier release
    page = _file(edge_folder, "payload_storage/page_0.dat")
    at = page.read_bytes().index(b'"vector_checksum"')
    assert _flipped(edge_folder, page, [at + 2]) == []
    assert _verify_fails(edge_folder) is None


def test_an_engine_panic_on_a_damaged_tracker_is_one_line_naming_the_file(edge_folder: Path) -> None:
    # this byte of the payload tracker is a record's offset: the engine asserts on it (a Rust panic, which pyo3
    # raises as a BaseException); the file's checksum names it
    assert _verify_fails(edge_folder) is None  # opened once: the tracker's journal is folded into it
    tracker = _file(edge_folder, "payload_storage/tracker.dat")
    with open(tracker, "r+b") as fh:
        fh.seek(14)
        old = fh.read(1)[0]
        fh.seek(14)
        fh.write(bytes([old ^ 0x5A]))
    try:
        line = _verify_fails(edge_folder)
    finally:
        with open(tracker, "r+b") as fh:
            fh.seek(14)
            fh.write(bytes([old]))
    assert line is not None and "\n" not in line and "payload_storage/tracker.dat no longer matches" in line, line
    assert _verify_fails(edge_folder) is None
