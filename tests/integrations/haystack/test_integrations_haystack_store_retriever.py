"""CareStoreRetriever: CLI-built FAISS and Qdrant (local mode) stores searched from a Haystack pipeline.

Every expectation comes from the CLI on the same store (`care-retriever search --json`, with and
without `--filter`) or from Haystack's own filter evaluator applied to the CLI's full ranking.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")  # offline: no usage pings
import haystack  # noqa: F401  (dev dependency: a broken install fails, never skips)
import qdrant_client  # noqa: F401  (dev dependency: a broken install fails, never skips)
from haystack import Document, Pipeline
from haystack.core.errors import DeserializationError
from haystack.utils import Secret
from haystack.utils.filters import document_matches_filter

from care_retriever.cli.main import main as cli
from care_retriever.errors import InputError, StoreError
from care_retriever.integrations.haystack import CareFaissDocumentStore, CareStoreRetriever, CareTextEmbedder
from care_retriever.integrations.haystack.filters import to_core_filters
from care_retriever.integrations.haystack.store_retriever import _pre_filter
from care_retriever.stores import parse_store_spec

# qdrant-client checks a server's version in a background thread; against the unreachable server
# below its warning may land in whichever test runs next.
pytestmark = pytest.mark.filterwarnings("ignore:Failed to obtain server version:UserWarning")

ALLOWED = ["care_retriever.integrations.haystack"]
QUERIES = ["血压高怎么办", "宝宝发烧怎么办", "睡不着觉"]
BACKENDS = ["faiss", "qdrant"]
N_DOCS = 6  # the small corpus

Ranking = list[tuple[str, float]]


@pytest.fixture(scope="module")
def specs(tiny_model_dir: Path, small_corpus_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The small corpus indexed by `care-retriever index` into a FAISS folder and a Qdrant local folder."""
    root = tmp_path_factory.mktemp("store_retriever")
    out = {"faiss": f"faiss:{root / 'faiss'}", "qdrant": f"qdrant:{root / 'qdrant'}"}
    for spec in out.values():
        args = ["index", "--model", str(tiny_model_dir), "--corpus", str(small_corpus_path)]
        assert cli([*args, "--store", spec, "--no-progress"]) == 0
    return out


_CLI: dict[tuple[str, tuple[str, ...]], list[list[dict]]] = {}


def cli_hits(model: Path, spec: str, capsys: pytest.CaptureFixture[str], *filters: str) -> list[list[dict]]:
    """`care-retriever search --json --top-k 6` hits of every query (one CLI call per store and filter, cached).

    The CLI opens and closes the store itself: with Qdrant local mode (one client per folder) no
    retriever may hold the folder open at the same time.
    """
    key = (spec, filters)
    if key not in _CLI:
        capsys.readouterr()
        flags = [arg for f in filters for arg in ("--filter", f)]
        args = ["search", "--model", str(model), "--store", spec, "--top-k", str(N_DOCS), "--json", *flags]
        assert cli([*args, *QUERIES]) == 0
        lines = capsys.readouterr().out.strip().splitlines()[-len(QUERIES) :]
        _CLI[key] = [json.loads(line)["hits"] for line in lines]
    return _CLI[key]


def as_document(hit: dict) -> Document:
    """A CLI hit as the Document the retriever should return (title is a meta key in Haystack)."""
    meta = {**hit["metadata"], **({"title": hit["title"]} if hit["title"] else {})}
    return Document(id=hit["id"], content=hit["text"], meta=meta, score=hit["score"])


def ranking(docs: list[Document]) -> Ranking:
    return [(d.id, float(d.score or 0.0)) for d in docs]


def assert_same(got: Ranking, want: Ranking) -> None:
    assert [i for i, _ in got] == [i for i, _ in want]
    np.testing.assert_allclose([s for _, s in got], [s for _, s in want], atol=1e-5)


def query_pipeline(model: Path, retriever: CareStoreRetriever) -> Pipeline:
    pipe = Pipeline()
    pipe.add_component("embedder", CareTextEmbedder(str(model)))
    pipe.add_component("retriever", retriever)
    pipe.connect("embedder.embedding", "retriever.query_embedding")
    return pipe


@pytest.fixture
def open_pipes() -> Iterator[list[Pipeline]]:
    """Pipelines a test opens; closed at its end so the next test can open the Qdrant folder again."""
    pipes: list[Pipeline] = []
    yield pipes
    for pipe in pipes:
        pipe.close()


def run(pipe: Pipeline, query: str, **retriever_inputs: object) -> list[Document]:
    return pipe.run({"embedder": {"text": query}, "retriever": retriever_inputs})["retriever"]["documents"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_pipeline_returns_the_cli_hits_and_scores(
    backend: str,
    specs: dict[str, str],
    tiny_model_dir: Path,
    capsys: pytest.CaptureFixture[str],
    open_pipes: list[Pipeline],
) -> None:
    spec = specs[backend]
    want = cli_hits(tiny_model_dir, spec, capsys)
    pipe = query_pipeline(tiny_model_dir, CareStoreRetriever(spec, model=str(tiny_model_dir), top_k=3))
    open_pipes.append(pipe)
    pipe.warm_up()
    for query, hits in zip(QUERIES, want, strict=True):
        expected = [as_document(h) for h in hits]
        assert_same(ranking(run(pipe, query)), ranking(expected)[:3])
        full = run(pipe, query, top_k=N_DOCS)
        assert_same(ranking(full), ranking(expected))
        assert [(d.content, d.meta) for d in full] == [(d.content, d.meta) for d in expected]
        assert full[0].meta["title"] and "group" in full[0].meta
        scaled = run(pipe, query, top_k=1, scale_score=True)[0]
        assert scaled.score == pytest.approx((expected[0].score + 1) / 2, abs=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("filters", "cli_filter"),
    [
        ({"field": "meta.group", "operator": "==", "value": "odd"}, "group=odd"),
        ({"field": "meta.group", "operator": "in", "value": ["even", "none"]}, "group=even,none"),
    ],
)
def test_equality_filters_run_in_the_store_and_match_cli_filter(
    backend: str,
    filters: dict,
    cli_filter: str,
    specs: dict[str, str],
    tiny_model_dir: Path,
    capsys: pytest.CaptureFixture[str],
    open_pipes: list[Pipeline],
) -> None:
    spec = specs[backend]
    assert _pre_filter(backend, filters) == to_core_filters(filters) is not None  # the store's pre-filter path
    want = cli_hits(tiny_model_dir, spec, capsys, cli_filter)
    pipe = query_pipeline(tiny_model_dir, CareStoreRetriever(spec, filters=filters, top_k=2))
    open_pipes.append(pipe)
    for query, hits in zip(QUERIES, want, strict=True):
        assert len(hits) == 3  # three of the six documents per group
        assert_same(ranking(run(pipe, query)), ranking([as_document(h) for h in hits])[:2])


POST_FILTERS = [
    # OR, != and a title comparison: none of it maps onto the core's metadata-equality pre-filter.
    {
        "operator": "OR",
        "conditions": [
            {"field": "meta.title", "operator": "==", "value": "感冒"},
            {"field": "meta.group", "operator": "!=", "value": "odd"},
        ],
    },
    {"field": "meta.title", "operator": "not in", "value": ["高血压", "儿童发烧", "失眠"]},
    {"field": "content", "operator": "==", "value": "失眠可以通过规律作息、睡前避免咖啡和手机来改善。"},
]


@pytest.mark.parametrize("backend", BACKENDS)
def test_other_filters_post_filter_like_haystacks_evaluator(
    backend: str,
    specs: dict[str, str],
    tiny_model_dir: Path,
    capsys: pytest.CaptureFixture[str],
    open_pipes: list[Pipeline],
) -> None:
    spec = specs[backend]
    full = cli_hits(tiny_model_dir, spec, capsys)
    pipe = query_pipeline(tiny_model_dir, CareStoreRetriever(spec, top_k=2))
    open_pipes.append(pipe)
    for filters in POST_FILTERS:
        assert to_core_filters(filters) is None
        for query, hits in zip(QUERIES, full, strict=True):
            want = [d for d in map(as_document, hits) if document_matches_filter(filters, d)]
            assert want  # the filter keeps something, so the comparison is not vacuous
            # top_k=2 from a top-2 search: the candidate list must widen to find the matches.
            assert_same(ranking(run(pipe, query, filters=filters)), ranking(want)[:2])


@pytest.mark.parametrize("backend", BACKENDS)
def test_filter_policy_replace_and_merge(
    backend: str,
    specs: dict[str, str],
    tiny_model_dir: Path,
    capsys: pytest.CaptureFixture[str],
    open_pipes: list[Pipeline],
) -> None:
    spec = specs[backend]
    full = cli_hits(tiny_model_dir, spec, capsys)
    odd = {"field": "meta.group", "operator": "==", "value": "odd"}
    not_cold = {"field": "meta.title", "operator": "!=", "value": "感冒"}
    merged = {"operator": "AND", "conditions": [odd, not_cold]}
    for policy, expected_filter in (("replace", not_cold), ("merge", merged)):
        pipe = query_pipeline(tiny_model_dir, CareStoreRetriever(spec, filters=odd, filter_policy=policy, top_k=N_DOCS))
        open_pipes.append(pipe)
        for query, hits in zip(QUERIES, full, strict=True):
            want = [d for d in map(as_document, hits) if document_matches_filter(expected_filter, d)]
            assert_same(ranking(run(pipe, query, filters=not_cold)), ranking(want))
            init_only = [d for d in map(as_document, hits) if document_matches_filter(odd, d)]
            assert_same(ranking(run(pipe, query)), ranking(init_only))
        pipe.close()  # Qdrant local mode: one client per folder at a time


@pytest.mark.parametrize("backend", BACKENDS)
def test_yaml_round_trip_serves_the_same_hits(
    backend: str,
    specs: dict[str, str],
    tiny_model_dir: Path,
    capsys: pytest.CaptureFixture[str],
    open_pipes: list[Pipeline],
) -> None:
    spec = specs[backend]
    want = cli_hits(tiny_model_dir, spec, capsys)
    pipe = query_pipeline(tiny_model_dir, CareStoreRetriever(spec, collection=None, top_k=4, filter_policy="merge"))
    yaml = pipe.dumps()
    assert "CareStoreRetriever" in yaml and spec in yaml
    loaded = Pipeline.loads(yaml, allowed_modules=ALLOWED)
    open_pipes.append(loaded)
    assert loaded.to_dict() == pipe.to_dict()
    for query, hits in zip(QUERIES, want, strict=True):
        assert_same(ranking(run(loaded, query)), ranking([as_document(h) for h in hits])[:4])


def test_to_dict_from_dict_round_trip_without_secrets(tmp_path: Path) -> None:
    filters = {"field": "meta.group", "operator": "==", "value": "odd"}
    retriever = CareStoreRetriever(
        "qdrant:http://localhost:6333",
        collection="medical",
        filters=filters,
        top_k=3,
        scale_score=True,
        filter_policy="merge",
        api_key=Secret.from_env_var("MY_QDRANT_KEY"),
    )
    data = retriever.to_dict()
    assert data["init_parameters"]["api_key"] == {"type": "env_var", "env_vars": ["MY_QDRANT_KEY"], "strict": True}
    again = CareStoreRetriever.from_dict(json.loads(json.dumps(data)))
    assert again.to_dict() == data
    assert (again.store, again.collection, again.filters, again.top_k) == (
        "qdrant:http://localhost:6333",
        "medical",
        filters,
        3,
    )
    with pytest.raises(ValueError, match="Cannot serialize token-based secret"):
        CareStoreRetriever("faiss:x", api_key=Secret.from_token("s3cret")).to_dict()
    with pytest.raises(ValueError, match="holds credentials"):
        CareStoreRetriever("qdrant:https://user:s3cret@qdrant.example:6333").to_dict()


def test_bad_spec_is_the_cores_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(InputError) as info:
        parse_store_spec("sqlite:x")
    with pytest.raises(InputError) as ours:
        CareStoreRetriever("sqlite:x")
    assert str(ours.value) == str(info.value) and "\n" not in str(ours.value)
    pipe = query_pipeline(tmp_path, CareStoreRetriever(f"faiss:{tmp_path}"))
    yaml = pipe.dumps().replace(f"faiss:{tmp_path}", "sqlite:x")
    with pytest.raises(DeserializationError) as wrapped:
        Pipeline.loads(yaml, allowed_modules=ALLOWED)
    assert isinstance(wrapped.value.__cause__, InputError)
    with pytest.raises(StoreError, match="store is empty or does not exist"):
        CareStoreRetriever(f"faiss:{tmp_path / 'missing'}").warm_up()
    with pytest.raises(StoreError, match="store is empty or does not exist"):
        CareStoreRetriever(f"qdrant:{tmp_path / 'missing-qdrant'}").run(query_embedding=[1.0, 0.0])


def test_unreachable_server_with_a_secret_key_fails_in_one_line_without_the_key() -> None:
    retriever = CareStoreRetriever("qdrant:http://127.0.0.1:1", api_key=Secret.from_token("s3cret-key"))
    with pytest.warns(UserWarning, match="insecure"), pytest.raises(StoreError, match="cannot reach Qdrant") as info:
        retriever.warm_up()
    assert "s3cret-key" not in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dimension_mismatch_and_bad_embeddings(backend: str, specs: dict[str, str]) -> None:
    retriever = CareStoreRetriever(specs[backend])
    try:
        with pytest.raises(ValueError, match=r"query_embedding has 5 dims but .* holds 32-dim vectors"):
            retriever.run(query_embedding=[0.1] * 5)
        with pytest.raises(ValueError, match="all zeros"):
            retriever.run(query_embedding=[0.0] * 32)
        with pytest.raises(ValueError, match="NaN"):
            retriever.run(query_embedding=[float("nan")] * 32)
        with pytest.raises(ValueError, match="non-empty list"):
            retriever.run(query_embedding=[])
        with pytest.raises(ValueError, match="top_k"):
            retriever.run(query_embedding=[0.1] * 32, top_k=0)
    finally:
        retriever.close()


def test_model_check_refuses_a_store_from_another_space_and_hidden_docs_are_skipped(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    # A store written from Haystack without model= records an unknown space: the model check refuses it.
    def vector(*head: float) -> list[float]:
        return [*head, *[0.0] * (32 - len(head))]

    store = CareFaissDocumentStore(str(tmp_path / "hs"), embedding_dim=32)
    store.write_documents(
        [
            Document(id="x", content="有向量", meta={"title": "标题", "k": 1}, embedding=vector(1.0)),
            Document(id="y", content="也有向量", embedding=vector(0.6, 0.8)),
            Document(id="no-vector", content="没有向量"),
        ]
    )
    store.close()
    spec = f"faiss:{tmp_path / 'hs'}"
    with pytest.raises(StoreError, match="built with another model"):
        CareStoreRetriever(spec, model=str(tiny_model_dir)).warm_up()
    retriever = CareStoreRetriever(spec, top_k=5)
    docs = retriever.run(query_embedding=vector(2.0))["documents"]  # not unit-norm: scores stay cosine
    assert [(d.id, d.content, d.meta) for d in docs] == [
        ("x", "有向量", {"k": 1, "title": "标题"}),
        ("y", "也有向量", {}),
    ]
    np.testing.assert_allclose([d.score for d in docs], [1.0, 0.6], atol=1e-6)
    retriever.close()
