"""Haystack components: CARE embedders in real pipelines (InMemory, Qdrant local, CareFaiss) and YAML round trips."""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")  # offline: no usage pings
import haystack  # noqa: F401  (dev dependency: a broken install fails, never skips)
from haystack import Document, Pipeline
from haystack.components.retrievers.in_memory import InMemoryEmbeddingRetriever
from haystack.components.writers import DocumentWriter
from haystack.core.errors import DeserializationError
from haystack.document_stores.in_memory import InMemoryDocumentStore

from care_retriever.cli.main import main as cli
from care_retriever.errors import InputError, ModelError, StoreError
from care_retriever.indexing.corpus import read_corpus
from care_retriever.integrations.haystack import (
    CareDocumentEmbedder,
    CareFaissDocumentStore,
    CareFaissEmbeddingRetriever,
    CareTextEmbedder,
)
from care_retriever.model.embedder import AsymmetricEmbedder

ALLOWED = ["care_retriever.integrations.haystack"]
QUERIES = ["血压高怎么办", "宝宝发烧怎么办", "睡不着觉"]


@pytest.fixture(scope="module")
def cli_store(tiny_model_dir: Path, small_corpus_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A FAISS store built by `care-retriever index`."""
    folder = tmp_path_factory.mktemp("cli") / "store"
    code = cli(
        [
            "index",
            "--model",
            str(tiny_model_dir),
            "--corpus",
            str(small_corpus_path),
            "--store",
            f"faiss:{folder}",
            "--no-progress",
        ]
    )
    assert code == 0
    return folder


_CLI_HITS: dict[tuple[Path, Path, str], list[tuple[str, float]]] = {}


def cli_search(model: Path, store: Path, query: str, capsys: pytest.CaptureFixture[str]) -> list[tuple[str, float]]:
    """Hits of `care-retriever search --json` (cached: each call loads the query tower)."""
    if (model, store, query) not in _CLI_HITS:
        _CLI_HITS[model, store, query] = _run_cli_search(model, store, query, capsys)
    return _CLI_HITS[model, store, query]


def _run_cli_search(model: Path, store: Path, query: str, capsys: pytest.CaptureFixture[str]) -> list:
    capsys.readouterr()
    assert cli(["search", "--model", str(model), "--store", f"faiss:{store}", "--top-k", "6", "--json", query]) == 0
    hits = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["hits"]
    return [(h["id"], h["score"]) for h in hits]


def haystack_documents(path: Path) -> list[Document]:
    return [Document(id=d.id, content=d.text, meta={**d.metadata, "title": d.title}) for d in read_corpus(path)]


def query_pipeline(model: Path, retriever: object) -> Pipeline:
    pipe = Pipeline()
    pipe.add_component("embedder", CareTextEmbedder(str(model)))
    pipe.add_component("retriever", retriever)
    pipe.connect("embedder.embedding", "retriever.query_embedding")
    return pipe


def indexing_pipeline(model: Path, store: object) -> Pipeline:
    pipe = Pipeline()
    pipe.add_component("embedder", CareDocumentEmbedder(str(model), progress_bar=False))
    pipe.add_component("writer", DocumentWriter(store))
    pipe.connect("embedder.documents", "writer.documents")
    return pipe


def ranked(pipe: Pipeline, query: str) -> list[tuple[str, float]]:
    docs = pipe.run({"embedder": {"text": query}, "retriever": {"top_k": 6}})["retriever"]["documents"]
    return [(d.id, d.score) for d in docs]


def assert_same_hits(got: list[tuple[str, float]], want: list[tuple[str, float]]) -> None:
    assert [i for i, _ in got] == [i for i, _ in want]
    np.testing.assert_allclose([s for _, s in got], [s for _, s in want], atol=1e-5)


def test_faiss_store_opens_a_cli_index_and_matches_cli_search(
    tiny_model_dir: Path, cli_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = CareFaissDocumentStore(str(cli_store), model=str(tiny_model_dir))
    assert store.count_documents() == 6
    doc = {d.id: d for d in store.filter_documents()}["a"]
    assert doc.meta == {"group": "even", "title": "高血压"} and len(doc.embedding) == 32
    pipe = query_pipeline(tiny_model_dir, CareFaissEmbeddingRetriever(store, top_k=6))
    for query in QUERIES:
        assert_same_hits(ranked(pipe, query), cli_search(tiny_model_dir, cli_store, query, capsys))


@pytest.mark.parametrize("backend", ["in_memory", "qdrant", "care_faiss"])
def test_indexing_and_query_pipelines_match_cli_search(
    backend: str,
    tiny_model_dir: Path,
    small_corpus_path: Path,
    cli_store: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if backend == "in_memory":
        store = InMemoryDocumentStore(embedding_similarity_function="cosine")
        retriever = InMemoryEmbeddingRetriever(store)
    elif backend == "qdrant":
        qdrant = importlib.import_module("haystack_integrations.document_stores.qdrant")
        from haystack_integrations.components.retrievers.qdrant import QdrantEmbeddingRetriever

        store = qdrant.QdrantDocumentStore(":memory:", embedding_dim=32, similarity="cosine", recreate_index=True)
        retriever = QdrantEmbeddingRetriever(store)
    else:
        store = CareFaissDocumentStore(str(tmp_path / "hs"), model=str(tiny_model_dir))
        retriever = CareFaissEmbeddingRetriever(store)
    documents = haystack_documents(small_corpus_path)
    written = indexing_pipeline(tiny_model_dir, store).run({"embedder": {"documents": documents}})
    assert written["writer"]["documents_written"] == 6
    pipe = query_pipeline(tiny_model_dir, retriever)
    # A persisted store reloads from YAML with its documents; ":memory:" stores would reload empty.
    reloaded = Pipeline.loads(pipe.dumps(), allowed_modules=ALLOWED) if backend == "care_faiss" else pipe
    for query in QUERIES:
        want = cli_search(tiny_model_dir, cli_store, query, capsys)
        assert_same_hits(ranked(pipe, query), want)
        assert_same_hits(ranked(reloaded, query), want)
    if backend == "care_faiss":  # a store written from Haystack (model given) is searchable by the CLI
        assert [i for i, _ in cli_search(tiny_model_dir, tmp_path / "hs", QUERIES[0], capsys)] == [
            i for i, _ in cli_search(tiny_model_dir, cli_store, QUERIES[0], capsys)
        ]


def test_yaml_round_trip_of_both_pipelines(tiny_model_dir: Path, tmp_path: Path) -> None:
    store = CareFaissDocumentStore(str(tmp_path / "s"), model=str(tiny_model_dir), index_options={"type": "hnsw"})
    for pipe in (
        indexing_pipeline(tiny_model_dir, store),
        query_pipeline(tiny_model_dir, CareFaissEmbeddingRetriever(store, top_k=3, scale_score=True)),
    ):
        yaml = pipe.dumps()
        assert "CareDocumentEmbedder" in yaml or "CareTextEmbedder" in yaml
        assert Pipeline.loads(yaml, allowed_modules=ALLOWED).to_dict() == pipe.to_dict()


def test_text_embedder_is_the_query_tower(tiny_model_dir: Path) -> None:
    embedder = CareTextEmbedder(str(tiny_model_dir))
    with pytest.raises(RuntimeError, match="warm_up"):
        embedder.run("血压高")
    embedder.warm_up()
    assert embedder.embedder.mode == "asymmetric"
    with pytest.raises(ModelError, match="load='query'"):  # the document tower was never built
        embedder.embedder.document_model  # noqa: B018
    reference = AsymmetricEmbedder.from_pretrained(tiny_model_dir, load="query").embed_queries(["血压高"])[0]
    np.testing.assert_allclose(embedder.run("血压高")["embedding"], reference, atol=1e-6)
    with pytest.raises(TypeError, match="CareDocumentEmbedder"):
        embedder.run([Document(content="x")])
    with pytest.raises(InputError, match="empty query"):
        embedder.run("  ")


def test_document_embedder_is_the_document_tower_and_embeds_the_title_like_the_cli(
    tiny_model_dir: Path, small_corpus_path: Path
) -> None:
    embedder = CareDocumentEmbedder(str(tiny_model_dir), progress_bar=False, batch_size=2)
    docs = haystack_documents(small_corpus_path)
    with pytest.raises(RuntimeError, match="warm_up"):
        embedder.run(docs)
    embedder.warm_up()
    out = embedder.run(docs)["documents"]
    assert all(d.embedding is None for d in docs)  # inputs are not mutated
    core = list(read_corpus(small_corpus_path))
    reference = AsymmetricEmbedder.from_pretrained(tiny_model_dir, load="document").embed_documents(
        [d.embedding_text() for d in core]
    )
    np.testing.assert_allclose([d.embedding for d in out], reference, atol=1e-5)
    plain = CareDocumentEmbedder(str(tiny_model_dir), meta_fields_to_embed=[], progress_bar=False)
    plain.warm_up()
    assert not np.allclose(plain.run(docs[:1])["documents"][0].embedding, out[0].embedding)
    assert embedder.run([])["documents"] == []


def test_document_embedder_rejects_non_text_documents(tiny_model_dir: Path) -> None:
    embedder = CareDocumentEmbedder(str(tiny_model_dir), progress_bar=False)
    embedder.warm_up()
    with pytest.raises(InputError, match=r"no text content.*'blob-only'"):
        embedder.run([Document(id="ok", content="有内容"), Document(id="blob-only", content=None)])
    with pytest.raises(InputError, match="'empty'"):
        embedder.run([Document(id="empty", content="   ")])
    with pytest.raises(TypeError, match="CareTextEmbedder"):
        embedder.run("just a string")


def test_serialisation_round_trip_and_unknown_model_path(tiny_model_dir: Path, tmp_path: Path) -> None:
    for component in (
        CareTextEmbedder(str(tiny_model_dir), instruction="找答案", device="cpu"),
        CareDocumentEmbedder(
            str(tiny_model_dir), meta_fields_to_embed=["title", "group"], batch_size=4, progress_bar=False
        ),
    ):
        data = component.to_dict()
        assert type(component).from_dict(data).to_dict() == data
        missing = {**data, "init_parameters": {**data["init_parameters"], "model": str(tmp_path / "nope")}}
        with pytest.raises(ModelError, match="model folder not found"):
            type(component).from_dict(missing)
    pipe = query_pipeline(tmp_path / "nope", InMemoryEmbeddingRetriever(InMemoryDocumentStore()))
    with pytest.raises(DeserializationError) as info:
        Pipeline.loads(pipe.dumps(), allowed_modules=ALLOWED)
    assert isinstance(info.value.__cause__, ModelError)


def test_faiss_store_refuses_a_model_other_than_the_one_that_built_it(tiny_model_dir: Path, tmp_path: Path) -> None:
    unknown = CareFaissDocumentStore(str(tmp_path / "s"))
    unknown.write_documents([Document(content="x", embedding=[1.0] * 32)])
    with pytest.raises(StoreError, match="built with another model"):
        CareFaissDocumentStore(str(tmp_path / "s"), model=str(tiny_model_dir))
