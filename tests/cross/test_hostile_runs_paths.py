"""Hostile and careless runs against a store: a failed run is never published by a later one, and a store folder
is one folder whatever name reaches it (symbolic links, ``.``, ``/``, relative forms, a mount point).

Each case gives a correct answer or one line with a non-zero exit; nothing published is lost."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from care_retriever.errors import CareError
from tests.support.cli import one_line, run_cli
from tests.support.data import write_jsonl

FAST = ("--no-progress", "--checkpoint-every", "200", "--sort-window", "200", "--chunk-size", "200")


def rows(prefix: str, n: int) -> list[dict]:
    return [{"_id": f"{prefix}{i:04d}", "text": f"文档 {prefix} {i} 高血压患者应低盐饮食"} for i in range(n)]


def index(capsys, model: Path, corpus: Path, spec: str, *extra: str) -> tuple[int, str, str]:
    return run_cli(capsys, "index", "--model", model, "--corpus", corpus, "--store", spec, *FAST, *extra)


def stored_ids(spec: str) -> set[str]:
    from care_retriever.stores import open_store

    store = open_store(spec)
    try:
        return {d.id for d in store.iter_documents()}
    finally:
        store.close()


# ------------------------------------------------------------------------------------------ failed runs
def test_a_failed_run_is_not_published_by_a_later_unrelated_run(tmp_path: Path, tiny_model_dir: Path, capsys) -> None:
    """1,100 valid documents then one whose text holds a lone surrogate; then `delete`; then `index` of another
    corpus: the failed run's documents are never published, and nothing published is lost."""
    spec = f"faiss:{tmp_path / 'st'}"
    published = write_jsonl(tmp_path / "first.jsonl", rows("d", 5))
    assert index(capsys, tiny_model_dir, published, spec)[0] == 0
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows("x", 1100))
        + '{"_id": "broken", "text": "lone \\ud800 surrogate"}\n',
        encoding="utf-8",
    )
    code, _, err = index(capsys, tiny_model_dir, bad, spec)
    line = one_line(err)
    # refused at the corpus door (file:line of the bad row) before any document is staged
    assert code == 2 and f"{bad}:1101:" in line and "not valid Unicode" in line
    assert not (tmp_path / ".st.staging").exists(), "a refused run left a staging copy"
    code, _, err = run_cli(capsys, "delete", "d0001", "--store", spec)
    assert code == 0, err  # nothing of the failed run stands in the way of a small write
    other = write_jsonl(tmp_path / "other.jsonl", [r for r in rows("d", 5) if r["_id"] != "d0001"])
    code, out, err = index(capsys, tiny_model_dir, other, spec)
    assert code == 0 and "0 added" in out and "; 4 documents" in out, err
    assert stored_ids(spec) == {r["_id"] for r in rows("d", 5)} - {"d0001"}


def documents(prefix: str, n: int, *, bad_last: bool = False) -> list:
    from care_retriever.documents import Document

    docs = [Document(id=r["_id"], text=r["text"]) for r in rows(prefix, n)]
    return docs + ([Document(id="broken", text="lone \ud800 surrogate")] if bad_last else [])


def writer_of(embedder, spec: str):
    from care_retriever.indexing.config import EncodeConfig
    from care_retriever.indexing.writer import DocumentStoreWriter

    encode = EncodeConfig(checkpoint_every=50, sort_window=50, chunk_size=50)
    return DocumentStoreWriter(embedder, spec, encode=encode, show_progress=False)


@pytest.fixture
def stopped_run(tmp_path: Path, embedder, tiny_model_dir: Path, capsys) -> tuple[str, str]:
    """A published store of 5 documents, and a run of 120 more stopped by a bad document after two checkpoints
    (its staged copy pending); (the store's spec, the stopped run's error line)."""
    spec = f"faiss:{tmp_path / 'st'}"
    assert index(capsys, tiny_model_dir, write_jsonl(tmp_path / "first.jsonl", rows("d", 5)), spec)[0] == 0
    writer = writer_of(embedder, spec)
    with pytest.raises(CareError) as stopped:
        writer.write(documents("x", 120, bad_last=True), source="corpus-a")
    writer.store.close()
    return spec, str(stopped.value)


def test_a_run_stopped_by_bad_input_says_what_it_left_staged(stopped_run: tuple[str, str]) -> None:
    spec, line = stopped_run
    assert "\n" not in line and "'broken'" in line
    assert "documents staged, not published" in line and "corpus-a" in line
    assert f"--store {spec} --discard-pending" in line
    assert stored_ids(spec) == {r["_id"] for r in rows("d", 5)}  # the published store as it was


@pytest.mark.parametrize("command", ["index", "delete", "sparse-only"])
def test_another_command_neither_publishes_nor_adopts_a_pending_run(
    command: str, stopped_run: tuple[str, str], tmp_path: Path, tiny_model_dir: Path, capsys
) -> None:
    spec, _ = stopped_run
    if command == "index":  # another corpus: it would publish the stopped run's 100 checkpointed documents
        other = write_jsonl(tmp_path / "other.jsonl", rows("d", 5))
        code, _, err = index(capsys, tiny_model_dir, other, spec)
    elif command == "delete":
        code, _, err = run_cli(capsys, "delete", "d0001", "--store", spec)
    else:
        code, _, err = run_cli(capsys, "index", "--store", spec, "--sparse-only", "--no-progress")
    line = one_line(err)
    assert code == 2 and "is pending in" in line and "--discard-pending" in line, err
    assert stored_ids(spec) == {r["_id"] for r in rows("d", 5)}


def test_discard_pending_drops_the_staged_copy_and_keeps_the_published_store(
    stopped_run: tuple[str, str], tmp_path: Path, tiny_model_dir: Path, capsys
) -> None:
    spec, _ = stopped_run
    code, out, err = run_cli(capsys, "index", "--store", spec, "--discard-pending")
    assert code == 0 and "discarded" in out and "holds 5 documents" in out, err
    assert not (tmp_path / ".st.staging").exists()
    code, out, _ = run_cli(capsys, "index", "--store", spec, "--discard-pending")
    assert code == 0 and "no unfinished run is pending" in out
    assert run_cli(capsys, "delete", "d0001", "--store", spec)[0] == 0
    assert stored_ids(spec) == {r["_id"] for r in rows("d", 5)} - {"d0001"}


def test_a_copy_into_a_store_with_a_pending_index_run_is_refused(
    stopped_run: tuple[str, str], tmp_path: Path, tiny_model_dir: Path, capsys
) -> None:
    """A copy (of the same model's store) neither publishes nor adopts the stopped `index` run's staged copy."""
    spec, _ = stopped_run
    source = f"faiss:{tmp_path / 'other'}"
    assert index(capsys, tiny_model_dir, write_jsonl(tmp_path / "other.jsonl", rows("y", 5)), source)[0] == 0
    code, _, err = run_cli(capsys, "copy", "--from", source, "--to", spec, "--no-progress")
    line = one_line(err)
    assert code == 2 and "an unfinished `index` of corpus-a" in line and "this is `copy` of" in line, err
    assert f"`care-retriever index --store {spec} --discard-pending`" in line, err
    assert stored_ids(spec) == {r["_id"] for r in rows("d", 5)}


def test_the_same_run_with_its_input_fixed_resumes_and_publishes(stopped_run: tuple[str, str], embedder) -> None:
    spec, _ = stopped_run
    report = writer_of(embedder, spec).write(documents("x", 120), source="corpus-a")
    assert report.unchanged == 100 and report.added == 20  # the two checkpoints were resumed, not encoded again
    assert stored_ids(spec) == {r["_id"] for r in rows("d", 5) + rows("x", 120)}


@pytest.mark.parametrize("command", ["info", "search", "verify"])
def test_a_first_run_stopped_before_it_published_is_named_by_the_readers(
    command: str, tmp_path: Path, embedder, tiny_model_dir: Path, capsys
) -> None:
    """Nothing published yet, but a staged copy: the readers name the stopped run and how to end it, rather than
    saying that no store exists (a user would index again from scratch, or look for a store elsewhere)."""
    spec = f"faiss:{tmp_path / 'first'}"
    writer = writer_of(embedder, spec)
    with pytest.raises(CareError):
        writer.write(documents("x", 120, bad_last=True), source="corpus-a")
    writer.store.close()
    args = {"info": [], "search": ["高血压", "--model", str(tiny_model_dir)], "verify": []}[command]
    code, out, err = run_cli(capsys, command, *args, "--store", spec)
    line = one_line(err)
    assert code == 2 and out == "", err
    assert "an unfinished `index` of corpus-a" in line and "100 documents staged, not published" in line, line
    assert f"--store {spec} --discard-pending` (nothing is published yet)" in line, line


# ------------------------------------------------------------------------------------------ one real folder
def test_a_symlinked_store_keeps_its_link_and_updates_its_target(tmp_path: Path, tiny_model_dir: Path, capsys) -> None:
    (tmp_path / "real").mkdir()
    link = tmp_path / "link"
    link.symlink_to("real")
    assert index(capsys, tiny_model_dir, write_jsonl(tmp_path / "a.jsonl", rows("a", 3)), f"faiss:{link}")[0] == 0
    assert index(capsys, tiny_model_dir, write_jsonl(tmp_path / "b.jsonl", rows("b", 2)), f"faiss:{link}")[0] == 0
    assert link.is_symlink() and os.readlink(link) == "real"
    assert stored_ids(f"faiss:{tmp_path / 'real'}") == {r["_id"] for r in rows("a", 3) + rows("b", 2)}
    assert sorted(p.name for p in tmp_path.iterdir()) == [".real.lock", "a.jsonl", "b.jsonl", "link", "real"]


@pytest.mark.parametrize("second", ["link", "real/../real", "./real/."])
def test_two_names_of_one_folder_share_one_writer(second: str, tmp_path: Path, monkeypatch) -> None:
    from care_retriever.stores.faiss import FaissStore

    monkeypatch.chdir(tmp_path)
    (tmp_path / "link").symlink_to("real")
    first, other = FaissStore(tmp_path / "real"), FaissStore(second)
    first.prepare(8, "fp", "m")
    try:
        with pytest.raises(CareError, match="another writer"):
            other.prepare(8, "fp", "m")
    finally:
        first.abort()
        other.close()


@pytest.mark.parametrize("command", ["info", "search", "delete", "verify", "index"])
def test_the_root_as_a_store_is_one_line(command: str, tiny_model_dir: Path, small_corpus_path: Path, capsys) -> None:
    args = {
        "info": ["info"],
        "verify": ["verify"],
        "delete": ["delete", "a"],
        "search": ["search", "高血压", "--model", tiny_model_dir],
        "index": ["index", "--model", tiny_model_dir, "--corpus", small_corpus_path, "--no-progress"],
    }[command]
    code, _, err = run_cli(capsys, *args, "--store", "faiss:/")
    assert code == 2 and "root of the file system" in one_line(err)


def test_the_current_folder_as_a_store(tmp_path: Path, tiny_model_dir: Path, capsys, monkeypatch) -> None:
    """``faiss:.``: reads and small writes work; a bulk write, which renames the folder, is refused in one line."""
    corpus = write_jsonl(tmp_path / "c.jsonl", rows("d", 3))
    assert index(capsys, tiny_model_dir, corpus, f"faiss:{tmp_path / 'st'}")[0] == 0
    monkeypatch.chdir(tmp_path / "st")
    code, out, err = run_cli(capsys, "info", "--store", "faiss:.", "--json")
    assert code == 0 and json.loads(out)["count"] == 3, err
    code, out, err = run_cli(capsys, "search", "高血压", "--model", tiny_model_dir, "--store", "faiss:.", "--json")
    assert code == 0 and len(json.loads(out)["hits"]) == 3, err
    assert run_cli(capsys, "delete", "d0000", "--store", "faiss:.")[0] == 0
    code, _, err = index(capsys, tiny_model_dir, corpus, "faiss:.")
    assert code == 2 and "holds the current directory" in one_line(err)
    assert stored_ids("faiss:.") == {"d0001", "d0002"}
    assert not (tmp_path / ".st.staging").exists()


@pytest.fixture
def mount_point(tmp_path: Path):
    where = tmp_path / "mnt"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a 4 MB tmpfs here: {mounted.stderr.decode().strip() or 'mount refused'}")
    yield where
    subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_a_mount_point_as_a_store_is_one_line_before_any_work(
    mount_point: Path, tiny_model_dir: Path, small_corpus_path: Path, capsys
) -> None:
    code, _, err = index(capsys, tiny_model_dir, small_corpus_path, f"faiss:{mount_point}")
    assert code == 2 and "is a mount point" in one_line(err) and str(mount_point / "store") in err
    assert list(mount_point.iterdir()) == []
    assert sorted(p.name for p in mount_point.parent.iterdir()) == ["mnt"]  # no staging copy, no lock beside it
    assert index(capsys, tiny_model_dir, small_corpus_path, f"faiss:{mount_point / 'store'}")[0] == 0


def test_a_folder_that_cannot_be_swapped_at_publish_is_one_line(
    tmp_path: Path, tiny_model_dir: Path, small_corpus_path: Path, capsys, monkeypatch
) -> None:
    """The rename that publishes fails as a busy folder's does (EBUSY, injected at the system call): one line, the
    published store unchanged, the run's checkpoint kept for the re-run."""
    import errno

    spec = f"faiss:{tmp_path / 'st'}"
    assert index(capsys, tiny_model_dir, write_jsonl(tmp_path / "a.jsonl", rows("a", 3)), spec)[0] == 0
    real_rename = os.rename

    def busy(src, dst, *args, **kwargs):
        if Path(src) == tmp_path / "st":
            raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), str(src))
        return real_rename(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "rename", busy)
    code, _, err = index(capsys, tiny_model_dir, write_jsonl(tmp_path / "b.jsonl", rows("b", 2)), spec)
    assert code == 2 and "cannot be renamed" in one_line(err)
    monkeypatch.setattr(os, "rename", real_rename)
    assert stored_ids(spec) == {r["_id"] for r in rows("a", 3)}


@pytest.mark.parametrize("kind", ["faiss", "qdrant"])
@pytest.mark.parametrize("command", ["info", "search", "delete", "verify"])
def test_reading_a_missing_store_creates_nothing(
    command: str, kind: str, tmp_path: Path, tiny_model_dir: Path, capsys
) -> None:
    if kind == "qdrant":
        pytest.importorskip("qdrant_client")
    (tmp_path / "empty").mkdir()
    for name in ("missing", "empty"):
        args = {
            "info": ["info"],
            "delete": ["delete", "a"],
            "verify": ["verify"],
            "search": ["search", "高血压", "--model", tiny_model_dir],
        }[command]
        code, _, err = run_cli(capsys, *args, "--store", f"{kind}:{tmp_path / name}")
        assert code == 2 and "does not exist" in one_line(err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]
    assert list((tmp_path / "empty").iterdir()) == []


def test_a_qdrant_run_stopped_by_bad_input_says_what_it_wrote(tmp_path: Path, embedder) -> None:
    """Local Qdrant publishes each write as it is made: nothing is pending, and the line says what stays written."""
    pytest.importorskip("qdrant_client")
    spec = f"qdrant:{tmp_path / 'q'}"
    writer = writer_of(embedder, spec)
    with pytest.raises(CareError) as stopped:
        writer.write(documents("x", 50, bad_last=True), source="corpus-a")
    line = str(stopped.value)
    assert "\n" not in line and "the 50 documents written before it stay in" in line
    assert writer.store.pending_run() is None and writer.store.discard_pending() is None
    assert writer.store.count() == 50
    writer.store.close()


def test_between_the_two_renames_of_a_publish_the_previous_version_counts_as_published(
    stopped_run: tuple[str, str], tmp_path: Path, capsys
) -> None:
    """A publish renames the store aside, then the staged copy into place: a run stopped between the two leaves the
    previous version where readers find it, and the pending line must not say that nothing is published."""
    spec, _ = stopped_run
    (tmp_path / "st").rename(tmp_path / ".st.old")
    code, _, err = run_cli(capsys, "delete", "d0001", "--store", spec)
    line = one_line(err)
    assert code == 2 and "is pending in" in line and "(the published store is kept)" in line, line
