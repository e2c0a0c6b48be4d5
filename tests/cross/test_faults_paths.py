"""Path arguments of the wrong kind: one line and exit 2 from the CLI, a typed error (CareError) in Python,
LangChain and Haystack, and the path left as it was."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from care_retriever.errors import CareError
from tests.support.cli import one_line, run_cli

CONTENT = b"not a store: a user's own file\n"


@pytest.fixture
def afile(tmp_path: Path) -> Path:
    path = tmp_path / "afile"
    path.write_bytes(CONTENT)
    return path


@pytest.mark.parametrize("command", ["info", "verify", "delete"])
@pytest.mark.parametrize("kind", ["faiss", "qdrant"])
def test_a_store_path_that_is_a_file_is_one_line(kind: str, command: str, afile: Path, capsys) -> None:
    if kind == "qdrant":
        pytest.importorskip("qdrant_client")
    args = [command, "--store", f"{kind}:{afile}"] + (["x1"] if command == "delete" else [])
    code, _, err = run_cli(capsys, *args)
    line = one_line(err)
    assert code == 2 and str(afile) in line and "must be a folder" in line, err
    assert afile.read_bytes() == CONTENT
    assert sorted(p.name for p in afile.parent.iterdir()) == ["afile"]  # no lock, no staging beside it


def test_index_into_a_store_path_that_is_a_file_is_one_line(
    afile: Path, tiny_model_dir: Path, small_corpus_path: Path, capsys
) -> None:
    code, _, err = run_cli(
        capsys, "index", "--model", tiny_model_dir, "--corpus", small_corpus_path, "--store", f"faiss:{afile}"
    )
    assert code == 2 and "must be a folder" in one_line(err)
    assert afile.read_bytes() == CONTENT


def test_python_langchain_and_haystack_get_a_typed_error(afile: Path) -> None:
    from care_retriever.stores import open_store

    with pytest.raises(CareError, match="must be a folder") as caught:
        open_store(f"faiss:{afile}")
    assert "\n" not in str(caught.value)
    langchain = pytest.importorskip("langchain_core.embeddings")
    from care_retriever.integrations.langchain import CareVectorStore

    with pytest.raises(CareError, match="must be a folder"):
        CareVectorStore(f"faiss:{afile}", langchain.DeterministicFakeEmbedding(size=8))
    pytest.importorskip("haystack")
    from care_retriever.integrations.haystack import CareFaissDocumentStore

    with pytest.raises(CareError, match="must be a folder"):
        CareFaissDocumentStore(str(afile))
    assert afile.read_bytes() == CONTENT


def test_a_corpus_folder_that_is_not_beir_is_one_line(tmp_path: Path, tiny_model_dir: Path, capsys) -> None:
    folder = tmp_path / "notbeir"
    folder.mkdir()
    code, _, err = run_cli(
        capsys, "index", "--model", tiny_model_dir, "--corpus", folder, "--store", f"faiss:{tmp_path / 's'}"
    )
    assert code == 2 and "corpus.jsonl" in one_line(err)
    assert not (tmp_path / "s").exists()


def test_a_model_out_path_that_is_a_file_is_one_line(afile: Path, small_corpus_path: Path, capsys) -> None:
    code, _, err = run_cli(capsys, "init", afile, "--preset", "tiny", "--vocab-from", small_corpus_path)
    assert code == 2 and str(afile) in one_line(err), err
    assert afile.read_bytes() == CONTENT


def test_an_unreadable_corpus_is_one_line(tmp_path: Path, tiny_model_dir: Path, capsys) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"_id": "a", "text": "高血压"}, ensure_ascii=False) + "\n", encoding="utf-8")
    corpus.chmod(0)
    if os.access(corpus, os.R_OK):
        pytest.skip("running as root: a file without read permission is still readable")
    code, _, err = run_cli(
        capsys, "index", "--model", tiny_model_dir, "--corpus", corpus, "--store", f"faiss:{tmp_path / 's'}"
    )
    assert code == 2 and "permission denied" in one_line(err)


@pytest.fixture
def read_only_store(tmp_path: Path, tiny_model_dir: Path, small_corpus_path: Path, capsys) -> Iterator[Path]:
    """A FAISS store on a tmpfs remounted read-only (root only)."""
    where = tmp_path / "ro"
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root, or no mount permission)")
    try:
        assert (
            run_cli(
                capsys,
                "index",
                "--model",
                tiny_model_dir,
                "--corpus",
                small_corpus_path,
                "--store",
                f"faiss:{where / 'store'}",
                "--no-progress",
            )[0]
            == 0
        )
        subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)
        yield where / "store"
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_a_store_on_a_read_only_file_system_is_one_line(read_only_store: Path, tiny_model_dir: Path, capsys) -> None:
    spec = f"faiss:{read_only_store}"
    code, _, err = run_cli(capsys, "delete", "--store", spec, "x1")
    assert code == 2 and "read-only" in one_line(err), err
    code, _, err = run_cli(capsys, "verify", "--store", spec)
    assert code == 0, err  # reading still works


@pytest.mark.parametrize("name", ["../elsewhere", "a/b", "..", ".", ""])
def test_a_collection_name_that_is_no_folder_name_is_one_line_and_writes_nothing(
    tmp_path: Path, tiny_model_dir: Path, small_corpus_path: Path, capsys, name: str
) -> None:
    # a collection is a folder inside qdrant:PATH: "../elsewhere" wrote a store beside PATH, outside it
    store = tmp_path / "store"
    code, out, err = run_cli(
        capsys,
        "index",
        "--model",
        tiny_model_dir,
        "--corpus",
        small_corpus_path,
        "--store",
        f"qdrant:{store}",
        "--collection",
        name,
        "--no-progress",
    )
    line = one_line(err)
    assert code == 2 and not out and f"invalid collection name {name!r}" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written, inside PATH or beside it
    for command in (["info"], ["verify"], ["delete", "a"]):
        code, _, err = run_cli(capsys, *command, "--store", f"qdrant:{store}", "--collection", name)
        assert code == 2 and f"invalid collection name {name!r}" in one_line(err)


def _index_command(tiny_model_dir: Path, small_corpus_path: Path) -> list[object]:
    return ["index", "--model", tiny_model_dir, "--corpus", small_corpus_path, "--no-progress"]


def _refused_by_every_command(capsys, index: list[object], spec: str) -> list[str]:
    """The error line of ``index``, ``info``, ``verify`` and ``delete`` on ``spec``: each one line, exit 2, nothing
    on stdout."""
    lines = []
    for command in (index, ["info"], ["verify"], ["delete", "a"]):
        code, out, err = run_cli(capsys, *command, "--store", spec)
        line = one_line(err)
        assert code == 2 and not out, line
        lines.append(line)
    return lines


def test_a_faiss_store_folder_opened_as_qdrant_is_one_line_and_untouched(
    tmp_path: Path, tiny_model_dir: Path, small_corpus_path: Path, capsys
) -> None:
    # a Qdrant collection was written inside the FAISS store's folder, and the next bulk FAISS index swapped the
    # folder for its new version without it: the Qdrant store was lost, both commands exiting 0
    folder = tmp_path / "store"
    index = _index_command(tiny_model_dir, small_corpus_path)
    assert run_cli(capsys, *index, "--store", f"faiss:{folder}")[0] == 0
    before = sorted(p.name for p in folder.iterdir())
    lines = _refused_by_every_command(capsys, index, f"qdrant:{folder}")
    assert all(f"faiss:{folder}" in line and "a FAISS store" in line for line in lines), lines
    assert sorted(p.name for p in folder.iterdir()) == before


def test_a_collection_named_after_a_faiss_store_beside_it_is_one_line_and_untouched(
    tmp_path: Path, tiny_model_dir: Path, small_corpus_path: Path, capsys
) -> None:
    # qdrant:PARENT --collection NAME, where PARENT/NAME is a FAISS store: the collection's manifest was written
    # over the FAISS store's, which no longer opened
    folder = tmp_path / "store"
    index = _index_command(tiny_model_dir, small_corpus_path)
    assert run_cli(capsys, *index, "--store", f"faiss:{folder}")[0] == 0
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    code, out, err = run_cli(capsys, *index, "--store", f"qdrant:{tmp_path}", "--collection", "store")
    line = one_line(err)
    assert code == 2 and not out and f"faiss:{folder}" in line and "a FAISS store" in line, line
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    code, out, _ = run_cli(capsys, "verify", "--store", f"faiss:{folder}")
    assert code == 0 and out.startswith("ok:")


def test_a_qdrant_collection_folder_opened_as_faiss_says_what_it_is(
    tmp_path: Path, tiny_model_dir: Path, small_corpus_path: Path, capsys
) -> None:
    # it was "index.faiss: missing; the store is incomplete", as if a FAISS store had been damaged
    index = _index_command(tiny_model_dir, small_corpus_path)
    assert run_cli(capsys, *index, "--store", f"qdrant:{tmp_path / 'q'}")[0] == 0
    folder = tmp_path / "q" / "care"
    before = sorted(p.name for p in folder.iterdir())
    lines = _refused_by_every_command(capsys, index, f"faiss:{folder}")
    assert all("a qdrant store's folder" in line and "not a FAISS store" in line for line in lines), lines
    assert sorted(p.name for p in folder.iterdir()) == before
