"""The checksums of a Qdrant Edge shard's files, recorded at each commit: a small write hashes the files it
changed, never an optimized segment's; ``verify`` names a point count that differs from the last commit's; a
checksum covers a file's content, not its holes; a log segment is read again from its last block with data; a store
written without file checksums verifies as before and records them on request."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from care_retriever.documents import Document
from care_retriever.errors import StoreError
from care_retriever.stores.config import QdrantCollectionConfig
from care_retriever.stores.qdrant import edge_files, edge_opening
from care_retriever.stores.qdrant.edge_manifest import MANIFEST_FILE, read_manifest, write_manifest
from care_retriever.stores.qdrant.edge_store import EdgeStore

DIM = 16
N = 60
VECTORS = np.random.default_rng(5).standard_normal((N + 10, DIM)).astype(np.float32)
VECTORS /= np.linalg.norm(VECTORS, axis=1, keepdims=True)
DOCUMENTS = [Document(id=f"d{i}", text=f"糖尿病 第{i}条") for i in range(N + 10)]


def _optimized_store(folder: Path) -> None:
    with EdgeStore(str(folder)) as store:
        store.prepare(DIM, "fp", "model", QdrantCollectionConfig(indexing_threshold=1))
        store.upsert(DOCUMENTS[:N], VECTORS[:N])
        store.finalize()


def test_a_small_write_hashes_no_vector_graph_or_text_of_an_optimized_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "edge"
    _optimized_store(folder)
    optimized = [p.parent for p in folder.rglob("id_tracker.mappings")]  # the immutable id tracker's segment
    assert len(optimized) == 1
    stored = [  # what the segment holds of its points: their vectors, graph, texts, ids
        p
        for p in optimized[0].rglob("*")
        if p.is_file() and ({"vector_storage", "vector_index"} & set(p.parts) or p.name.startswith(("page_", "id_")))
    ]
    assert len(stored) >= 4
    hashed: list[Path] = []
    checksum, blocks = edge_files.file_checksum, edge_files.log_blocks

    def counting(path: Path) -> str:
        hashed.append(path)
        return checksum(path)

    def counting_blocks(path: Path, previous: list[str] | None = None) -> list[str]:
        hashed.append(path)
        return blocks(path, previous)

    with EdgeStore(str(folder)) as store:
        store.upsert(DOCUMENTS[N:], VECTORS[N:])
        monkeypatch.setattr(edge_files, "file_checksum", counting)
        monkeypatch.setattr(edge_files, "log_blocks", counting_blocks)
        store.commit()
        monkeypatch.undo()
        assert store.verify() == N + 10
    assert any("wal" in p.parts for p in hashed)  # what the write changed: its log, its segment
    assert not set(hashed) & set(stored), sorted(set(hashed) & set(stored))


def test_points_written_after_the_last_commit_are_one_line_naming_both_counts(tmp_path: Path) -> None:
    folder = tmp_path / "edge"
    _optimized_store(folder)
    with EdgeStore(str(folder)) as store:  # a writer that stopped before its commit: the log holds its points
        store.upsert(DOCUMENTS[N : N + 3], VECTORS[N : N + 3])
    with pytest.raises(StoreError) as caught, EdgeStore(str(folder)) as store:
        store.verify()
    line = str(caught.value)
    assert "\n" not in line and f"the shard holds {N + 3} points; its manifest records {N}" in line, line
    with EdgeStore(str(folder)) as store:  # the same write again, committed: the store is whole
        store.upsert(DOCUMENTS[N : N + 3], VECTORS[N : N + 3])
        store.commit()
    with EdgeStore(str(folder)) as store:
        assert store.verify() == N + 3


def test_a_file_checksum_covers_content_not_holes(tmp_path: Path) -> None:
    sparse, dense = tmp_path / "sparse", tmp_path / "dense"
    with open(sparse, "wb") as fh:  # a hole, a byte, a hole
        fh.truncate(3 << 20)
        fh.seek(1 << 20)
        fh.write(b"\x07")
    dense.write_bytes(bytes(1 << 20) + b"\x07" + bytes((2 << 20) - 1))
    assert edge_files.file_checksum(sparse) == edge_files.file_checksum(dense)
    shutil.copyfile(dense, tmp_path / "moved")
    with open(tmp_path / "moved", "r+b") as fh:  # the byte one block later: another content
        fh.seek(1 << 20)
        fh.write(b"\x00")
        fh.seek((1 << 20) + edge_files.BLOCK)
        fh.write(b"\x07")
    assert edge_files.file_checksum(tmp_path / "moved") != edge_files.file_checksum(dense)
    with open(dense, "ab") as fh:  # a zero more: another size
        fh.write(b"\x00")
    assert edge_files.file_checksum(sparse) != edge_files.file_checksum(dense)


def test_a_log_segment_is_read_again_from_its_last_block_with_data(tmp_path: Path) -> None:
    log = tmp_path / "open-1"
    block = edge_files.LOG_BLOCK
    with open(log, "wb") as fh:  # preallocated, as the engine's: a header and entries, then a hole
        fh.truncate(4 * block)
        fh.write(b"header" + bytes(range(200)) * 10)
    first = edge_files.log_blocks(log)
    assert first[1:] == [edge_files.ZERO_BLOCK] * 3
    with open(log, "r+b") as fh:  # entries appended up to the third block
        fh.seek(block - 10)
        fh.write(b"\x09" * (block + 20))
    appended = edge_files.log_blocks(log, first)
    assert appended == edge_files.log_blocks(log) and appended[1:3] != first[1:3] and appended[3] == first[3]
    # a block before the last one with data is kept from the record: damage there stays a difference from it
    with open(log, "r+b") as fh:
        fh.seek(block + 100)
        fh.write(b"\x01")
    assert edge_files.log_blocks(log, appended)[1] == appended[1] != edge_files.log_blocks(log)[1]
    # another segment under the same name (its first block differs): read whole
    log.write_bytes(b"another" + bytes(4 * block - 7))
    assert edge_files.log_blocks(log, appended) == edge_files.log_blocks(log)


def test_a_store_written_without_file_checksums_verifies_and_records_them_on_request(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "edge"
    _optimized_store(folder)
    manifest_file = folder / "care" / MANIFEST_FILE
    earlier = read_manifest(manifest_file, "test")  # as an earlier release wrote it: no file checksums
    earlier.checksums, earlier.sizes, earlier.sealed, earlier.block_checksums = {}, {}, {}, {}
    write_manifest(manifest_file, earlier)
    with EdgeStore(str(folder)) as store, caplog.at_level(logging.WARNING, logger="care_retriever"):
        assert store.verify() == N
        assert "records no checksums of the shard's files" in caplog.text
        assert store.verify(record_checksums=True) == N
    assert read_manifest(manifest_file, "test").checksums
    tracker = next(folder.rglob("id_tracker.mappings"))
    with open(tracker, "r+b") as fh:  # now recorded, a changed byte is caught
        fh.seek(0)
        old = fh.read(1)[0]
        fh.seek(0)
        fh.write(bytes([old ^ 0x01]))
    with pytest.raises(StoreError, match=r"id_tracker\.mappings no longer matches"):
        edge_opening.check_before_open(str(folder), "care")


def test_the_log_segment_being_made_is_never_recorded_and_one_made_after_a_commit_is_no_damage(
    tmp_path: Path,
) -> None:
    # The log makes its next segment ahead, on a thread of its own (tmp-open-N, then renamed open-N), so a commit
    # can list the shard while a segment is half made, and the segment can appear after the commit's listing.
    folder = tmp_path / "edge"
    wal = folder / "care" / edge_files.SHARD_FOLDER / "wal"
    with EdgeStore(str(folder)) as store:
        store.prepare(DIM, "fp", "model")
        store.upsert(DOCUMENTS[:5], VECTORS[:5])
        (wal / "tmp-open-7").write_bytes(b"wal\0" + bytes(60))
        store.commit()
    recorded = read_manifest(folder / "care" / MANIFEST_FILE, "test").checksums
    assert "shard/wal/open-1" in recorded and not [n for n in recorded if "tmp-" in n], sorted(recorded)
    empty = next(p for p in sorted(wal.glob("open-*")) if edge_files.made_ahead(wal.parent, f"shard/wal/{p.name}"))
    shutil.copyfile(empty, wal / "open-9")  # made ahead after the commit listed the files: holds no entry
    edge_opening.check_before_open(str(folder), "care")
    with open(wal / "open-9", "r+b") as fh:  # an entry in it: not the log's empty segment, named
        fh.seek(edge_files.LOG_HEADER)
        fh.write((5).to_bytes(8, "little") + b"hello")
    with pytest.raises(StoreError, match=r"wal/open-9 was not written by a commit of this store"):
        edge_opening.check_before_open(str(folder), "care")
    (wal / "open-9").unlink()
    with EdgeStore(str(folder)) as store:
        assert store.verify() == 5
