"""``search`` and the service say which query backend answered: after ``export``, ``--backend auto`` encodes
queries with the int8 export, whose scores differ slightly from the torch tower's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from care_retriever.cli.main import main

pytest.importorskip("onnxruntime")

QUERY = "高血压患者的饮食"


def _cli(capsys, *args: object) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def model_and_store(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, small_corpus_path: Path):
    folder = tmp_path_factory.mktemp("backend")
    model = folder / "model"
    shutil.copytree(tiny_model_dir, model)  # the shared model stays without an export
    store = f"faiss:{folder / 'store'}"
    assert (
        main(["index", "--model", str(model), "--corpus", str(small_corpus_path), "--store", store, "--no-progress"])
        == 0
    )
    return model, store


def _search(capsys, model: Path, store: str, *extra: str) -> tuple[dict, str]:
    code, out, err = _cli(capsys, "search", QUERY, "--model", model, "--store", store, "--json", *extra)
    assert code == 0, err
    return json.loads(out), err


def test_search_says_which_query_backend_answered(capsys, model_and_store) -> None:
    model, store = model_and_store
    before, err = _search(capsys, model, store)
    assert before["query_backend"] == "torch" and "export" not in err  # the default tower: nothing on stderr
    assert main(["export", "--model", str(model), "--backend", "onnx", "--quantize", "int8"]) == 0
    capsys.readouterr()
    after, err = _search(capsys, model, store)  # the same command, now answered by the export
    assert after["query_backend"] == "onnx-int8"
    lines = [line for line in err.splitlines() if "onnx-int8" in line]
    assert len(lines) == 1 and "--backend torch" in lines[0]
    torch_again, err = _search(capsys, model, store, "--backend", "torch")
    assert torch_again["query_backend"] == "torch" and "onnx" not in err
    assert [h["score"] for h in torch_again["hits"]] == [h["score"] for h in before["hits"]]
    # BM25 alone encodes no query: no backend answered
    sparse, _ = _search(capsys, model, store, "--mode", "sparse")
    assert sparse["query_backend"] is None

    from fastapi.testclient import TestClient

    from care_retriever.search.backends import load_query_embedder
    from care_retriever.search.retriever import CareRetriever
    from care_retriever.search.server import create_app
    from care_retriever.stores import open_store

    retriever = CareRetriever(open_store(store, create=False), load_query_embedder(model, "auto"))
    client = TestClient(create_app(retriever))
    reply = client.post("/search", json={"query": QUERY, "top_k": 3})
    assert reply.status_code == 200 and reply.json()["query_backend"] == "onnx-int8"
    assert client.get("/health").json()["query_backend"] == "onnx-int8"
    retriever.close()
