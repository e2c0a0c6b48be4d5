"""CareEmbeddings: langchain-tests suites, tower routing, and LangChain's own FAISS / Qdrant vector stores."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import langchain_core  # noqa: F401  (dev dependency: a broken install fails, never skips)
import langchain_tests  # noqa: F401  (dev dependency: a broken install fails, never skips)
import numpy as np
import pytest
from langchain_core.retrievers import BaseRetriever
from langchain_tests.integration_tests import EmbeddingsIntegrationTests, RetrieversIntegrationTests
from langchain_tests.unit_tests import EmbeddingsUnitTests

from care_retriever.cli.main import main as cli
from care_retriever.errors import InputError, ModelError
from care_retriever.indexing.corpus import read_corpus
from care_retriever.integrations.langchain import CareEmbeddings
from care_retriever.model.embedder import AsymmetricEmbedder

QUERIES = ["血压高怎么办", "宝宝发烧怎么办", "睡不着觉"]


def async_suite(cls: type) -> type:
    """Run a langchain-tests suite's async tests with pytest-asyncio (the project does not set asyncio_mode=auto).

    The class-wide mark also reaches the suite's sync tests, where pytest-asyncio only warns; that warning is muted.
    """
    cls = pytest.mark.asyncio(cls)
    return pytest.mark.filterwarnings("ignore:The test <Function .* is marked with '@pytest.mark.asyncio'")(cls)


class _ModelParams:
    """langchain-tests read constructor params from a property; the tiny model path comes from a fixture."""

    model_dir: Path

    @pytest.fixture(autouse=True)
    def _model(self, tiny_model_dir: Path) -> None:
        type(self).model_dir = tiny_model_dir

    @property
    def embeddings_class(self) -> type[CareEmbeddings]:
        return CareEmbeddings

    @property
    def embedding_model_params(self) -> dict:
        return {"model": str(self.model_dir)}


@async_suite
class TestCareEmbeddingsUnit(_ModelParams, EmbeddingsUnitTests):
    pass


@async_suite
class TestCareEmbeddingsIntegration(_ModelParams, EmbeddingsIntegrationTests):
    pass


def test_query_and_document_towers_are_routed_and_loaded_lazily(tiny_model_dir: Path, tower_loads: list[str]) -> None:
    embeddings = CareEmbeddings(model=str(tiny_model_dir))
    assert tower_loads == []
    query = embeddings.embed_query("血压高怎么办")
    assert tower_loads == ["query"]
    docs = embeddings.embed_documents(["高血压患者应低盐饮食。", "多喝水"])
    assert tower_loads == ["query", "document"]
    reference = AsymmetricEmbedder.from_pretrained(tiny_model_dir)
    np.testing.assert_allclose(query, reference.embed_queries(["血压高怎么办"])[0], atol=1e-6)
    np.testing.assert_allclose(docs, reference.embed_documents(["高血压患者应低盐饮食。", "多喝水"]), atol=1e-5)
    assert not np.allclose(query, embeddings.embed_documents(["血压高怎么办"])[0])  # two different towers
    assert embeddings.space[0] == len(query) == 32
    wrapped = CareEmbeddings.from_embedder(reference, model=str(tiny_model_dir))
    np.testing.assert_allclose(wrapped.embed_query("血压高怎么办"), query, atol=1e-6)


def test_bad_input_is_a_one_line_error(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="model folder not found"):
        CareEmbeddings(model=str(tmp_path / "missing"))
    embeddings = CareEmbeddings(model=str(tiny_model_dir))
    with pytest.raises(InputError, match="empty query"):
        embeddings.embed_query(" ")
    with pytest.raises(InputError, match="single str"):
        embeddings.embed_documents("not a list")
    assert embeddings.embed_documents([]) == []


# ---------------------------------------------------------------------- LangChain's own vector stores
@pytest.fixture(scope="module")
def cli_hits(tiny_model_dir: Path, small_corpus_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Top hits of `care-retriever index` + `care-retriever search --json` for QUERIES."""
    import contextlib
    import io

    store = tmp_path_factory.mktemp("lc") / "store"
    assert cli(["index", "--model", str(tiny_model_dir), "--corpus", str(small_corpus_path),
                "--store", f"faiss:{store}", "--no-progress"]) == 0  # fmt: skip
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli(["search", "--model", str(tiny_model_dir), "--store", f"faiss:{store}", "--top-k", "6",
                    "--json", *QUERIES]) == 0  # fmt: skip
    rows = [json.loads(line) for line in out.getvalue().splitlines() if line.startswith("{")]
    return {row["query"]: [(h["id"], h["score"]) for h in row["hits"]] for row in rows}


def _langchain_store(kind: str, embeddings: CareEmbeddings, corpus: Path):
    core = list(read_corpus(corpus))
    # The document text the CLI encodes (title above text), so vectors match `care-retriever index`.
    texts, ids = [d.embedding_text() for d in core], [d.id for d in core]
    metadatas = [{**d.metadata, "title": d.title} for d in core]
    if kind == "faiss":
        from langchain_community.vectorstores import FAISS
        from langchain_community.vectorstores.utils import DistanceStrategy

        return FAISS.from_texts(
            texts, embeddings, metadatas, ids=ids, distance_strategy=DistanceStrategy.MAX_INNER_PRODUCT
        )
    from langchain_qdrant import QdrantVectorStore
    from qdrant_client.http.models import Distance

    return QdrantVectorStore.from_texts(texts, embeddings, metadatas, ids=[_uuid(i) for i in ids], location=":memory:",
                                        collection_name="lc", distance=Distance.COSINE)  # fmt: skip


def _uuid(doc_id: str) -> str:
    from care_retriever.stores.qdrant import point_id

    return point_id(doc_id)


@pytest.mark.parametrize("kind", ["faiss", "qdrant"])
def test_langchain_vector_stores_return_the_cli_hits(
    kind: str, tiny_model_dir: Path, small_corpus_path: Path, cli_hits: dict
) -> None:
    importlib.import_module("langchain_community" if kind == "faiss" else "langchain_qdrant")
    store = _langchain_store(kind, CareEmbeddings(model=str(tiny_model_dir)), small_corpus_path)
    title_of = {d.id: d.title for d in read_corpus(small_corpus_path)}
    for query in QUERIES:
        want = [title_of[i] for i, _ in cli_hits[query]]
        got = store.similarity_search_with_score(query, k=6)
        assert [doc.metadata["title"] for doc, _ in got] == want
        np.testing.assert_allclose([s for _, s in got], [s for _, s in cli_hits[query]], atol=1e-5)
        retrieved = store.as_retriever(search_kwargs={"k": 2}).invoke(query)
        assert [d.metadata["title"] for d in retrieved] == want[:2]


class _RetrieverSuite(RetrieversIntegrationTests):
    kind: str
    store: object = None

    @pytest.fixture(autouse=True)
    def _store(self, tiny_model_dir: Path, small_corpus_path: Path) -> None:
        if type(self).store is None:
            importlib.import_module("langchain_community" if self.kind == "faiss" else "langchain_qdrant")
            type(self).store = _langchain_store(self.kind, CareEmbeddings(model=str(tiny_model_dir)), small_corpus_path)

    @property
    def retriever_constructor(self) -> type[BaseRetriever]:
        store = type(self).store

        def as_retriever(k: int = 4) -> BaseRetriever:
            return store.as_retriever(search_kwargs={"k": k})

        return as_retriever  # type: ignore[return-value]

    @property
    def retriever_query_example(self) -> str:
        return "血压高怎么办"


@async_suite
class TestLangChainFaissRetriever(_RetrieverSuite):
    kind = "faiss"


@async_suite
class TestQdrantVectorStoreRetriever(_RetrieverSuite):
    kind = "qdrant"
