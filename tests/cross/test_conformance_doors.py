"""Every door gives the same answer: the CLI, the Python API, Haystack, LangChain, ``CareStoreRetriever`` and the
HTTP server, for every kind of model (this package's format, one built from hub-format towers, the authors'
release layout with a BERT and with a gte query tower) and both stores (FAISS, Qdrant Edge).

A door is a small function ``door(model, store_kind, folder) -> ranked hits`` (:data:`DOORS`): it writes the
corpus through its own write path where it has one (else searches the store the CLI wrote), then searches the
queries through its own read path. Each cell must give the CLI's ids in the CLI's order and its scores within
1e-5; every store a door wrote must pass ``care-retriever verify``; a document added through one door must score
exactly as the same document indexed by the CLI. The released models score by dot product over vectors cut
without renormalising: a door that renormalises them changes their ranking, which is what the release rows catch.
The async doors (Haystack's ``Pipeline.run_async``, LangChain's ``a*`` methods) are rows of their own.
"""

from __future__ import annotations

import contextlib
import io
import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.data import SAMPLE_DIR, load_script, read_jsonl, write_jsonl
from tests.support.models import discriminative_init

pytest.importorskip("haystack")
pytest.importorskip("langchain_core")
pytest.importorskip("qdrant_client")

RELEASE = Path(__file__).resolve().parents[1] / "fixtures" / "release"
TOLERANCE = 1e-5
TOP_K = 8
# 30 documents with titles (every 10th of the shipped sample: several topics; each text's first sentence or so,
# which keeps the document towers' forward passes short) and 4 queries.
DOCUMENTS: list[dict[str, Any]] = [
    {**r, "text": r["text"][:40]} for r in read_jsonl(SAMPLE_DIR / "corpus.jsonl")[::10][:30]
]
QUERIES: list[str] = [r["text"] for r in read_jsonl(SAMPLE_DIR / "queries.jsonl")[::15][:4]]
MODEL_KINDS = ("care", "hub", "release-bert", "release-gte")
STORE_KINDS = ("faiss", "qdrant")
Ranked = list[list[tuple[str, float]]]


def cli(*args: object) -> str:
    """``care-retriever ARGS``: its stdout; a non-zero exit fails with its stderr."""
    from care_retriever.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    assert code == 0, f"care-retriever {' '.join(map(str, args))}: exit {code}: {err.getvalue()}"
    return out.getvalue()


def spec(store_kind: str, folder: Path) -> str:
    return f"{store_kind}:{folder / 'store'}"


# ---------------------------------------------------------------------------------------------------- models
def tiny_care_model(out: Path, corpus: Path) -> Path:
    """A model in this package's format: tiny random towers whose tokenizers are trained on the corpus, widened
    so that texts get told apart (conftest's ``discriminative_init``)."""
    from care_retriever.model.scratch import init_from_scratch

    embedder = init_from_scratch("tiny", [corpus], seed=0)
    discriminative_init(embedder)
    embedder.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One model of each kind, built once for the module."""
    from tests.support import hub_towers

    root = tmp_path_factory.mktemp("models")
    corpus = write_jsonl(root / "corpus.jsonl", DOCUMENTS)
    make_release = load_script(RELEASE / "make_release_fixtures.py", "make_release_fixtures")
    hub = root / "hub"
    hub_towers.write_bert_sentence_transformer(hub / "bert")
    hub_towers.write_qwen3_embedding(hub / "qwen3-embedding")
    cli("init", root / "hub-care", "--query-model", hub / "bert", "--document-model", hub / "qwen3-embedding")
    return {
        "care": tiny_care_model(root / "care", corpus),
        "hub": root / "hub-care",
        "release-bert": make_release.build_release_fixture("bert", root / "release-bert"),
        "release-gte": make_release.build_release_fixture("gte", root / "release-gte"),
    }


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("corpus") / "corpus.jsonl", DOCUMENTS)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("doors")


# ---------------------------------------------------------------------------------------------------- doors
class Cell:
    """What a door gets: the model folder, the store kind, a folder of its own, the CLI's store of the same model
    and store kind (for doors that only read), and the corpus file."""

    def __init__(self, model: Path, store_kind: str, folder: Path, cli_store: str, corpus: Path) -> None:
        self.model, self.store_kind, self.folder, self.cli_store, self.corpus = (
            model,
            store_kind,
            folder,
            cli_store,
            corpus,
        )
        self.written: list[str] = []  # the stores this door wrote (each must pass verify)


def door_cli(cell: Cell) -> Ranked:
    store = cell.cli_store
    out = cli("search", "--model", cell.model, "--store", store, "--top-k", TOP_K, "--json", *QUERIES)
    return [[(h["id"], float(h["score"])) for h in json.loads(line)["hits"]] for line in out.strip().splitlines()]


def door_python(cell: Cell) -> Ranked:
    from care_retriever.documents import Document
    from care_retriever.indexing.writer import DocumentStoreWriter
    from care_retriever.model.embedder import AsymmetricEmbedder
    from care_retriever.search.retriever import CareRetriever

    store = spec(cell.store_kind, cell.folder)
    embedder = AsymmetricEmbedder.from_pretrained(str(cell.model), device="cpu")
    writer = DocumentStoreWriter(embedder, store, show_progress=False)
    docs = [Document(d["_id"], d["text"], d.get("title") or "", d.get("metadata") or {}) for d in DOCUMENTS]
    writer.write(docs)
    writer.store.close()
    cell.written.append(store)
    retriever = CareRetriever(store, embedder)
    try:
        results = retriever.search(QUERIES, top_k=TOP_K)
    finally:
        retriever.close()
    return [[(h.id, h.score) for h in row] for row in results]


def door_haystack(cell: Cell) -> Ranked:
    from haystack import Document, Pipeline
    from haystack.components.writers import DocumentWriter

    from care_retriever.integrations.haystack import (
        CareDocumentEmbedder,
        CareFaissDocumentStore,
        CareFaissEmbeddingRetriever,
        CareTextEmbedder,
    )

    store_spec = spec("faiss", cell.folder)  # the spec the CLI takes, not a bare folder
    store = CareFaissDocumentStore(store_spec, model=str(cell.model))
    indexing = Pipeline()
    indexing.add_component("embedder", CareDocumentEmbedder(str(cell.model), progress_bar=False, device="cpu"))
    indexing.add_component("writer", DocumentWriter(store))
    indexing.connect("embedder.documents", "writer.documents")
    docs = [Document(id=d["_id"], content=d["text"], meta={**d["metadata"], "title": d["title"]}) for d in DOCUMENTS]
    indexing.run({"embedder": {"documents": docs}})
    cell.written.append(store_spec)
    query = Pipeline()
    query.add_component("embedder", CareTextEmbedder(str(cell.model), device="cpu", backend="torch"))
    query.add_component("retriever", CareFaissEmbeddingRetriever(store, top_k=TOP_K))
    query.connect("embedder.embedding", "retriever.query_embedding")
    try:
        rows = [query.run({"embedder": {"text": q}})["retriever"]["documents"] for q in QUERIES]
    finally:
        store.close()
    return [[(d.id, float(d.score)) for d in row] for row in rows]


def door_langchain(cell: Cell) -> Ranked:
    from care_retriever.integrations.langchain import CareEmbeddings, CareVectorStore

    store = spec(cell.store_kind, cell.folder)
    embeddings = CareEmbeddings(model=str(cell.model), device="cpu", backend="torch")
    vectors = CareVectorStore.from_texts(
        [d["text"] for d in DOCUMENTS],
        embeddings,
        [{**d["metadata"], "title": d["title"]} for d in DOCUMENTS],
        ids=[d["_id"] for d in DOCUMENTS],
        store=store,
    )
    cell.written.append(store)
    try:
        rows = [vectors.similarity_search_with_score(q, k=TOP_K) for q in QUERIES]
    finally:
        vectors.close()
    return [[(str(doc.id), float(score)) for doc, score in row] for row in rows]


def door_store_retriever(cell: Cell) -> Ranked:
    from haystack import Pipeline

    from care_retriever.integrations.haystack import CareStoreRetriever, CareTextEmbedder

    retriever = CareStoreRetriever(cell.cli_store, model=str(cell.model), top_k=TOP_K)
    query = Pipeline()
    query.add_component("embedder", CareTextEmbedder(str(cell.model), device="cpu", backend="torch"))
    query.add_component("retriever", retriever)
    query.connect("embedder.embedding", "retriever.query_embedding")
    try:
        rows = [query.run({"embedder": {"text": q}})["retriever"]["documents"] for q in QUERIES]
    finally:
        retriever.close()
    return [[(d.id, float(d.score)) for d in row] for row in rows]


def door_server(cell: Cell) -> Ranked:
    from fastapi.testclient import TestClient

    from care_retriever.search.retriever import CareRetriever
    from care_retriever.search.server import create_app

    retriever = CareRetriever.from_pretrained(str(cell.model), cell.cli_store, device="cpu", backend="torch")
    try:
        with TestClient(create_app(retriever)) as client:
            response = client.post("/search", json={"query": QUERIES, "top_k": TOP_K})
            assert response.status_code == 200, response.text
            rows = response.json()["results"]
    finally:
        retriever.close()
    return [[(h["id"], float(h["score"])) for h in row["hits"]] for row in rows]


def door_haystack_async(cell: Cell) -> Ranked:
    """Haystack's ``Pipeline.run_async``: the indexing pipeline writes through the store's async twins, the query
    pipelines run concurrently on one loop (their queries may share a forward pass)."""
    import asyncio

    from haystack import Document, Pipeline
    from haystack.components.writers import DocumentWriter

    from care_retriever.integrations.haystack import (
        CareDocumentEmbedder,
        CareFaissDocumentStore,
        CareFaissEmbeddingRetriever,
        CareTextEmbedder,
    )

    store_spec = spec("faiss", cell.folder)
    store = CareFaissDocumentStore(store_spec, model=str(cell.model))
    indexing = Pipeline()
    indexing.add_component("embedder", CareDocumentEmbedder(str(cell.model), progress_bar=False, device="cpu"))
    indexing.add_component("writer", DocumentWriter(store))
    indexing.connect("embedder.documents", "writer.documents")
    query = Pipeline()
    query.add_component("embedder", CareTextEmbedder(str(cell.model), device="cpu", backend="torch"))
    query.add_component("retriever", CareFaissEmbeddingRetriever(store, top_k=TOP_K))
    query.connect("embedder.embedding", "retriever.query_embedding")
    docs = [Document(id=d["_id"], content=d["text"], meta={**d["metadata"], "title": d["title"]}) for d in DOCUMENTS]

    async def run() -> list[dict[str, Any]]:
        await indexing.run_async({"embedder": {"documents": docs}})
        return list(await asyncio.gather(*(query.run_async({"embedder": {"text": q}}) for q in QUERIES)))

    try:
        answers = asyncio.run(run())
    finally:
        store.close()
    cell.written.append(store_spec)
    return [[(d.id, float(d.score)) for d in a["retriever"]["documents"]] for a in answers]


def door_langchain_async(cell: Cell) -> Ranked:
    """LangChain's async methods (``afrom_texts``, ``asimilarity_search_with_score``), the queries concurrent."""
    import asyncio

    from care_retriever.integrations.langchain import CareEmbeddings, CareVectorStore

    store = spec(cell.store_kind, cell.folder)
    embeddings = CareEmbeddings(model=str(cell.model), device="cpu", backend="torch")

    async def run() -> Ranked:
        vectors = await CareVectorStore.afrom_texts(
            [d["text"] for d in DOCUMENTS],
            embeddings,
            [{**d["metadata"], "title": d["title"]} for d in DOCUMENTS],
            ids=[d["_id"] for d in DOCUMENTS],
            store=store,
        )
        try:
            rows = await asyncio.gather(*(vectors.asimilarity_search_with_score(q, k=TOP_K) for q in QUERIES))
        finally:
            vectors.close()
        return [[(str(doc.id), float(score)) for doc, score in row] for row in rows]

    answers = asyncio.run(run())
    cell.written.append(store)
    return answers


Door = Callable[[Cell], Ranked]
# name -> (door, the store kinds it opens). Async doors join here.
DOORS: dict[str, tuple[Door, tuple[str, ...]]] = {
    "python": (door_python, STORE_KINDS),
    "haystack": (door_haystack, ("faiss",)),  # CareFaissDocumentStore; Qdrant is read by CareStoreRetriever
    "langchain": (door_langchain, STORE_KINDS),
    "haystack_async": (door_haystack_async, ("faiss",)),
    "langchain_async": (door_langchain_async, STORE_KINDS),
    "store_retriever": (door_store_retriever, STORE_KINDS),
    "server": (door_server, STORE_KINDS),
}
# Every model kind on FAISS; on Qdrant Edge (the same vectors reach it) this package's own
# model and a release: the cosine and the dot-product convention.
QDRANT_MODEL_KINDS = ("care", "release-bert")
CELLS = [
    pytest.param(door, model, store, id=f"{door}-{model}-{store}")
    for door, (_, stores) in DOORS.items()
    for model in MODEL_KINDS
    for store in stores
    if store == "faiss" or model in QDRANT_MODEL_KINDS
]


@pytest.fixture(scope="module")
def cli_stores(models: dict[str, Path], corpus_file: Path, workdir: Path) -> Callable[[str, str], str]:
    """The store ``care-retriever index`` writes for (model kind, store kind), built on first use."""
    built: dict[tuple[str, str], str] = {}

    def get(model: str, store_kind: str) -> str:
        if (model, store_kind) not in built:
            store = spec(store_kind, workdir / f"cli-{model}-{store_kind}")
            cli("index", "--model", models[model], "--corpus", corpus_file, "--store", store, "--no-progress")
            assert cli("verify", "--store", store).startswith("ok: ")  # the CLI's own store reads as sound
            built[model, store_kind] = store
        return built[model, store_kind]

    return get


@pytest.fixture(scope="module")
def cli_answers(models: dict[str, Path], cli_stores: Callable[[str, str], str], corpus_file: Path, workdir: Path):
    """The CLI's answer per (model kind, store kind): what every other door must give."""
    answers: dict[tuple[str, str], Ranked] = {}

    def get(model: str, store_kind: str) -> Ranked:
        if (model, store_kind) not in answers:
            cell = Cell(models[model], store_kind, workdir, cli_stores(model, store_kind), corpus_file)
            answers[model, store_kind] = door_cli(cell)
        return answers[model, store_kind]

    return get


def assert_same(got: Ranked, want: Ranked, what: str) -> None:
    assert len(got) == len(want) == len(QUERIES), what
    for q, (row, ref) in enumerate(zip(got, want, strict=True)):
        assert [i for i, _ in row] == [i for i, _ in ref], f"{what}: query {q}: another order than the CLI's"
        worst = max(abs(s - r) for (_, s), (_, r) in zip(row, ref, strict=True))
        assert worst <= TOLERANCE, f"{what}: query {q}: scores differ from the CLI's by {worst:.2e}"


@pytest.mark.parametrize(("door", "model", "store_kind"), CELLS)
def test_every_door_gives_the_clis_answer(
    door: str,
    model: str,
    store_kind: str,
    models: dict[str, Path],
    cli_stores: Callable[[str, str], str],
    cli_answers: Callable[[str, str], Ranked],
    corpus_file: Path,
    workdir: Path,
) -> None:
    want = cli_answers(model, store_kind)
    assert all(len(row) == TOP_K for row in want)
    cell = Cell(
        models[model], store_kind, workdir / f"{door}-{model}-{store_kind}", cli_stores(model, store_kind), corpus_file
    )
    got = DOORS[door][0](cell)
    assert_same(got, want, f"{door} x {model} x {store_kind}")
    for store in cell.written:  # every store a door wrote reads as sound (the CLI's: checked when built)
        out = cli("verify", "--store", store)
        assert out.startswith("ok: ") and f"holds {len(DOCUMENTS)} documents" in out, out


def test_the_release_rows_score_by_dot_product(cli_answers: Callable[[str, str], Ranked], models) -> None:
    """The released models' CLI scores are dot products of vectors cut without renormalising (the matrix compares
    every door with these): the query-document dot product, not their cosine."""
    from care_retriever.model.embedder import AsymmetricEmbedder

    embedder = AsymmetricEmbedder.from_pretrained(str(models["release-bert"]), device="cpu")
    assert embedder.similarity == "dot" and not embedder.vectors.unit_norm
    by_id = {d["_id"]: d for d in DOCUMENTS}
    answer = cli_answers("release-bert", "faiss")
    query = embedder.embed_queries(QUERIES[:1])[0]
    ids = [i for i, _ in answer[0]]
    docs = embedder.embed_documents([f"{by_id[i]['title']}\n{by_id[i]['text']}" for i in ids])
    assert np.linalg.norm(docs, axis=1).max() < 0.99  # cut, not renormalised
    np.testing.assert_allclose([s for _, s in answer[0]], docs @ query, atol=1e-5)


# ---------------------------------------------------------------------------------------------------- cross-door
@pytest.mark.parametrize("model", ["care", "release-bert"])
def test_a_document_added_through_any_door_scores_as_its_cli_indexed_copy(
    model: str, models: dict[str, Path], corpus_file: Path, workdir: Path
) -> None:
    """The CLI indexes the corpus; LangChain and Haystack each add a copy of one of its documents under a new id;
    all three copies score the same for every query, and the store still verifies."""
    from haystack import Document as HaystackDocument

    from care_retriever.integrations.haystack import CareDocumentEmbedder, CareFaissDocumentStore
    from care_retriever.integrations.langchain import CareEmbeddings, CareVectorStore

    store = spec("faiss", workdir / f"cross-{model}")
    cli("index", "--model", models[model], "--corpus", corpus_file, "--store", store, "--no-progress")
    original = DOCUMENTS[3]
    embeddings = CareEmbeddings(model=str(models[model]), device="cpu", backend="torch")
    vectors = CareVectorStore(store, embeddings)
    vectors.add_texts([original["text"]], [{"title": original["title"]}], ids=["copy-langchain"])
    vectors.close()
    haystack_store = CareFaissDocumentStore(store, model=str(models[model]))
    embedder = CareDocumentEmbedder(str(models[model]), progress_bar=False, device="cpu")
    embedder.warm_up()
    doc = HaystackDocument(id="copy-haystack", content=original["text"], meta={"title": original["title"]})
    haystack_store.write_documents(embedder.run([doc])["documents"])
    haystack_store.close()
    out = cli("search", "--model", models[model], "--store", store, "--top-k", len(DOCUMENTS) + 2, "--json", *QUERIES)
    for line in out.strip().splitlines():
        scores = {h["id"]: h["score"] for h in json.loads(line)["hits"]}
        copies = [scores[original["_id"]], scores["copy-langchain"], scores["copy-haystack"]]
        assert max(copies) - min(copies) <= TOLERANCE, copies
    assert cli("verify", "--store", store).startswith("ok: ")


# ---------------------------------------------------------------------------------------------------- third-party
# what docs/reference/integrations.md tells users to set
HAYSTACK_SIMILARITY = {"cosine": "cosine", "dot": "dot_product"}


def third_party_answers(model: Path, similarity: str) -> dict[str, Ranked]:
    """The corpus and queries through stores CARE does not own, each set to ``similarity``: Haystack's
    InMemoryDocumentStore and QdrantDocumentStore, LangChain's FAISS and QdrantVectorStore."""
    from haystack import Document as HaystackDocument
    from haystack.components.retrievers.in_memory import InMemoryEmbeddingRetriever
    from haystack.document_stores.in_memory import InMemoryDocumentStore
    from haystack_integrations.components.retrievers.qdrant import QdrantEmbeddingRetriever
    from haystack_integrations.document_stores.qdrant import QdrantDocumentStore
    from langchain_community.vectorstores import FAISS
    from langchain_community.vectorstores.utils import DistanceStrategy
    from langchain_qdrant import QdrantVectorStore
    from qdrant_client.models import Distance

    from care_retriever.integrations.haystack import CareDocumentEmbedder, CareTextEmbedder
    from care_retriever.integrations.langchain import CareEmbeddings

    answers: dict[str, Ranked] = {}
    document_embedder = CareDocumentEmbedder(str(model), progress_bar=False, device="cpu")
    text_embedder = CareTextEmbedder(str(model), device="cpu", backend="torch")
    document_embedder.warm_up()
    text_embedder.warm_up()
    docs = [HaystackDocument(id=d["_id"], content=d["text"], meta={"title": d["title"]}) for d in DOCUMENTS]
    embedded = document_embedder.run(docs)["documents"]
    query_vectors = [text_embedder.run(q)["embedding"] for q in QUERIES]
    in_memory = InMemoryDocumentStore(embedding_similarity_function=HAYSTACK_SIMILARITY[similarity])
    qdrant = QdrantDocumentStore(
        ":memory:", embedding_dim=len(query_vectors[0]), similarity=HAYSTACK_SIMILARITY[similarity], index="t"
    )
    for name, store, retriever in (
        ("haystack-in-memory", in_memory, InMemoryEmbeddingRetriever),
        ("haystack-qdrant", qdrant, QdrantEmbeddingRetriever),
    ):
        store.write_documents(embedded)
        component = retriever(store, top_k=TOP_K)
        answers[name] = [
            [(d.id, float(d.score)) for d in component.run(query_embedding=v)["documents"]] for v in query_vectors
        ]
    embeddings = CareEmbeddings(model=str(model), device="cpu", backend="torch")
    texts = [f"{d['title']}\n{d['text']}" for d in DOCUMENTS]  # what the CLI embeds (Document.embedding_text())
    ids = [d["_id"] for d in DOCUMENTS]
    # FAISS: inner product for both kinds (unit vectors make it cosine); never normalize_L2 a dot-product model.
    faiss_store = FAISS.from_texts(texts, embeddings, ids=ids, distance_strategy=DistanceStrategy.MAX_INNER_PRODUCT)
    qdrant_store = QdrantVectorStore.from_texts(
        texts,
        embeddings,
        ids=[str(uuid.uuid5(uuid.NAMESPACE_URL, i)) for i in ids],
        metadatas=[{"doc_id": i} for i in ids],
        location=":memory:",
        collection_name="t",
        distance=Distance.DOT if similarity == "dot" else Distance.COSINE,
    )
    answers["langchain-faiss"] = [
        [(str(doc.id), float(s)) for doc, s in faiss_store.similarity_search_with_score(q, k=TOP_K)] for q in QUERIES
    ]
    answers["langchain-qdrant"] = [
        [(doc.metadata["doc_id"], float(s)) for doc, s in qdrant_store.similarity_search_with_score(q, k=TOP_K)]
        for q in QUERIES
    ]
    return answers


@pytest.mark.parametrize("model", ["care", "release-bert"])
def test_third_party_stores_set_to_the_embedders_similarity_give_the_clis_answer(
    model: str, models: dict[str, Path], cli_answers: Callable[[str, str], Ranked]
) -> None:
    """What docs/reference/integrations.md tells users to set: the similarity the embedders report (cosine for this
    package's models, dot product for the released ones). Set so, Haystack's and LangChain's own stores rank and
    score as the CLI; a released model in a cosine store does not score as its authors' code does."""
    from care_retriever.integrations.haystack import CareDocumentEmbedder
    from care_retriever.integrations.langchain import CareEmbeddings

    similarity = CareEmbeddings(model=str(models[model])).similarity
    assert (
        similarity
        == CareDocumentEmbedder(str(models[model])).similarity
        == ("dot" if model.startswith("release") else "cosine")
    )
    want = cli_answers(model, "faiss")
    for name, got in third_party_answers(models[model], similarity).items():
        assert_same(got, want, f"{name} set to {similarity}")
    if similarity == "dot":  # the guidance matters: cosine renormalises the cut document vectors
        cosine = third_party_answers(models[model], "cosine")["haystack-in-memory"]
        worst = max(
            abs(s - r) for row, ref in zip(cosine, want, strict=True) for (_, s), (_, r) in zip(row, ref, strict=True)
        )
        assert worst > 1e-3, "a cosine store scored a released model as its dot product does"


# ---------------------------------------------------------------------------------------------------- empty text
def test_empty_text_is_refused_alike_at_every_door(models: dict[str, Path], workdir: Path) -> None:
    """A document with neither text nor title: the CLI's one line at every door, and nothing written."""
    from haystack import Document as HaystackDocument

    from care_retriever.cli.main import main
    from care_retriever.documents import Document
    from care_retriever.errors import InputError
    from care_retriever.indexing.writer import DocumentStoreWriter
    from care_retriever.integrations.haystack import CareDocumentEmbedder, CareFaissDocumentStore
    from care_retriever.integrations.langchain import CareEmbeddings, CareVectorStore
    from care_retriever.model.embedder import AsymmetricEmbedder

    model = str(models["care"])
    message = "empty text for document 'blank'"
    corpus = write_jsonl(workdir / "blank.jsonl", [{"_id": "ok", "text": "感冒"}, {"_id": "blank", "text": "  "}])
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(
            [
                "index",
                "--model",
                model,
                "--corpus",
                str(corpus),
                "--store",
                spec("faiss", workdir / "e-cli"),
                "--no-progress",
            ]
        )
    assert code == 2 and message in err.getvalue() and "Traceback" not in err.getvalue()

    embedder = AsymmetricEmbedder.from_pretrained(model, device="cpu")
    writer = DocumentStoreWriter(embedder, spec("faiss", workdir / "e-python"), show_progress=False)
    with pytest.raises(InputError, match=message):
        writer.write([Document("ok", "感冒"), Document("blank", " ")])
    assert writer.store.manifest is None
    writer.store.close()

    for store_kind in STORE_KINDS:
        vectors = CareVectorStore(spec(store_kind, workdir / f"e-langchain-{store_kind}"), CareEmbeddings(model=model))
        with pytest.raises(InputError, match=message):
            vectors.add_texts(["感冒", ""], ids=["ok", "blank"])
        assert vectors.store.manifest is None or vectors.store.count() == 0
        vectors.close()
    with pytest.raises(InputError, match="empty text"):
        CareEmbeddings(model=model).embed_documents(["感冒", ""])

    haystack_store = CareFaissDocumentStore(spec("faiss", workdir / "e-haystack"), model=model)
    with pytest.raises(InputError, match=message):
        haystack_store.write_documents([HaystackDocument(id="blank", content="", embedding=[0.1] * embedder.dim)])
    assert haystack_store.count_documents() == 0
    with pytest.raises(InputError, match="no text content"):
        embedder_component = CareDocumentEmbedder(model, progress_bar=False, device="cpu")
        embedder_component.warm_up()
        embedder_component.run([HaystackDocument(id="blank", content="")])
