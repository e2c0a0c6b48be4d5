"""A disk that fills, for real: a small tmpfs mounted for the test (root only; skipped with the reason where the
mount is refused).

* ``index`` whose corpus cannot fit refuses in one line before it encodes, and writes nothing.
* The disk filled by another writer while ``index`` runs: one line, exit 2, the old store verifies unchanged
  (FAISS: the published version; Qdrant Edge: ``info`` and ``verify`` agree), and once space is freed the
  re-run completes with every document and leaves no staging folder behind.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from care_retriever.stores.faiss import files
from tests.support.cli import run_cli

MOUNT_MB = 6


@pytest.fixture
def small_disk(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    size = getattr(request, "param", MOUNT_MB)  # MB; a test may ask for another size (indirect parametrization)
    where = tmp_path / "disk"
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}m", "tmpfs", str(where)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a {MOUNT_MB} MB tmpfs here: {mounted.stderr.strip() or 'mount refused'}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def corpus(path: Path, count: int, prefix: str, repeat: int = 40) -> Path:
    with path.open("w", encoding="utf-8") as fh:
        for i in range(count):
            text = f"{prefix} {i} " + "高血压患者应低盐饮食，定期监测血压。" * repeat
            fh.write(json.dumps({"_id": f"{prefix}{i}", "text": text}, ensure_ascii=False) + "\n")
    return path


def fill_when(ready: callable, disk: Path, stop: threading.Event) -> threading.Thread:
    """Another writer: once ``ready()``, fills ``disk`` to the last byte (disk/ballast)."""

    def run() -> None:
        while not ready() and not stop.is_set():
            time.sleep(0.005)
        try:  # (the close flushes into a full disk too)
            with open(disk / "ballast", "wb") as fh:
                while True:
                    fh.write(b"\0" * 65536)
                    fh.flush()
        except OSError:
            pass
        stop.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_index_refuses_in_one_line_when_the_disk_cannot_hold_it(
    small_disk: Path, tiny_model_dir: Path, tmp_path: Path, capsys
) -> None:
    big = corpus(tmp_path / "big.jsonl", 3000, "big")  # ~3000 x 2 KB of text: more than the 6 MB disk
    store = small_disk / "store"
    code, _, err = run_cli(
        capsys, "index", "--model", tiny_model_dir, "--corpus", big, "--store", f"faiss:{store}", "--no-progress"
    )
    line = one_error_line(err)
    assert code == 2 and "not enough free space" in line and str(store) in line, err
    assert not store.exists() and not files.staging_path(store).exists()


# Qdrant Edge: test_qdrant_edge_disk_filled_mid_index_from_the_cli (its engine's mapped files fault with SIGBUS under
# a disk filled during an engine call: its filled run is a subprocess, where this one runs in pytest's own process)
@pytest.mark.parametrize("backend", ["faiss"])
def test_a_disk_filled_mid_index_says_one_line_and_the_rerun_completes(
    backend: str, small_disk: Path, tiny_model_dir: Path, tmp_path: Path, capsys
) -> None:
    if backend == "qdrant":
        pytest.importorskip("qdrant_client")
    store = small_disk / "store"
    spec = f"{backend}:{store}"
    first = corpus(tmp_path / "first.jsonl", 50, "old")
    args = ("--model", tiny_model_dir, "--store", spec, "--no-progress", "--checkpoint-every", "64")
    assert run_cli(capsys, "index", "--corpus", first, *args)[0] == 0
    code, out, _ = run_cli(capsys, "verify", "--store", spec)
    assert code == 0 and "holds 50 documents" in out

    both = corpus(tmp_path / "both.jsonl", 400, "new", repeat=6)
    with first.open(encoding="utf-8") as src, both.open("a", encoding="utf-8") as dst:
        dst.write(src.read())
    if backend == "faiss":  # the staged write has begun (and passed the free-space check)
        ready = (files.staging_path(store) / files.MANIFEST).exists
    else:
        sqlite = next(store.rglob("storage.sqlite"))
        size = sqlite.stat().st_size
        ready = lambda: sqlite.stat().st_size > size  # noqa: E731 - the first points of the run are persisted
    stop = threading.Event()
    filler = fill_when(ready, small_disk, stop)
    code, _, err = run_cli(capsys, "index", "--corpus", both, *args)
    stop.set()
    filler.join()
    line = one_error_line(err)
    assert code == 2 and "the disk is full" in line and str(small_disk) in line, err

    # the old store, as it was (FAISS), or as far as whole points reached (Qdrant): info agrees with verify
    code, out, err = run_cli(capsys, "verify", "--store", spec)
    assert code == 0, err
    verified = int(out.split(" holds ")[1].split()[0])
    if backend == "faiss":
        assert verified == 50
    code, out, _ = run_cli(capsys, "info", "--store", spec, "--json")
    assert code == 0 and json.loads(out)["count"] == verified

    os.remove(small_disk / "ballast")
    code, out, err = run_cli(capsys, "index", "--corpus", both, *args)
    assert code == 0, err
    code, out, _ = run_cli(capsys, "verify", "--store", spec)
    assert code == 0 and "holds 450 documents" in out, out
    assert not files.staging_path(store).exists()


def fill_leaving(disk: Path, leave: int) -> None:
    """Another writer: fills ``disk`` until ``leave`` bytes are free, a megabyte at a time (the free space
    measured again before each, as the engine writes beside it)."""
    with open(disk / "ballast", "wb") as fh:
        while (room := shutil.disk_usage(disk).free - leave) > 0:
            fh.write(b"\0" * min(room, 1 << 20))
            fh.flush()


@pytest.mark.slow  # a CLI run in a subprocess (its imports and model load) and four in this one: ~25 s
@pytest.mark.parametrize("small_disk", [96], indirect=True)  # MB: opening an Edge shard needs 40 MB free
def test_qdrant_edge_disk_filled_mid_index_from_the_cli(
    small_disk: Path, tiny_model_dir: Path, tmp_path: Path, capsys
) -> None:
    """``index --store qdrant:PATH`` after another writer filled the disk between two of its batches: the store's
    free-space check before each engine write refuses the next batch. One line, exit 2; every document the store
    holds is whole and the old ones are there; ``info`` = ``verify`` (once there is room to open the shard); the
    re-run completes. The other writer fills the disk at the run's first free-space check after its first new
    points reached the segments, so between two engine calls: a disk filled *during* an engine call is a SIGBUS,
    which no check can prevent (``edge_space``'s docstring; a thread racing the run hit it in one CI run of three).
    The filled run is a subprocess, so a SIGBUS fails this test instead of ending pytest's process."""
    pytest.importorskip("qdrant_edge")
    import sys

    from care_retriever.stores import open_store
    from care_retriever.stores.qdrant import edge_space

    store = small_disk / "store"
    spec = f"qdrant:{store}"
    first = corpus(tmp_path / "first.jsonl", 50, "old", repeat=6)
    args = ("--model", tiny_model_dir, "--store", spec, "--no-progress", "--chunk-size", "16")
    assert run_cli(capsys, "index", "--corpus", first, *args)[0] == 0
    both = corpus(tmp_path / "both.jsonl", 300, "new", repeat=6)
    with first.open(encoding="utf-8") as src, both.open("a", encoding="utf-8") as dst:
        dst.write(src.read())
    segments = next(store.rglob("segments"))
    # The run as the CLI runs it, with the other writer hooked onto the disk-usage reads of the store's checks:
    # once the segments have grown past what the first run left, the next check finds the disk filled.
    other_writer = f"""
import shutil, sys
from pathlib import Path
from care_retriever.stores.qdrant import edge_space
disk, segments = Path({str(small_disk)!r}), Path({str(segments)!r})
written, leave = {edge_space.folder_bytes(segments)}, {edge_space.SPACE_MARGIN // 2}
usage = shutil.disk_usage
def filled_between_writes(path):
    if not (disk / "ballast").exists() and edge_space.folder_bytes(segments) > written:
        with open(disk / "ballast", "wb") as fh:
            while (room := usage(disk).free - leave) > 0:
                fh.write(bytes(min(room, 1 << 20)))
    return usage(path)
shutil.disk_usage = filled_between_writes
from care_retriever.cli.main import main
sys.argv = ["care-retriever", *sys.argv[1:]]
sys.exit(main())
"""
    command = [sys.executable, "-c", other_writer, "index", "--corpus", str(both), *map(str, args)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert (small_disk / "ballast").exists(), "the run ended before the disk filled"
    assert run.returncode == 2, f"exit {run.returncode}: {run.stdout} {run.stderr[-2000:]}"
    line = one_error_line(run.stderr)
    assert "the disk is full" in line and str(small_disk) in line, line
    # Opening a shard needs room for its log: while the disk is full, reads answer from a temporary copy elsewhere
    code, out, err = run_cli(capsys, "verify", "--store", spec)
    assert code == 0 and " holds " in out, err

    os.remove(small_disk / "ballast")
    code, out, err = run_cli(capsys, "verify", "--store", spec)
    assert code == 0, err
    count = int(out.split(" holds ")[1].split()[0])
    code, out, _ = run_cli(capsys, "info", "--store", spec, "--json")
    assert code == 0 and json.loads(out)["count"] == count
    assert 50 <= count < 350, count  # the run stopped part-way: the old documents, and new ones whole
    rows = [json.loads(r) for r in both.read_text(encoding="utf-8").splitlines()]
    texts = {r["_id"]: r["text"] for r in rows}
    with open_store(spec) as opened:
        held = {d.id: d.text for d in opened.iter_documents()}
    assert all(f"old{i}" in held for i in range(50)) and all(texts[k] == text for k, text in held.items())

    code, _, err = run_cli(capsys, "index", "--corpus", both, *args)
    assert code == 0, err
    code, out, _ = run_cli(capsys, "verify", "--store", spec)
    assert code == 0 and "holds 350 documents" in out, out


def test_qdrant_edge_refuses_a_write_the_disk_cannot_hold(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Edge writes through memory-mapped files: a full disk there is a SIGBUS, not an error. The store checks the
    free space before opening a shard and before each engine write: one line, the store as far as whole batches
    reached (info = verify), and once space is freed the same write completes."""
    pytest.importorskip("qdrant_edge")
    import numpy as np

    from care_retriever.documents import Document
    from care_retriever.errors import WriteError
    from care_retriever.stores.qdrant import EdgeStore, edge_space

    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    request.addfinalizer(lambda: subprocess.run(["umount", "-l", str(disk)], capture_output=True))
    rng = np.random.default_rng(0)
    docs = [Document(id=f"d{i}", text="高血压患者应低盐饮食。" * 300) for i in range(600)]  # ~9 KB each
    vectors = rng.normal(size=(600, 8)).astype(np.float32)
    store = EdgeStore(str(disk / "q"))
    store.prepare(8, "fp", "m")
    store.upsert(docs[:100], vectors[:100])
    store.commit()
    store.close()

    def ballast(leave: int) -> None:
        (disk / "ballast").unlink(missing_ok=True)
        free = shutil.disk_usage(disk).free
        with open(disk / "ballast", "wb") as fh:
            fh.write(b"\0" * max(free - leave, 0))

    ballast(edge_space.OPEN_SHARD // 2)  # too little to open a shard: read from a copy, no write
    with EdgeStore(str(disk / "q")) as reader, pytest.raises(WriteError, match="the disk is full") as caught:
        reader.upsert(docs[100:], vectors[100:])
    assert "\n" not in str(caught.value) and "opened for reading from a copy" in str(caught.value)
    ballast(edge_space.OPEN_SHARD + 6 * 2**20)  # opens, then fills during the write
    store = EdgeStore(str(disk / "q"))
    with pytest.raises(WriteError, match="the disk is full") as caught:
        store.upsert(docs[100:], vectors[100:])
    assert "\n" not in str(caught.value) and str(disk) in str(caught.value)
    assert 100 <= store.count() < 600 and store.count() == store.verify()
    (disk / "ballast").unlink()
    store.upsert(docs[100:], vectors[100:])  # the same write again, with space
    store.finalize()
    assert store.count() == store.verify() == 600
    store.close()


@pytest.mark.slow  # a model load, a CLI run in a subprocess and four in this one: ~25 s
# MB: opening an Edge shard needs 40 MB free, and the optimize before a commit's as much as the segments (~80 MB
# here: each appendable segment maps 32 MiB chunks)
@pytest.mark.parametrize("small_disk", [256], indirect=True)
def test_qdrant_edge_disk_filled_at_a_commit_time_optimize(
    small_disk: Path, tiny_model_dir: Path, tmp_path: Path, capsys
) -> None:
    """``index --max-segment-size`` optimizes at a commit, mid-write, once that many KB were written since the last
    optimize. Another writer fills the disk to the last byte as such an optimize begins: the store's free-space
    check before it refuses (the engine would build the segment's graph through mapped files: a SIGBUS). One line,
    exit 2; once space is freed ``info`` = ``verify``, every document is old or new, no half-built segment is
    left, and the re-run completes with every document. The filled run is a subprocess, so a SIGBUS fails this
    test instead of ending pytest's process. The collection builds graphs as it writes (indexing threshold 1 KB,
    an integration's setting: ``index`` has no flag for it, and the default 10 MB is past this corpus)."""
    pytest.importorskip("qdrant_edge")
    import sys

    from care_retriever import AsymmetricEmbedder, DocumentStoreWriter, read_corpus
    from care_retriever.stores import open_store

    store = small_disk / "store"
    spec = f"qdrant:{store}"
    first = corpus(tmp_path / "first.jsonl", 50, "old", repeat=6)
    options = {"indexing_threshold": 1, "max_segment_size": 20}  # KB: 160 of the tiny model's 32-d vectors
    writer = DocumentStoreWriter(
        AsymmetricEmbedder.from_pretrained(tiny_model_dir), spec, index_options=options, show_progress=False
    )
    writer.write(read_corpus(first))
    writer.store.close()
    both = corpus(tmp_path / "both.jsonl", 600, "new", repeat=6)
    with first.open(encoding="utf-8") as src, both.open("a", encoding="utf-8") as dst:
        dst.write(src.read())
    args = ("--model", tiny_model_dir, "--store", spec, "--no-progress", "--max-segment-size", "20")
    args += ("--chunk-size", "200", "--checkpoint-every", "200")  # 25 KB a commit: each commit optimizes
    # The run as the CLI runs it, the other writer hooked onto the store's optimize: at the first one a commit runs
    # (not finalize's), the disk is filled to the last byte before the optimize does anything.
    other_writer = f"""
import sys
from pathlib import Path
from care_retriever.stores.qdrant.edge_store import EdgeStore
disk = Path({str(small_disk)!r})
# the disk must fill just as the engine starts optimizing: the store's private step is the only place to hook in
optimize = EdgeStore._optimize
def filled_as_it_begins(self):
    if sys._getframe(1).f_code.co_name == "commit" and not (disk / "ballast").exists():
        try:
            with open(disk / "ballast", "wb") as fh:
                while True:
                    fh.write(bytes(1 << 20))
                    fh.flush()
        except OSError:
            pass
    return optimize(self)
EdgeStore._optimize = filled_as_it_begins
from care_retriever.cli.main import main
sys.argv = ["care-retriever", *sys.argv[1:]]
sys.exit(main())
"""
    command = [sys.executable, "-c", other_writer, "index", "--corpus", str(both), *map(str, args)]
    run = subprocess.run(
        command, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONFAULTHANDLER": "1"}
    )
    assert (small_disk / "ballast").exists(), f"the run ended before a commit optimized: {run.stderr[-2000:]}"
    assert run.returncode == 2, f"exit {run.returncode}: {run.stdout} {run.stderr[-2000:]}"
    line = one_error_line(run.stderr)
    assert "the disk is full" in line and "optimized segments" in line and str(small_disk) in line, line

    os.remove(small_disk / "ballast")
    code, out, err = run_cli(capsys, "verify", "--store", spec)
    assert code == 0, err
    count = int(out.split(" holds ")[1].split()[0])
    code, out, err = run_cli(capsys, "info", "--store", spec, "--json")
    assert code == 0 and json.loads(out)["count"] == count, err
    assert 50 < count < 650, count  # the old documents and the first commit's new ones, whole
    texts = {r["_id"]: r["text"] for r in map(json.loads, both.read_text(encoding="utf-8").splitlines())}
    with open_store(spec) as opened:
        held = {d.id: d.text for d in opened.iter_documents()}
    assert all(f"old{i}" in held for i in range(50)) and all(texts[k] == text for k, text in held.items())
    assert not list(store.rglob("segment_builder_*")) and not list(store.rglob("*.tmp"))

    code, _, err = run_cli(capsys, "index", "--corpus", both, *args)
    assert code == 0, err
    code, out, _ = run_cli(capsys, "verify", "--store", spec)
    assert code == 0 and "holds 650 documents" in out, out
    with open_store(spec) as opened:
        assert "hnsw" in {s["index"] for s in opened.collection_settings()["segment_indexes"]}
