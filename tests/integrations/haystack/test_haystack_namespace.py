"""Pipelines of care-retriever components load the way Haystack's own integrations do: the components live in the
``haystack_integrations`` namespace, which ``Pipeline.loads`` trusts with no allowlist and no environment variable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import haystack  # noqa: F401  (dev dependency: a broken install fails, never skips)
import pytest
from haystack import Document, Pipeline
from haystack_integrations.components.embedders.care_retriever import CareDocumentEmbedder, CareTextEmbedder
from haystack_integrations.components.retrievers.care_retriever import CareFaissEmbeddingRetriever, CareStoreRetriever
from haystack_integrations.document_stores.care_retriever import CareFaissDocumentStore

import care_retriever.integrations.haystack as care_haystack


@pytest.fixture
def no_allowlist(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HAYSTACK_DESERIALIZATION_ALLOWLIST", raising=False)


def search_pipeline(model: Path, folder: Path) -> Pipeline:
    """Text embedder -> (retriever over the document store, retriever over the store spec)."""
    store = CareFaissDocumentStore(str(folder), model=str(model))
    embedder = CareDocumentEmbedder(str(model), progress_bar=False)
    embedder.warm_up()
    texts = ["高血压患者应低盐饮食", "儿童发烧可物理降温", "失眠可以调整作息"]
    store.write_documents(embedder.run([Document(id=str(i), content=t) for i, t in enumerate(texts)])["documents"])
    pipe = Pipeline()
    pipe.add_component("embedder", CareTextEmbedder(str(model)))
    pipe.add_component("faiss", CareFaissEmbeddingRetriever(store, top_k=2))
    pipe.add_component("store", CareStoreRetriever(f"faiss:{folder}", model=str(model), top_k=2))
    pipe.connect("embedder.embedding", "faiss.query_embedding")
    pipe.connect("embedder.embedding", "store.query_embedding")
    return pipe


def hits(pipe: Pipeline, query: str) -> dict[str, list[tuple[str, float]]]:
    out = pipe.run({"embedder": {"text": query}})
    return {name: [(d.id, round(d.score, 6)) for d in out[name]["documents"]] for name in ("faiss", "store")}


def test_saved_pipeline_loads_without_an_allowlist_and_searches_the_same(
    tiny_model_dir: Path, tmp_path: Path, no_allowlist: None
) -> None:
    pipe = search_pipeline(tiny_model_dir, tmp_path / "store")
    types = [c["type"] for c in pipe.to_dict()["components"].values()]
    assert all(t.startswith("haystack_integrations.") for t in types), types
    store_type = pipe.to_dict()["components"]["faiss"]["init_parameters"]["document_store"]["type"]
    assert store_type == "haystack_integrations.document_stores.care_retriever.document_store.CareFaissDocumentStore"

    loaded = Pipeline.loads(pipe.dumps())
    assert loaded.to_dict() == pipe.to_dict()
    assert hits(loaded, "血压高怎么办") == hits(pipe, "血压高怎么办")

    yaml_file = tmp_path / "pipeline.yaml"
    with yaml_file.open("w") as handle:
        pipe.dump(handle)
    with yaml_file.open() as handle:
        assert Pipeline.load(handle).to_dict() == pipe.to_dict()


def test_a_saved_pipeline_loads_and_searches_in_a_fresh_process(
    tiny_model_dir: Path, tmp_path: Path, no_allowlist: None
) -> None:
    """A new interpreter has imported nothing: Haystack imports each component's module by its saved path, the
    retriever's before the document store's (a circular import there fails only in a fresh process)."""
    pipe = search_pipeline(tiny_model_dir, tmp_path / "store")
    (tmp_path / "pipeline.yaml").write_text(pipe.dumps(), encoding="utf-8")
    script = (
        "import json, sys\n"
        "from haystack import Pipeline\n"
        "pipe = Pipeline.loads(open(sys.argv[1], encoding='utf-8').read())\n"
        "out = pipe.run({'embedder': {'text': sys.argv[2]}})\n"
        "print(json.dumps({n: [[d.id, round(d.score, 6)] for d in out[n]['documents']] for n in ('faiss', 'store')}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "HAYSTACK_DESERIALIZATION_ALLOWLIST"}
    run = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "pipeline.yaml"), "血压高怎么办"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    got = {name: [tuple(hit) for hit in found] for name, found in json.loads(run.stdout).items()}
    assert got == hits(pipe, "血压高怎么办")


def test_the_care_retriever_names_are_the_namespace_classes() -> None:
    assert care_haystack.CareTextEmbedder is CareTextEmbedder
    assert care_haystack.CareDocumentEmbedder is CareDocumentEmbedder
    assert care_haystack.CareFaissEmbeddingRetriever is CareFaissEmbeddingRetriever
    assert care_haystack.CareStoreRetriever is CareStoreRetriever
    assert care_haystack.CareFaissDocumentStore is CareFaissDocumentStore
    with pytest.raises(AttributeError, match="NotAComponent"):
        care_haystack.NotAComponent  # noqa: B018
