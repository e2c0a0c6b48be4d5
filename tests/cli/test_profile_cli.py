"""``--profile`` of ``copy`` and ``index``: ``large`` gives a new FAISS store IVF lists over PQ codes with its
vectors on disk (searches rescored exactly), an option given wins over it, and ``auto`` leaves a small corpus
as it was."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from care_retriever.documents import Document
from care_retriever.stores import open_store
from tests.support.cli import run_cli

DIM = 32
COUNT = 400


def _source(folder: Path) -> np.ndarray:
    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((COUNT, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    store = open_store(f"faiss:{folder}")
    store.prepare(DIM, "profile-cli-space", "profile-cli-model", metric="cosine")
    store.upsert([Document(id=f"d{i}", text=f"病例 {i} 高血压") for i in range(COUNT)], vectors)
    store.finalize()
    store.close()
    return vectors


def _manifest_index(folder: Path) -> dict[str, object]:
    index: dict[str, object] = json.loads((folder / "manifest.json").read_text())["index"]
    return index


def test_copy_profile_large_round_trip(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    vectors = _source(tmp_path / "src")
    code, out, err = run_cli(
        capsys, "copy", "--from", f"faiss:{tmp_path / 'src'}", "--to", f"faiss:{tmp_path / 'large'}",
        "--profile", "large", "--nprobe", "8", "--no-progress", "--json",
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["verified"] == COUNT
    index = _manifest_index(tmp_path / "large")
    assert (index["type"], index["quantize"], index["pq_m"], index["nprobe"]) == ("ivf", "pq", DIM // 4, 8)
    assert (tmp_path / "large" / "vectors.f32").stat().st_size == COUNT * DIM * 4
    store = open_store(f"faiss:{tmp_path / 'large'}")
    hits = store.search(vectors[:20], 1, payload=True)
    assert [h[0].id for h in hits] == [f"d{i}" for i in range(20)]  # rescored exactly: each finds itself
    assert np.allclose([h[0].score for h in hits], 1.0, atol=1e-5)
    assert hits[0][0].text == "病例 0 高血压"
    store.close()
    # and back into the small profile: the same documents, exact again
    code, _, err = run_cli(
        capsys, "copy", "--from", f"faiss:{tmp_path / 'large'}", "--to", f"faiss:{tmp_path / 'back'}",
        "--profile", "small", "--no-progress",
    )  # fmt: skip
    assert code == 0, err
    back = open_store(f"faiss:{tmp_path / 'back'}")
    assert back.count() == COUNT
    assert np.allclose(np.stack(back.vectors([f"d{i}" for i in range(COUNT)])), vectors, atol=1e-6)
    back.close()


def test_copy_profile_auto_keeps_a_small_source_as_it_is(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    _source(tmp_path / "src")
    code, _, err = run_cli(
        capsys, "copy", "--from", f"faiss:{tmp_path / 'src'}", "--to", f"faiss:{tmp_path / 'auto'}", "--no-progress"
    )
    assert code == 0, err
    assert _manifest_index(tmp_path / "auto")["type"] == "flat"
    assert "quantize" not in _manifest_index(tmp_path / "auto")


def test_an_unknown_profile_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    _source(tmp_path / "src")
    code, _, err = run_cli(
        capsys, "copy", "--from", f"faiss:{tmp_path / 'src'}", "--to", f"faiss:{tmp_path / 'x'}", "--profile", "huge"
    )
    assert code != 0 and "Traceback" not in err
    assert "store profile 'huge'" in err and not (tmp_path / "x").exists()


def test_index_profile_large_builds_ivf_pq_codes_from_the_corpus(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    corpus = tmp_path / "corpus.jsonl"
    words = ["高血压", "糖尿病", "冠心病", "肺炎", "胃炎", "头痛", "发热", "咳嗽", "乏力", "失眠"]
    with corpus.open("w", encoding="utf-8") as fh:
        for i in range(COUNT):
            text = " ".join(words[(i * k) % len(words)] for k in range(1, 6)) + f" 病例 {i}"
            fh.write(json.dumps({"_id": f"d{i}", "text": text}, ensure_ascii=False) + "\n")
    model = tmp_path / "model"
    assert run_cli(capsys, "init", model, "--preset", "tiny", "--vocab-from", corpus)[0] == 0
    code, _, err = run_cli(
        capsys, "index", "--model", model, "--corpus", corpus, "--store", f"faiss:{tmp_path / 'store'}",
        "--profile", "large", "--no-progress",
    )  # fmt: skip
    assert code == 0, err
    index = _manifest_index(tmp_path / "store")
    assert (index["type"], index["quantize"], index["train_size"]) == ("ivf", "pq", 65_536)


def test_copy_profile_large_into_qdrant_edge_keeps_vectors_on_disk_and_int8_codes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pytest.importorskip("qdrant_edge")
    vectors = _source(tmp_path / "src")
    code, out, err = run_cli(
        capsys, "copy", "--from", f"faiss:{tmp_path / 'src'}", "--to", f"qdrant:{tmp_path / 'edge'}",
        "--profile", "large", "--no-progress", "--json",
    )  # fmt: skip
    assert code == 0, err
    report = json.loads(out)
    assert (report["index"]["on_disk"], report["index"]["quantize"], report["index"]["always_ram"]) == (
        True, "sq8", True,
    )  # fmt: skip
    store = open_store(f"qdrant:{tmp_path / 'edge'}")
    assert [h[0].id for h in store.search(vectors[:5], 1, payload=False)] == [f"d{i}" for i in range(5)]
    store.close()


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (("--profile", "large"), "--profile large (choosing --index-type ivf --nlist 16 --quantize pq)"),
        (("--quantize", "pq", "--pq-m", "4"), "--quantize pq trains on"),
    ],
    ids=["profile-large", "quantize-pq-given"],
)
def test_index_of_a_corpus_too_small_for_its_codes_names_what_the_user_typed(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path, options: tuple[str, ...], says: str
) -> None:
    """The large profile, not the user, chose the compressed codes: the line names the profile and the way out
    (the small profile), not an option never given; an option given explicitly keeps its own advice."""
    from tests.support.data import write_jsonl

    corpus = write_jsonl(tmp_path / "c.jsonl", [{"_id": f"d{i}", "text": f"高血压 第{i}条"} for i in range(5)])
    store = tmp_path / "store"
    code, _, err = run_cli(
        capsys, "index", "--model", tiny_model_dir, "--corpus", corpus, "--store", f"faiss:{store}", *options
    )
    line = err.strip()
    assert code == 2 and "\n" not in line and "Traceback" not in line, err
    assert says in line and f"{corpus} holds 5 documents" in line, line
    if "--profile" in options:
        assert "use --profile small or leave out --profile" in line and "--quantize" not in line.split(";")[1], line
    else:
        assert "leave out --quantize" in line and "--profile" not in line, line
    assert not store.exists()


def test_copy_of_a_source_too_small_for_the_large_profile_names_the_profile(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``copy --profile large`` of a 20-document source: the profile's PQ codes train on 256 vectors; the line says
    so and what to type instead (``--quantize pq`` given keeps its own advice), and that copy then completes with
    nothing left of the refused ones."""
    store = open_store(f"faiss:{tmp_path / 'src'}")
    store.prepare(DIM, "profile-cli-space", "profile-cli-model", metric="cosine")
    vectors = np.eye(20, DIM, dtype=np.float32)
    store.upsert([Document(id=f"d{i}", text=f"病例 {i}") for i in range(20)], vectors)
    store.finalize()
    store.close()
    source, target = f"faiss:{tmp_path / 'src'}", f"faiss:{tmp_path / 'large'}"
    code, _, err = run_cli(capsys, "copy", "--from", source, "--to", target, "--profile", "large", "--no-progress")
    line = err.strip()
    assert code == 2 and "\n" not in line and "Traceback" not in line, err
    assert "--profile large (choosing --index-type ivf --nlist 16 --quantize pq)" in line, line
    assert "trains on the first 256 vectors written" in line and f"{source} holds 20 documents" in line, line
    assert "use --profile small or leave out --profile" in line and "leave out --quantize" not in line, line
    assert not [p.name for p in tmp_path.iterdir() if "large" in p.name]  # nothing created, nothing staged
    # the same codes asked for explicitly: the option given is what the line names
    code, _, err = run_cli(capsys, "copy", "--from", source, "--to", target, "--quantize", "pq", "--pq-m", "4")
    assert code == 2 and "--quantize pq trains on" in err and "leave out --quantize" in err, err
    assert "--profile" not in err
    code, _, err = run_cli(capsys, "copy", "--from", source, "--to", target, "--profile", "small", "--no-progress")
    assert code == 0, err
    assert _manifest_index(tmp_path / "large")["type"] == "flat"
