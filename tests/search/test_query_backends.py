"""The ONNX query backend: export layout, parity with the torch query tower, a torch-free search
process, and the bad inputs (no export, an export of another tower, a corrupted .onnx)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime  # noqa: F401
import pytest

from care_retriever.cli.main import main
from care_retriever.errors import ModelError
from care_retriever.search.backends import load_query_embedder, resolve_backend
from care_retriever.search.backends.layout import (
    ONNX_FP32,
    ONNX_INT8,
    RECORD_NAME,
    query_fingerprint,
    query_route,
)
from tests.support.cli import run_cli
from tests.support.data import BACKEND_QUERIES as QUERIES
from tests.support.models import exported_tiny_model, indexed_store


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, small_corpus_path: Path) -> Path:
    """A tiny model with an fp32 + int8 ONNX export of its query tower."""
    return exported_tiny_model(tmp_path_factory.mktemp("onnx"), small_corpus_path, "onnx")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, exported: Path, small_corpus_path: Path) -> str:
    return indexed_store(tmp_path_factory.mktemp("onnx-store"), exported, small_corpus_path)


def _torch_vectors(model: Path, queries: list[str], instruction: str | None = None) -> np.ndarray:
    embedder = load_query_embedder(model, "torch", device="cpu")
    return embedder.embed_queries(queries, instruction=instruction)


def test_export_writes_the_sentence_transformers_layout(exported: Path) -> None:
    route = query_route(exported)
    folder = exported / route.transformer / "onnx"
    # weights beside each graph (memory-mapped at load), everything readable like the rest of the model
    expected = [ONNX_FP32, f"{ONNX_FP32}_data", ONNX_INT8, f"{ONNX_INT8}_data", RECORD_NAME]
    assert sorted(p.name for p in folder.iterdir()) == sorted(expected)

    for name in (ONNX_FP32, ONNX_INT8):
        graph = onnx.load(str(folder / name), load_external_data=False).graph
        embeddings = max(graph.initializer, key=lambda t: np.prod(t.dims))
        assert embeddings.data_location == onnx.TensorProto.EXTERNAL, name
    for path in [folder, *folder.iterdir()]:
        assert path.stat().st_mode & 0o044 == 0o044, path
    record = json.loads((folder / RECORD_NAME).read_text("utf-8"))
    assert record["query_fingerprint"] == query_fingerprint(route)[0]
    assert record["files"] == {ONNX_FP32: "none", ONNX_INT8: "int8"}
    # nothing half-written is left beside it
    assert not [p for p in (exported / route.transformer).iterdir() if p.name.startswith(".onnx")]


@pytest.mark.parametrize(("onnx_file", "floor"), [(ONNX_FP32, 0.999), (ONNX_INT8, 0.99)])
def test_onnx_query_vectors_match_torch(exported: Path, onnx_file: str, floor: float) -> None:
    reference = _torch_vectors(exported, QUERIES)
    alike = reference @ reference.T
    assert alike[np.triu_indices(len(QUERIES), 1)].max() < 0.99  # parity below is not given for free
    embedder = load_query_embedder(exported, "onnx", onnx_file=onnx_file)
    vectors = embedder.embed_queries(QUERIES, batch_size=2)
    assert vectors.shape == reference.shape and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    cosine = np.sum(vectors * reference, axis=1)
    assert cosine.min() >= floor, cosine


def test_prompt_template_applies_on_both_paths(exported: Path, tmp_path: Path) -> None:
    # care_config.json holds the template: it is not part of the tower, so the export stays valid
    model = tmp_path / "prompted"
    shutil.copytree(exported, model)
    config_path = model / "care_config.json"
    config = json.loads(config_path.read_text("utf-8"))
    config["query_prompt_template"] = "Instruct: {instruction}\nQuery: "
    config["default_instruction"] = "检索回答问题的医学文档"
    config_path.write_text(json.dumps(config, ensure_ascii=False), "utf-8")
    reference = _torch_vectors(model, QUERIES[:3], instruction="找药")
    vectors = load_query_embedder(model, "onnx", onnx_file=ONNX_FP32).embed_queries(QUERIES[:3], instruction="找药")
    assert np.sum(vectors * reference, axis=1).min() >= 0.999
    # a random tiny tower moves little with a prompt, so compare the gaps: the onnx path must sit
    # far closer to the prompted torch vectors than the prompt moves them
    unprompted = _torch_vectors(exported, QUERIES[:3])
    assert np.abs(vectors - reference).max() < 0.05 * np.abs(unprompted - reference).max()


def test_auto_picks_the_export_and_torch_without_one(exported: Path, tiny_model_dir: Path) -> None:
    assert resolve_backend(exported, "auto") == "onnx"
    assert resolve_backend(tiny_model_dir, "auto") == "torch"
    with pytest.raises(ModelError, match=r"Available backends: \['auto', 'torch', 'onnx', 'openvino'\]"):
        resolve_backend(exported, "tensorrt")


def test_cli_search_on_onnx_never_imports_torch(exported: Path, store: str, capsys) -> None:
    script = (
        "import sys, json\n"
        "from care_retriever.cli.main import main\n"
        f"code = main(['search', {QUERIES[0]!r}, '--model', {str(exported)!r}, '--store', {store!r}, '--json'])\n"
        "assert code == 0, code\n"
        "print(json.dumps({'torch': 'torch' in sys.modules, 'transformers': 'transformers' in sys.modules}))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    hits = json.loads(lines[0])["hits"]
    assert json.loads(lines[-1]) == {"torch": False, "transformers": False}
    # the same ranking as the torch search path
    code, out, _ = run_cli(
        capsys,
        "search",
        QUERIES[0],
        "--model",
        exported,
        "--store",
        store,
        "--json",
        "--backend",
        "torch",
        "--device",
        "cpu",
    )
    assert code == 0
    assert [h["id"] for h in json.loads(out)["hits"]] == [h["id"] for h in hits]


def test_retriever_from_pretrained_takes_backend(exported: Path, store: str) -> None:
    from care_retriever.search.retriever import CareRetriever

    onnx = CareRetriever.from_pretrained(str(exported), store, backend="onnx")
    torch_side = CareRetriever.from_pretrained(str(exported), store, backend="torch", device="cpu")
    assert type(onnx.embedder).__name__ == "OnnxQueryEmbedder"
    assert type(torch_side.embedder).__name__ == "AsymmetricEmbedder"
    assert [h.id for h in onnx.search(QUERIES[2], top_k=3)] == [h.id for h in torch_side.search(QUERIES[2], top_k=3)]
    onnx.close()
    torch_side.close()


def test_onnx_without_export_names_the_export_command(tiny_model_dir: Path, store: str, capsys) -> None:
    code, out, err = run_cli(capsys, "search", "感冒", "--model", tiny_model_dir, "--store", store, "--backend", "onnx")
    assert code != 0 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert f"care-retriever export --model {tiny_model_dir} --backend onnx" in err


def test_export_of_another_query_tower_is_refused(exported: Path, tmp_path: Path, store: str, capsys) -> None:
    from care_retriever.model.embedder import AsymmetricEmbedder

    other = AsymmetricEmbedder.from_pretrained(exported, load="both", device="cpu")
    for param in other.query_modules[0].parameters():
        param.data.add_(0.01)
    other.save_pretrained(tmp_path / "other")
    route = query_route(exported)
    shutil.copytree(exported / route.transformer / "onnx", tmp_path / "other" / route.transformer / "onnx")
    code, out, err = run_cli(
        capsys, "search", "感冒", "--model", tmp_path / "other", "--store", store, "--backend", "onnx"
    )
    assert code != 0 and out == ""
    assert "exported from another query tower" in err and "care-retriever export" in err
    assert len(err.strip().splitlines()) == 1


def test_corrupted_onnx_file_is_named(exported: Path, tmp_path: Path, store: str, capsys) -> None:
    model = tmp_path / "corrupt"
    shutil.copytree(exported, model)
    bad = model / query_route(model).transformer / "onnx" / ONNX_INT8
    bad.write_bytes(bad.read_bytes()[:2000])
    code, out, err = run_cli(capsys, "search", "感冒", "--model", model, "--store", store, "--backend", "onnx")
    assert code != 0 and out == ""
    assert str(bad) in err and len(err.strip().splitlines()) == 1


def test_leftovers_of_a_killed_export_do_not_invalidate_the_export(exported: Path, tmp_path: Path, store: str) -> None:
    # a SIGKILLed export leaves its staging folder (and replace_folder its .old copy) in the module folder
    model = tmp_path / "leftovers"
    shutil.copytree(exported, model)
    module = model / query_route(model).transformer
    for name in (".onnx.k1lled", ".onnx.old", ".openvino.x7"):
        (module / name).mkdir()
        (module / name / ONNX_FP32).write_bytes(b"half-written")
    assert main(["search", "感冒", "--model", str(model), "--store", store, "--backend", "onnx", "--json"]) == 0


def test_export_bad_options_are_one_line_errors(exported: Path, capsys) -> None:
    code, _, err = run_cli(capsys, "export", "--model", exported, "--backend", "tensorrt")
    assert code != 0 and "Available export backends: ['onnx', 'openvino']" in err
    code, _, err = run_cli(capsys, "export", "--model", exported, "--quantize", "int4")
    assert code != 0 and "Available: ['int8', 'none']" in err


def test_decoder_query_tower_stays_on_torch(tiny_model_dir: Path, tmp_path: Path, capsys) -> None:
    from care_retriever.model.embedder import AsymmetricEmbedder

    pair = AsymmetricEmbedder.from_pretrained(tiny_model_dir, load="document", device="cpu")
    pair.document_modules[0].save(str(tmp_path / "decoder"))
    symmetric = tmp_path / "symmetric"
    AsymmetricEmbedder.from_towers(str(tmp_path / "decoder"), None, device="cpu").save_pretrained(symmetric)
    code, out, err = run_cli(capsys, "export", "--model", symmetric, "--backend", "onnx")
    assert code != 0 and out == ""
    error = err.strip().splitlines()[-1]  # after the "Exporting ..." progress line
    assert error.startswith("error:") and "the query tower is a decoder" in error and "--backend torch" in error
    assert "Traceback" not in err
    assert not (symmetric / query_route(symmetric).transformer / "onnx").exists()


def test_haystack_text_embedder_and_langchain_embed_query_take_backend(exported: Path) -> None:
    pytest.importorskip("haystack")
    pytest.importorskip("langchain_core")
    from care_retriever.integrations.haystack import CareTextEmbedder
    from care_retriever.integrations.langchain import CareEmbeddings

    reference = _torch_vectors(exported, [QUERIES[0]])[0]
    text_embedder = CareTextEmbedder.from_dict(CareTextEmbedder(str(exported), backend="onnx").to_dict())
    text_embedder.warm_up()
    assert type(text_embedder.embedder).__name__ == "OnnxQueryEmbedder"
    haystack_vector = np.asarray(text_embedder.run(QUERIES[0])["embedding"])
    embeddings = CareEmbeddings(model=str(exported), backend="onnx")
    langchain_vector = np.asarray(embeddings.embed_query(QUERIES[0]))
    for vector in (haystack_vector, langchain_vector):
        assert float(vector @ reference) >= 0.99
    # the document side of the same LangChain object stays on torch
    assert len(embeddings.embed_documents(["感冒多喝水"])[0]) == reference.shape[0]
