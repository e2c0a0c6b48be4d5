"""The OpenVINO query backend: export layout, parity with the torch query tower, a torch-free search
process, ``auto`` with several exports, and the bad inputs (no export, an export of another tower,
a corrupted IR file). openvino + nncf are in the dev extra and imported plainly: without them the run
fails at collection. (A module-level ``importorskip`` would escape the skip guard of
tests/conftest.py, which sees test reports only, not collection reports.)"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import nncf  # noqa: F401
import numpy as np
import openvino  # noqa: F401
import pytest

from care_retriever.cli.main import main
from care_retriever.search.backends import load_query_embedder, resolve_backend
from care_retriever.search.backends.layout import (
    OPENVINO_FP32,
    OPENVINO_INT8,
    RECORD_NAME,
    query_fingerprint,
    query_route,
)
from tests.support.cli import run_cli
from tests.support.data import BACKEND_QUERIES as QUERIES
from tests.support.models import exported_tiny_model, indexed_store


@pytest.fixture(scope="module")
def ov_model(tmp_path_factory: pytest.TempPathFactory, small_corpus_path: Path) -> Path:
    """A tiny model with an fp32 + int8 OpenVINO export of its query tower (and no ONNX export)."""
    return exported_tiny_model(tmp_path_factory.mktemp("openvino"), small_corpus_path, "openvino")


@pytest.fixture(scope="module")
def ov_store(tmp_path_factory: pytest.TempPathFactory, ov_model: Path, small_corpus_path: Path) -> str:
    return indexed_store(tmp_path_factory.mktemp("openvino-store"), ov_model, small_corpus_path)


def _torch_vectors(model: Path, queries: list[str]) -> np.ndarray:
    return load_query_embedder(model, "torch", device="cpu").embed_queries(queries)


def test_export_writes_the_sentence_transformers_openvino_layout(ov_model: Path) -> None:
    route = query_route(ov_model)
    folder = ov_model / route.transformer / "openvino"
    stems = [Path(OPENVINO_FP32).stem, Path(OPENVINO_INT8).stem]
    expected = [f"{stem}.{ext}" for stem in stems for ext in ("xml", "bin")] + [RECORD_NAME]
    assert sorted(p.name for p in folder.iterdir()) == sorted(expected)
    for path in [folder, *folder.iterdir()]:
        assert path.stat().st_mode & 0o044 == 0o044, path
    record = json.loads((folder / RECORD_NAME).read_text("utf-8"))
    assert record["backend"] == "openvino"
    assert record["query_fingerprint"] == query_fingerprint(route)[0]
    assert record["files"] == {OPENVINO_FP32: "none", OPENVINO_INT8: "int8"}
    # fp32 weights stay fp32 (save_model would store fp16), the int8 IR holds int8 weights
    import openvino as ov

    types = {
        name: {
            op.get_element_type().get_type_name()
            for op in ov.Core().read_model(folder / name).get_ops()
            if op.get_type_name() == "Constant"
        }
        for name in (OPENVINO_FP32, OPENVINO_INT8)
    }
    assert "f16" not in types[OPENVINO_FP32] and "f32" in types[OPENVINO_FP32]
    assert "i8" in types[OPENVINO_INT8] or "u8" in types[OPENVINO_INT8]
    # nothing half-written is left beside it
    assert not [p for p in (ov_model / route.transformer).iterdir() if p.name.startswith(".openvino")]


@pytest.mark.parametrize(("openvino_file", "floor"), [(OPENVINO_FP32, 0.999), (OPENVINO_INT8, 0.99)])
def test_openvino_query_vectors_match_torch(ov_model: Path, openvino_file: str, floor: float) -> None:
    reference = _torch_vectors(ov_model, QUERIES)
    alike = reference @ reference.T
    assert alike[np.triu_indices(len(QUERIES), 1)].max() < 0.99  # parity below is not given for free
    embedder = load_query_embedder(ov_model, "openvino", openvino_file=openvino_file)
    vectors = embedder.embed_queries(QUERIES, batch_size=2)
    assert vectors.shape == reference.shape and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    cosine = np.sum(vectors * reference, axis=1)
    assert cosine.min() >= floor, cosine


def test_auto_takes_openvino_and_onnx_first_when_both(ov_model: Path, tmp_path: Path) -> None:
    assert resolve_backend(ov_model, "auto") == "openvino"
    assert type(load_query_embedder(ov_model)).__name__ == "OpenVinoQueryEmbedder"
    both = tmp_path / "both"
    shutil.copytree(ov_model, both)
    assert main(["export", "--model", str(both), "--backend", "onnx", "--quantize", "none"]) == 0
    assert resolve_backend(both, "auto") == "onnx"
    assert resolve_backend(both, "openvino") == "openvino"


def test_cli_search_on_openvino_never_imports_torch(ov_model: Path, ov_store: str, capsys) -> None:
    script = (
        "import sys, json\n"
        "from care_retriever.cli.main import main\n"
        f"argv = ['search', {QUERIES[0]!r}, '--model', {str(ov_model)!r}, '--store', {ov_store!r}, '--json']\n"
        "code = main(argv + ['--backend', 'openvino'])\n"
        "assert code == 0, code\n"
        "print(json.dumps({'torch': 'torch' in sys.modules, 'transformers': 'transformers' in sys.modules}))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    hits = json.loads(lines[0])["hits"]
    assert json.loads(lines[-1]) == {"torch": False, "transformers": False}
    code, out, _ = run_cli(
        capsys, "search", QUERIES[0], "--model", ov_model, "--store", ov_store, "--json", "--backend", "torch"
    )
    assert code == 0
    torch_hits = json.loads(out)["hits"]
    assert [h["id"] for h in torch_hits] == [h["id"] for h in hits]
    np.testing.assert_allclose([h["score"] for h in hits], [h["score"] for h in torch_hits], atol=0.02)


def test_retriever_from_pretrained_takes_openvino(ov_model: Path, ov_store: str) -> None:
    from care_retriever.search.retriever import CareRetriever

    retriever = CareRetriever.from_pretrained(str(ov_model), ov_store, backend="openvino")
    assert type(retriever.embedder).__name__ == "OpenVinoQueryEmbedder"
    assert retriever.search(QUERIES[2], top_k=3)
    retriever.close()


def test_openvino_without_export_names_the_export_command(tiny_model_dir: Path, ov_store: str, capsys) -> None:
    code, out, err = run_cli(
        capsys, "search", "感冒", "--model", tiny_model_dir, "--store", ov_store, "--backend", "openvino"
    )
    assert code != 0 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert f"care-retriever export --model {tiny_model_dir} --backend openvino" in err


def test_openvino_export_of_another_query_tower_is_refused(
    ov_model: Path, tmp_path: Path, ov_store: str, capsys
) -> None:
    from care_retriever.model.embedder import AsymmetricEmbedder

    other = AsymmetricEmbedder.from_pretrained(ov_model, load="both", device="cpu")
    for param in other.query_modules[0].parameters():
        param.data.add_(0.01)
    other.save_pretrained(tmp_path / "other")
    route = query_route(ov_model)
    shutil.copytree(ov_model / route.transformer / "openvino", tmp_path / "other" / route.transformer / "openvino")
    code, out, err = run_cli(
        capsys, "search", "感冒", "--model", tmp_path / "other", "--store", ov_store, "--backend", "openvino"
    )
    assert code != 0 and out == ""
    assert "exported from another query tower" in err and "--backend openvino" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("suffix", [".xml", ".bin"])
def test_corrupted_openvino_file_is_named(ov_model: Path, tmp_path: Path, ov_store: str, suffix: str, capsys) -> None:
    model = tmp_path / "corrupt"
    shutil.copytree(ov_model, model)
    bad = (model / query_route(model).transformer / "openvino" / OPENVINO_INT8).with_suffix(suffix)
    bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 3])
    code, out, err = run_cli(capsys, "search", "感冒", "--model", model, "--store", ov_store, "--backend", "openvino")
    assert code != 0 and out == ""
    assert str(bad) in err and len(err.strip().splitlines()) == 1
    assert "--backend openvino" in err
