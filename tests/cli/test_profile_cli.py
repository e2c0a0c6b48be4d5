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
    assert (index["type"], index["quantize"], index["pq_m"], index["nprobe"]) == ("ivf", "pq", DIM // 8, 8)
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
