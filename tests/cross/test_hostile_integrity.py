"""Hostile inputs to a FAISS store's files: checksums that stay true after every write, a manifest whose fields are
checked, a docstore emptied or replaced, and reads that never change a byte. Each damage is one line and a
non-zero exit (or a StoreError), never an answer with exit 0."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from care_retriever.documents import Document
from care_retriever.errors import StoreError
from care_retriever.stores.config import FaissIndexConfig, Quantize
from care_retriever.stores.faiss import DELTA, DOCSTORE, INDEX, MANIFEST, VECTORS, FaissStore
from tests.support.cli import run_cli
from tests.support.models import indexed_store

DIM = 16
N = 40
RNG = np.random.default_rng(7)
VECS = RNG.standard_normal((N + 10, DIM)).astype(np.float32)
VECS /= np.linalg.norm(VECS, axis=1, keepdims=True)
DOCS = [Document(f"d{i}", f"文档 {i} 高血压 糖尿病 第{i}条", title=f"t{i}", metadata={"n": i}) for i in range(N + 10)]


def _bulk(folder: Path, options: FaissIndexConfig | None = None, sparse: bool = False) -> None:
    store = FaissStore(folder)
    store.prepare(DIM, "fp", "model", options)
    if sparse:
        store.enable_sparse()
    store.upsert(DOCS[:N], VECS[:N])
    store.finalize()
    store.close()


def _after_index(folder: Path) -> None:
    _bulk(folder)


def _after_delete(folder: Path) -> None:
    _bulk(folder)
    with FaissStore(folder) as store, store.transaction() as tx:
        assert tx.delete(["d3", "d17"]) == 2


def _after_add(folder: Path) -> None:
    _bulk(folder)
    with FaissStore(folder) as store, store.transaction() as tx:
        tx.upsert(DOCS[N : N + 5], VECS[N : N + 5])


def _after_sparse_writes(folder: Path) -> None:
    _bulk(folder)
    with FaissStore(folder) as store:
        with store.transaction() as tx:  # the BM25 side built in place
            tx.enable_sparse()
        with store.transaction() as tx:  # then a write through both sides
            tx.upsert(DOCS[N : N + 3], VECS[N : N + 3])
            tx.delete(["d5"])


def _after_quantized_add(folder: Path) -> None:
    _bulk(folder, FaissIndexConfig(quantize=Quantize.BINARY))
    with FaissStore(folder) as store, store.transaction() as tx:
        tx.upsert(DOCS[N : N + 4], VECS[N : N + 4])
        tx.delete(["d1"])


def _after_fold(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from care_retriever.stores.faiss import journal

    _bulk(folder)
    monkeypatch.setattr(journal, "FOLD_MIN_BYTES", 0)
    monkeypatch.setattr(journal, "FOLD_RATIO", 0.0)  # this write folds its delta into a new index.faiss
    with FaissStore(folder) as store, store.transaction() as tx:
        tx.upsert(DOCS[N : N + 2], VECS[N : N + 2])


WRITES = {
    "index": _after_index,
    "delete": _after_delete,
    "add": _after_add,
    "sparse": _after_sparse_writes,
    "quantized": _after_quantized_add,
}


def _positions(size: int) -> list[int]:
    """Byte positions spread over a file: its header, every eighth of it, its last bytes."""
    spread = {size * k // 16 for k in range(16)}
    return sorted({p for p in {*range(min(size, 24)), *spread, size - 2, size - 1} if 0 <= p < size})


def _verify_fails(folder: Path) -> str:
    """The error opening and verifying ``folder`` gives (the test fails when both pass)."""
    with pytest.raises(StoreError) as caught, FaissStore(folder) as store:
        store.verify()
    message = str(caught.value)
    assert "\n" not in message
    return message


def _assert_every_flip_caught(folder: Path) -> None:
    with FaissStore(folder) as store:
        count = store.verify()
    names = [n for n in (INDEX, DOCSTORE, DELTA, VECTORS, MANIFEST) if (folder / n).exists()]
    for name in names:
        path = folder / name
        original = path.read_bytes()
        for position in _positions(len(original)):
            damaged = bytearray(original)
            damaged[position] ^= 0x01 if position % 2 else 0xFF  # one bit, or every bit of the byte
            path.write_bytes(bytes(damaged))
            try:
                _verify_fails(folder)
            finally:
                path.write_bytes(original)
    with FaissStore(folder) as store:  # every flip undone: the store is whole again
        assert store.verify() == count
    assert {DOCSTORE, INDEX} <= set(names)


@pytest.mark.parametrize("write", list(WRITES))
def test_every_byte_flip_in_every_file_is_caught_after_each_write(tmp_path: Path, write: str) -> None:
    folder = tmp_path / "store"
    WRITES[write](folder)
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["checksums"] and manifest["sealed"]  # a write leaves them current, never emptied
    _assert_every_flip_caught(folder)


def test_every_byte_flip_is_caught_after_a_fold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "store"
    _after_fold(folder, monkeypatch)
    assert (folder / DELTA).stat().st_size == 0
    _assert_every_flip_caught(folder)


def test_appended_files_rehash_only_their_new_blocks_and_stay_true(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Small blocks, several in-place writes: each write keeps the digests of the blocks before the first byte it
    wrote and hashes the rest; every flip is still caught."""
    from care_retriever.stores.faiss import integrity

    monkeypatch.setattr(integrity, "BLOCK", 128)
    folder = tmp_path / "store"
    _bulk(folder, FaissIndexConfig(quantize=Quantize.BINARY))
    with FaissStore(folder) as store:
        for k in range(3):
            with store.transaction() as tx:
                tx.upsert(DOCS[N + 3 * k : N + 3 * k + 3], VECS[N + 3 * k : N + 3 * k + 3])
                tx.delete([f"d{k}"])
    blocks = json.loads((folder / MANIFEST).read_text())["block_checksums"]
    assert len(blocks[DELTA]) > 3 and len(blocks[VECTORS]) > 3
    _assert_every_flip_caught(folder)


def test_a_write_killed_after_its_commit_is_sealed_by_the_next(tmp_path: Path) -> None:
    """The manifest of the version before a committed write (as if killed before its manifest): verify names the
    files it could not check rather than passing; the next write records every checksum again, and a flip is
    caught."""
    folder = tmp_path / "store"
    _bulk(folder)
    before = (folder / MANIFEST).read_bytes()
    with FaissStore(folder) as store, store.transaction() as tx:
        tx.delete(["d2"])
    (folder / MANIFEST).write_bytes(before)  # as if killed between the docstore's commit and the manifest
    assert f"not checked: {DOCSTORE}" in _verify_fails(folder)
    with FaissStore(folder) as store:
        with store.transaction() as tx:
            tx.delete(["d4"])
        assert store.verify() == N - 2
    data = bytearray((folder / INDEX).read_bytes())
    data[len(data) // 2] ^= 0x01
    (folder / INDEX).write_bytes(bytes(data))
    assert "index.faiss: checksum mismatch" in _verify_fails(folder)


def test_verify_after_a_writer_killed_between_commit_and_manifest_never_says_ok(tmp_path: Path, capsys) -> None:
    """A real kill (the fault injector's worker, os._exit at the manifest's first write point after the
    docstore's commit): verify names in one line the files whose checksums it could not check, exit 2, no "ok";
    --record-checksums records them after every other check, and verify then checks every byte again."""
    import subprocess
    import sys

    from tests.support import fault_injection

    labels_run = tmp_path / "labels"
    fault_injection.seed("staged", labels_run / "store")
    fault_injection.prepare_modules("in-place")
    with fault_injection.armed(fault_injection.Injector()) as injector:
        fault_injection.write("in-place", labels_run / "store")
    last_commit = max(n for n, label in enumerate(injector.labels) if label.startswith("sqlite commit"))
    kill_at = next(n for n, label in enumerate(injector.labels) if n > last_commit and MANIFEST in label) + 1

    folder = tmp_path / "run" / "store"
    fault_injection.seed("staged", folder)
    run = subprocess.run(
        [sys.executable, fault_injection.__file__, "in-place", str(folder), str(kill_at)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        timeout=120,
    )
    assert run.returncode == fault_injection.KILLED, run.stderr[-2000:]
    code, out, err = run_cli(capsys, "verify", "--store", f"faiss:{folder}")
    assert code == 2 and "ok" not in out, (out, err)
    line = err.strip()
    assert "\n" not in line and "Traceback" not in err, err
    assert f"not checked: {DOCSTORE}" in line and "--record-checksums" in line, line
    with FaissStore(folder) as store:  # the committed write is there: the store is the new version
        assert {d.id: d.content_hash() for d in store.iter_documents()} == fault_injection.expected_new()
    code, out, err = run_cli(capsys, "verify", "--store", f"faiss:{folder}", "--record-checksums")
    assert code == 0 and "every check passed" in out, (out, err)
    code, out, err = run_cli(capsys, "verify", "--store", f"faiss:{folder}")
    assert code == 0 and "every check passed" in out, (out, err)
    data = bytearray((folder / DOCSTORE).read_bytes())  # the recorded checksums are checked again
    data[len(data) // 2] ^= 0x01
    (folder / DOCSTORE).write_bytes(bytes(data))
    code, out, err = run_cli(capsys, "verify", "--store", f"faiss:{folder}")
    assert code == 2 and "ok" not in out, (out, err)


def test_reading_never_changes_a_store_file(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    _after_sparse_writes(folder)

    def snapshot() -> dict[str, tuple[bytes, int]]:
        return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}

    before = snapshot()
    with FaissStore(folder) as store:
        store.search(VECS[:2], 5)
        store.search_sparse(["高血压"], 5)
        store.search_hybrid(VECS[:1], ["糖尿病"], 5)
        store.get(["d1"])
        assert store.count() == N + 2 and store.verify() == N + 2
        list(store.iter_documents())
    assert snapshot() == before


# ---------------------------------------------------------------- the manifest's fields
@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("dim", 33, "field 'dim' is 33, but index.faiss holds 16-dim"),
        ("dim", 8, "field 'dim' is 8, but index.faiss holds 16-dim"),
        ("dim", None, "field 'dim' must be an integer from 1 to 65536, got null"),
        ("dim", "16", "field 'dim' must be an integer"),
        ("metric", "l2", "field 'metric' must be one of cosine, dot, got 'l2'"),
        ("format_version", "2", "field 'format_version' must be an integer, got '2' (str)"),
        ("format_version", 0, "field 'format_version' must be an integer >= 1"),
        ("count", 41, "field 'count' is 41, the docstore records 40"),
        ("count", -1, "field 'count' must be an integer >= 0"),
        ("checksums", [], "field 'checksums' must be an object"),
        ("sizes", {"index.faiss": "x"}, "field 'sizes.index.faiss' must be an integer >= 0"),
        ("created_at", "yesterday", "field 'created_at' must be a finite number"),
    ],
)
def test_a_damaged_manifest_field_is_one_line_naming_it(
    tmp_path: Path, capsys, field: str, value: object, said: str
) -> None:
    folder = tmp_path / "store"
    _bulk(folder)
    manifest = json.loads((folder / MANIFEST).read_text())
    (folder / MANIFEST).write_text(json.dumps({**manifest, field: value}, indent=2))
    for command in (["verify"], ["info"], ["delete", "d1"]):
        code, out, err = run_cli(capsys, *command, "--store", f"faiss:{folder}")
        assert code == 2 and not out, (command, out)
        line = err.strip()
        assert len(line.splitlines()) == 1 and "Traceback" not in line
        assert "manifest.json" in line and said in line, (command, line)


def test_a_hand_edit_that_types_and_ranges_allow_is_caught_by_verify(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "store"
    _bulk(folder)
    manifest = json.loads((folder / MANIFEST).read_text())
    (folder / MANIFEST).write_text(json.dumps({**manifest, "metric": "dot"}, indent=2))  # cosine recorded
    code, _, err = run_cli(capsys, "verify", "--store", f"faiss:{folder}")
    assert code == 2 and "manifest.json: checksum mismatch (field 'manifest_sha256')" in err


def test_search_refuses_a_manifest_of_another_width(tmp_path: Path, tiny_model_dir: Path, small_corpus_path, capsys):
    spec = indexed_store(tmp_path, tiny_model_dir, small_corpus_path)
    capsys.readouterr()
    folder = Path(spec.split(":", 1)[1])
    manifest = json.loads((folder / MANIFEST).read_text())
    (folder / MANIFEST).write_text(json.dumps({**manifest, "dim": manifest["dim"] + 1}, indent=2))
    code, out, err = run_cli(capsys, "search", "高血压", "--model", tiny_model_dir, "--store", spec)
    assert code == 2 and not out and "field 'dim'" in err and len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------- an emptied or foreign docstore
def _foreign(path: Path) -> None:
    path.unlink()
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    con.execute("INSERT INTO notes(body) VALUES ('not a docstore')")
    con.commit()
    con.close()


@pytest.mark.parametrize("damage", ["emptied", "foreign"])
def test_an_emptied_or_foreign_docstore_is_one_line_everywhere(
    tmp_path: Path, tiny_model_dir: Path, small_corpus_path: Path, capsys, damage: str
) -> None:
    spec = indexed_store(tmp_path, tiny_model_dir, small_corpus_path)
    capsys.readouterr()
    docstore = Path(spec.split(":", 1)[1]) / DOCSTORE
    if damage == "emptied":
        docstore.write_bytes(b"")
    else:
        _foreign(docstore)
    content = docstore.read_bytes()
    said = "the docstore is empty" if damage == "emptied" else "the docstore is another database"
    model = ["--model", str(tiny_model_dir)]
    for command in (
        ["info", "--store", spec],
        ["verify", "--store", spec],
        ["search", "高血压", *model, "--store", spec],
        ["search", "高血压", *model, "--store", spec, "--mode", "hybrid"],
        ["index", *model, "--corpus", str(small_corpus_path), "--store", spec, "--no-progress"],
        ["delete", "a", "--store", spec],
    ):
        code, out, err = run_cli(capsys, *command)
        line = err.strip()
        assert code == 2 and not out and "Traceback" not in line and len(line.splitlines()) == 1, (command, line)
        assert f"{DOCSTORE}: {said}" in line, (command, line)
        assert docstore.read_bytes() == content  # reading never rewrites it (an empty file stays empty)
    shutil.rmtree(docstore.parent)
