"""CareVectorStore: langchain-tests VectorStore and Retriever suites, and stores built by `care-retriever index`."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
from collections.abc import Iterator
from pathlib import Path

import langchain_core  # noqa: F401  (dev dependency: a broken install fails, never skips)
import langchain_tests  # noqa: F401  (dev dependency: a broken install fails, never skips)
import numpy as np
import pytest
from langchain_core.retrievers import BaseRetriever
from langchain_core.vectorstores import VectorStoreRetriever
from langchain_tests.integration_tests import RetrieversIntegrationTests, VectorStoreIntegrationTests

from care_retriever.cli.main import main as cli
from care_retriever.errors import InputError, StoreError
from care_retriever.integrations.langchain import CareEmbeddings, CareVectorStore

QUERIES = ["血压高怎么办", "宝宝发烧怎么办", "睡不着觉"]


def async_suite(cls: type) -> type:
    """Run a langchain-tests suite's async tests with pytest-asyncio (the project does not set asyncio_mode=auto).

    The class-wide mark also reaches the suite's sync tests, where pytest-asyncio only warns; that warning is muted.
    """
    cls = pytest.mark.asyncio(cls)
    return pytest.mark.filterwarnings("ignore:The test <Function .* is marked with '@pytest.mark.asyncio'")(cls)


@async_suite
class TestCareVectorStoreFaiss(VectorStoreIntegrationTests):
    """The full suite (sync, async, get_by_ids) on a FAISS folder, with the suite's deterministic embeddings."""

    @pytest.fixture
    def vectorstore(self, tmp_path: Path) -> Iterator[CareVectorStore]:
        store = CareVectorStore(f"faiss:{tmp_path / 'store'}", self.get_embeddings())
        try:
            yield store
        finally:
            store.delete()
            store.close()


@async_suite
class TestCareVectorStoreQdrant(VectorStoreIntegrationTests):
    """The full suite on Qdrant's embedded local mode."""

    @pytest.fixture
    def vectorstore(self, tmp_path: Path) -> Iterator[CareVectorStore]:
        importlib.import_module("qdrant_client")
        store = CareVectorStore(f"qdrant:{tmp_path / 'qdrant'}", self.get_embeddings())
        try:
            yield store
        finally:
            store.delete()
            store.close()


# ---------------------------------------------------------------------- stores built by the CLI
def _cli(*args: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli(list(args)) == 0
    return out.getvalue()


@pytest.fixture(scope="module")
def cli_stores(tiny_model_dir: Path, small_corpus_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The same corpus indexed by `care-retriever index` into FAISS and Qdrant local mode, with CLI search hits."""
    root = tmp_path_factory.mktemp("lcstores")
    stores = {"faiss": f"faiss:{root / 'faiss'}", "qdrant": f"qdrant:{root / 'qdrant'}"}
    out = {}
    for kind, spec in stores.items():
        if kind == "qdrant":
            importlib.import_module("qdrant_client")
        _cli(
            "index",
            "--model",
            str(tiny_model_dir),
            "--corpus",
            str(small_corpus_path),
            "--store",
            spec,
            "--no-progress",
        )
        lines = _cli("search", "--model", str(tiny_model_dir), "--store", spec, "--top-k", "6", "--json", *QUERIES)
        rows = [json.loads(line) for line in lines.splitlines() if line.startswith("{")]
        out[kind] = (spec, {r["query"]: [(h["id"], h["score"]) for h in r["hits"]] for r in rows})
    return out


@pytest.mark.parametrize("kind", ["faiss", "qdrant"])
def test_opens_a_cli_index_without_re_encoding_and_matches_cli_search(
    kind: str, tiny_model_dir: Path, cli_stores: dict, tower_loads: list[str]
) -> None:
    spec, hits = cli_stores[kind]
    embeddings = CareEmbeddings(model=str(tiny_model_dir))
    store = CareVectorStore(spec, embeddings)
    try:
        for query in QUERIES:
            got = store.similarity_search_with_score(query, k=6)
            assert [d.id for d, _ in got] == [i for i, _ in hits[query]]
            np.testing.assert_allclose([s for _, s in got], [s for _, s in hits[query]], atol=1e-5)
            retriever = store.as_retriever(search_kwargs={"k": 3})
            assert isinstance(retriever, VectorStoreRetriever)
            assert [d.id for d in retriever.invoke(query)] == [i for i, _ in hits[query][:3]]
        assert "document" not in tower_loads and "both" not in tower_loads  # searching never built the document tower
        doc = store.get_by_ids(["a"])[0]
        assert doc.page_content.startswith("高血压患者") and doc.metadata == {"group": "even", "title": "高血压"}
        filtered = store.similarity_search(QUERIES[0], k=6, filter={"group": "odd"})
        assert filtered and all(d.metadata["group"] == "odd" for d in filtered)
        relevance = store.similarity_search_with_relevance_scores(QUERIES[0], k=6)
        assert all(0.0 <= s <= 1.0 for _, s in relevance)
        mmr = store.max_marginal_relevance_search(QUERIES[0], k=3, fetch_k=6)
        assert len({d.id for d in mmr}) == 3 and mmr[0].id == hits[QUERIES[0]][0][0]
    finally:
        store.close()


def test_documents_added_through_langchain_are_searchable_by_the_cli(tiny_model_dir: Path, tmp_path: Path) -> None:
    embeddings = CareEmbeddings(model=str(tiny_model_dir))
    texts = ["高血压患者应低盐饮食。", "感冒多休息多喝水。", "失眠可以规律作息。"]
    store = CareVectorStore.from_texts(
        texts, embeddings, [{"title": "高血压"}, {}, {"k": 1}], ids=["x", "y", "z"], store=f"faiss:{tmp_path / 's'}"
    )
    store.close()
    out = _cli("search", "--model", str(tiny_model_dir), "--store", f"faiss:{tmp_path / 's'}", "--json", "睡不着")
    hits = json.loads(out.strip().splitlines()[-1])["hits"]
    assert sorted(h["id"] for h in hits) == ["x", "y", "z"]
    assert {h["id"]: h["title"] for h in hits}["x"] == "高血压"


def test_wrong_model_and_bad_input_are_one_line_errors(tiny_model_dir: Path, tmp_path: Path) -> None:
    fake = TestCareVectorStoreFaiss.get_embeddings()
    other = CareVectorStore(f"faiss:{tmp_path / 's'}", fake)
    other.add_texts(["foo"], ids=["1"])
    other.close()
    with pytest.raises(StoreError, match="dimension mismatch"):
        CareVectorStore(f"faiss:{tmp_path / 's'}", CareEmbeddings(model=str(tiny_model_dir)))
    store = CareVectorStore(f"faiss:{tmp_path / 's'}", fake)
    with pytest.raises(InputError, match="metadatas"):
        store.add_texts(["a", "b"], [{}])
    with pytest.raises(InputError, match="JSON"):
        store.add_texts(["a"], [{"bad": object()}])
    with pytest.raises(InputError, match="needs store="):
        CareVectorStore.from_texts(["a"], fake)
    assert [d.id for d in store.similarity_search("foo", k=5)] == ["1"]  # failed writes left the store intact


@async_suite
class TestCareVectorStoreRetriever(RetrieversIntegrationTests):
    """`.as_retriever()` of a CareVectorStore over a CLI-built FAISS index, through the retriever suite."""

    @pytest.fixture(autouse=True)
    def _store(self, tiny_model_dir: Path, cli_stores: dict) -> None:
        type(self).spec, type(self).model = cli_stores["faiss"][0], str(tiny_model_dir)

    @property
    def retriever_constructor(self) -> type[BaseRetriever]:
        store = CareVectorStore(self.spec, CareEmbeddings(model=self.model))

        def as_retriever(k: int = 4) -> BaseRetriever:
            return store.as_retriever(search_kwargs={"k": k})

        return as_retriever  # type: ignore[return-value]

    @property
    def retriever_query_example(self) -> str:
        return "血压高怎么办"
