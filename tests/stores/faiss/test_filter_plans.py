"""A filtered FAISS search chooses its plan by the filter's estimated share of the store: an exact scan of few
matching rows, the index's search under an id selector in between, an unfiltered search widened for enough
candidates where most rows match. Every plan returns the filtered top k of every index kind (the exact one where
the index is exact; the selector's answer where the codes or the IVF lists decide the candidates), every plan forced
in turn gives the reference answer for the filter agreement suite's generated corpora and filters, and a widened
search whose candidates hold too few matches falls back to the selector instead of returning short."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from benchmarks.filter_agreement import CORPORA, FILTERS, check_case, corpus_documents
from care_retriever.documents import Document
from care_retriever.stores import open_store
from care_retriever.stores.base import VectorStore
from care_retriever.stores.config import FaissIndexConfig
from care_retriever.stores.faiss import docstore, filter_plan, index_factory
from care_retriever.stores.faiss.field_index import FieldIndexes
from care_retriever.stores.faiss.filter_plan import Plan
from care_retriever.stores.filters import parse_filters

N, DIM, TOP_K = 2000, 8, 10
SCAN_ROWS = 50  # exact scans up to 50 rows here, so that a store of 2,000 rows has room for all three plans
KINDS: dict[str, dict[str, Any]] = {
    "flat": {},
    "hnsw": {"index_type": "hnsw", "m": 8, "ef_construction": 40, "ef_search": 16},
    "ivf": {"index_type": "ivf", "nlist": 16, "nprobe": 4},
    "sq8": {"quantize": "sq8"},
    # rescoring as many candidates as the kinds above return hits (oversample 1), or 4 times as many
    "hnsw sq8": {
        "index_type": "hnsw",
        "m": 8,
        "ef_construction": 40,
        "ef_search": 16,
        "quantize": "sq8",
        "oversample": 1,
    },
    "ivf pq": {
        "index_type": "ivf",
        "nlist": 16,
        "nprobe": 4,
        "quantize": "pq",
        "pq_m": 4,
        "pq_bits": 4,
        "oversample": 4,
    },
    "pq": {"quantize": "pq", "pq_m": 4, "pq_bits": 4},  # flat PQ codes take no id selector: always scanned exactly
}
EXACT = {"flat"}  # the others' answers are their index's: compared with the selector plan's


def _below(share: int) -> dict[str, Any]:
    """Rows whose ``b`` (row number modulo 100) is below ``share``: ``share``% of the store."""
    return {"field": "meta.b", "operator": "<", "value": share}


# (filter, the plan expected on a flat-like index, on an HNSW graph (its exact scan reaches sqrt(ef x m x N) rows))
PLANNED = [
    (_below(1), Plan.EXACT_SCAN, Plan.EXACT_SCAN),  # 20 rows
    (_below(10), Plan.SELECTOR, Plan.EXACT_SCAN),  # 200 rows: 300 candidates would be widened
    (_below(40), Plan.WIDENING, Plan.SELECTOR),  # 800 rows: 75 candidates, x 25 on a graph
    (_below(90), Plan.WIDENING, Plan.WIDENING),  # 1,800 rows
]


@pytest.fixture(scope="module")
def vectors() -> np.ndarray:
    rng = np.random.default_rng(7)
    found = rng.normal(size=(N, DIM)).astype(np.float32)
    return found / np.linalg.norm(found, axis=1, keepdims=True)


@pytest.fixture(scope="module", params=list(KINDS))
def kind_store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, vectors: np.ndarray) -> Any:
    store = open_store(f"faiss:{tmp_path_factory.mktemp('plans') / 's'}")
    store.prepare(DIM, "fp", "model", FaissIndexConfig(**KINDS[request.param]))
    store.upsert([Document(f"d{i}", "x", metadata={"b": i % 100}) for i in range(N)], vectors)
    store.finalize()
    yield request.param, store
    store.close()


def _ids(store: VectorStore, queries: np.ndarray, filters: dict[str, Any], k: int = TOP_K) -> list[list[str]]:
    return [[h.id for h in hits] for hits in store.search(queries, k, filters)]


def _exact(vectors: np.ndarray, queries: np.ndarray, allowed: np.ndarray, k: int = TOP_K) -> list[list[str]]:
    return [[f"d{allowed[j]}" for j in np.argsort(-(vectors[allowed] @ q), kind="stable")[:k]] for q in queries]


def test_each_plan_is_chosen_by_the_share_and_returns_the_filtered_top_k(
    kind_store: tuple[str, Any], vectors: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    kind, store = kind_store
    monkeypatch.setattr(index_factory, "EXACT_SCAN_ROWS", SCAN_ROWS)
    queries = np.random.default_rng(3).normal(size=(8, DIM)).astype(np.float32)
    for filters, flat_plan, graph_plan in PLANNED:
        allowed = np.flatnonzero(np.arange(N) % 100 < filters["value"])
        expected = Plan.EXACT_SCAN if kind == "pq" else graph_plan if "hnsw" in kind else flat_plan
        assert store.filter_plan(filters, TOP_K) is expected, (kind, filters)
        found = _ids(store, queries, filters)
        assert all(len(row) == TOP_K for row in found)
        assert {i for row in found for i in row} <= {f"d{i}" for i in allowed}
        if kind in EXACT or (expected is Plan.EXACT_SCAN and "q" not in kind):
            assert found == _exact(vectors, queries, allowed), (kind, filters)
        if expected is Plan.WIDENING:  # the same answer as the index's search under the id selector
            with monkeypatch.context() as forced:
                forced.setattr(filter_plan, "CANDIDATE_COST", math.inf)
                forced.setattr(filter_plan, "HNSW_CANDIDATE_COST", math.inf)
                assert store.filter_plan(filters, TOP_K) is Plan.SELECTOR
                selected = _ids(store, queries, filters)
            if "hnsw" in kind:  # two approximate graph searches: each finds nearly all of the exact top k
                exact = _exact(vectors, queries, allowed)
                for got in (found, selected):
                    hit = sum(len(set(a) & set(b)) for a, b in zip(got, exact, strict=True))
                    assert hit >= 0.95 * TOP_K * len(queries), (kind, filters)
            else:
                assert found == selected, (kind, filters)


@pytest.mark.parametrize("kind", ["flat", "hnsw", "sq8"])
def test_a_widened_search_left_short_of_matches_falls_back_to_the_selector(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Most rows match, but none near the queries: the widened candidates hold no match."""
    monkeypatch.setattr(index_factory, "EXACT_SCAN_ROWS", SCAN_ROWS)
    rng = np.random.default_rng(5)
    centre = np.zeros(DIM, dtype=np.float32)
    centre[0] = 1.0
    vectors = rng.normal(size=(N, DIM)).astype(np.float32)
    near = np.arange(N) < N // 5  # a fifth of the rows gathered around the centre, and refused by the filter
    vectors[near] = centre + 0.05 * vectors[near]
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    store = open_store(f"faiss:{tmp_path / 's'}")
    store.prepare(DIM, "fp", "model", FaissIndexConfig(**KINDS[kind]))
    store.upsert([Document(f"d{i}", "x", metadata={"far": not near[i]}) for i in range(N)], vectors)
    store.finalize()
    filters = {"field": "meta.far", "operator": "==", "value": True}
    assert store.filter_plan(filters, TOP_K) is Plan.WIDENING
    queries = np.stack([centre] * 3) + 0.01 * rng.normal(size=(3, DIM)).astype(np.float32)
    found = _ids(store, queries, filters)
    exact = _exact(vectors, queries, np.flatnonzero(~near))
    if kind == "hnsw":
        assert all(len(row) == TOP_K for row in found)
        assert sum(len(set(a) & set(b)) for a, b in zip(found, exact, strict=True)) >= 0.9 * TOP_K * len(queries)
    else:
        assert found == exact
    store.close()


# (exact-scan threshold, cost of a widened candidate): each forces one plan where the filter matches a row
FORCED = {Plan.EXACT_SCAN: (10**6, math.inf), Plan.SELECTOR: (0, math.inf), Plan.WIDENING: (0, 0.0)}


@settings(
    max_examples=5,
    derandomize=True,
    deadline=None,
    database=None,
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
)
@given(metadata=CORPORA, data=st.data())
def test_every_plan_gives_the_reference_answer_for_generated_filters(
    tmp_path_factory: pytest.TempPathFactory, metadata: list[dict[str, Any]], data: st.DataObject
) -> None:
    """The filter agreement suite's corpora and filter trees, answered under each plan forced in turn."""
    documents, vectors = corpus_documents(metadata, seed=len(metadata), dim=DIM)
    store = open_store(f"faiss:{tmp_path_factory.mktemp('generated') / 's'}")
    store.prepare(DIM, "fp", "model")
    store.upsert(documents, vectors)
    store.finalize()
    for i in range(6):
        filters = data.draw(FILTERS, label=f"filter {i}")
        query = np.random.default_rng(i).normal(size=DIM).astype(np.float32)
        query /= np.linalg.norm(query)
        for plan, (scan_rows, cost) in FORCED.items():
            with pytest.MonkeyPatch.context() as forced:
                forced.setattr(index_factory, "EXACT_SCAN_ROWS", scan_rows)
                forced.setattr(filter_plan, "CANDIDATE_COST", cost)
                expected = plan if store.count(filters) else Plan.EXACT_SCAN  # no row: nothing to search
                assert store.filter_plan(filters, TOP_K) in (None, expected)  # None: a filter every row passes
                assert check_case({plan.value: store}, documents, vectors, filters, query) == []
    store.close()


def test_a_widened_hnsw_search_skips_removed_rows(tmp_path: Path, vectors: np.ndarray) -> None:
    """Removed rows stay in an HNSW graph and come back from its unfiltered search; a widened search drops them."""
    store = open_store(f"faiss:{tmp_path / 's'}")
    store.prepare(DIM, "fp", "model", FaissIndexConfig(**KINDS["hnsw"]))
    store.upsert([Document(f"d{i}", "x", metadata={"b": i % 100}) for i in range(N)], vectors)
    store.finalize()
    queries = vectors[:4]
    filters = _below(90)
    removed = _ids(store, queries[:1], filters)[0]  # the first query's best: 10 tombstones
    with store.transaction() as tx:
        assert tx.delete(removed) == len(removed)
    assert store.filter_plan(filters, TOP_K) is Plan.WIDENING
    live = np.setdiff1d(np.flatnonzero(np.arange(N) % 100 < 90), [int(i[1:]) for i in removed])
    found = _ids(store, queries, filters)
    assert all(len(row) == TOP_K and not set(row) & set(removed) for row in found)
    exact = _exact(vectors, queries, live)
    assert sum(len(set(a) & set(b)) for a, b in zip(found, exact, strict=True)) >= 0.95 * TOP_K * len(queries)
    store.close()


def test_widening_is_chosen_where_its_candidates_cost_less_than_the_matching_rows() -> None:
    wide = filter_plan.widening_candidates
    assert wide(0.5, 10, 10**6, graph=False, scan_rows=20_000) == 60  # (2 x 10 + 10) / 0.5
    assert wide(0.5, 10, 10**6, graph=True, scan_rows=64_000) == 60
    assert wide(0.05, 10, 10**6, graph=False, scan_rows=20_000) == 600
    assert wide(0.01, 10, 10**6, graph=False, scan_rows=20_000) is None  # 10,000 rows: an exact scan
    assert wide(0.02, 10, 10**6, graph=True, scan_rows=64_000) is None  # 1,500 graph candidates cost more
    assert wide(0.01, 10, 10**7, graph=False, scan_rows=20_000) is None  # over the candidates a GPU index returns
    assert wide(0.02, 10, 10**7, graph=False, scan_rows=20_000) == 1500
    assert wide(None, 10, 10**6, graph=False, scan_rows=20_000) is None
    assert wide(0.0, 10, 10**6, graph=False, scan_rows=20_000) is None


def test_the_share_is_estimated_on_a_sample_redrawn_when_the_store_changes(tmp_path: Path) -> None:
    db = docstore.connect(tmp_path / "docstore.sqlite")
    n = 8_000
    docstore.insert(db, list(range(n)), [Document(f"d{i}", "x", metadata={"b": i % 100}) for i in range(n)])
    db.commit()
    indexes = FieldIndexes(db)
    for share in (1, 30, 95):
        estimate = indexes.fraction(parse_filters(_below(share)))
        assert estimate is not None and abs(estimate - share / 100) < 0.1, (share, estimate)
    assert indexes.fraction(parse_filters({"b": 1000})) == 0.0
    assert indexes.fraction(parse_filters({"b": 1})) > 0.0  # kept apart from True (== 1): a boolean matches none
    assert indexes.fraction(parse_filters({"b": True})) == 0.0
    rows = np.arange(0, n + 50, 7)  # rows past the store's match nothing
    assert indexes.matching(parse_filters(_below(30)), rows).tolist() == [r for r in rows if r < n and r % 100 < 30]
    more = 2 * n  # rows past the sampled ones: the sample is drawn again over them all
    docstore.insert(db, list(range(n, n + more)), [Document(f"e{i}", "x", metadata={"b": 1000}) for i in range(more)])
    db.commit()
    estimate = indexes.fraction(parse_filters({"b": 1000}))
    assert estimate is not None and abs(estimate - 2 / 3) < 0.1, estimate
    db.close()
