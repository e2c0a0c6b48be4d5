"""One filter, one answer: generated corpora and filter trees (benchmarks/filter_agreement.py's strategies) give
the same counts, ids and scores on FAISS, Qdrant Edge (folder and memory), qdrant-client's local engine and a FAISS
store copied to Edge as the reference evaluator, and through every door (the Python API, the HTTP service,
LangChain, Haystack) over them; and the reference evaluator agrees with Haystack's own ``document_matches_filter``
wherever the two languages mean the same."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import faiss
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

pytest.importorskip("qdrant_edge")
pytest.importorskip("haystack")
pytest.importorskip("langchain_core")
pytest.importorskip("fastapi")

from benchmarks.filter_agreement import (
    CORPORA,
    FILTERS,
    QUERIES,
    check_case,
    check_doors,
    corpus_documents,
    opened_stores,
    query_vectors,
)
from care_retriever.stores.filter_matching import matches
from care_retriever.stores.filters import parse_filters

CASES_PER_CORPUS = 12


@pytest.fixture(scope="module")
def texts(embedder) -> dict[str, np.ndarray]:
    return query_vectors(embedder)


@settings(
    max_examples=3,
    derandomize=True,
    deadline=None,
    database=None,
    phases=[Phase.generate],  # no shrinking: each example builds five stores
    suppress_health_check=list(HealthCheck),
)
@given(metadata=CORPORA, data=st.data())
def test_every_engine_and_door_gives_the_reference_answer(
    embedder, tiny_model_dir: Path, texts: dict[str, np.ndarray], metadata: list[dict[str, Any]], data: st.DataObject
) -> None:
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)  # searches of a few vectors: thread start-up would be all of their cost
    try:
        documents, vectors = corpus_documents(metadata, seed=len(metadata), dim=embedder.dim)
        with opened_stores(documents, vectors, embedder, tiny_model_dir) as (stores, doors):
            names = list(doors)
            for i in range(CASES_PER_CORPUS):
                filters = data.draw(FILTERS, label=f"filter {i}")
                query = np.random.default_rng(i).normal(size=vectors.shape[1]).astype(np.float32)
                query /= np.linalg.norm(query)  # unit, as the stored vectors: no ties, cosine == dot
                assert check_case(stores, documents, vectors, filters, query) == []
                text = QUERIES[i % len(QUERIES)]
                door = data.draw(st.sampled_from(names), label=f"door {i}")
                assert check_doors({door: doors[door]}, documents, vectors, filters, text, texts[text]) == []
    finally:
        faiss.omp_set_num_threads(threads)


# Where the two languages mean the same: one type per field (Haystack's Python ``True == 1`` and its refusal to
# order a number against a string are not this language's), no stored lists (Haystack compares a list whole).
NUMBERS = st.sampled_from([0, 1, -1, 2, 2.5, 2**40, -3.25, 1e-7])
WORDS = st.sampled_from(["", "a", "高血压", "心内科", "é"])
ORACLE_META = st.fixed_dictionaries(
    {},
    optional={
        "n": NUMBERS | st.none(),
        "s": WORDS | st.none(),
        "o": st.fixed_dictionaries({}, optional={"k": NUMBERS}) | st.none(),
    },
)
TYPED_FIELDS = [("meta.n", NUMBERS), ("meta.s", WORDS), ("meta.o.k", NUMBERS)]


@st.composite
def oracle_filters(draw: st.DrawFn) -> dict[str, Any]:
    field, values = draw(st.sampled_from(TYPED_FIELDS))
    operator = draw(
        st.sampled_from(["==", "!=", "in", "not in"] + ([">", ">=", "<", "<="] if values is NUMBERS else []))
    )
    if operator in ("in", "not in"):
        value: Any = draw(st.lists(values | st.none(), min_size=1, max_size=3))
    else:
        value = draw(values | st.none())
    return {"field": field, "operator": operator, "value": value}


ORACLE_TREES = st.recursive(
    oracle_filters(),
    lambda children: st.builds(
        lambda op, conditions: {"operator": op, "conditions": conditions},
        st.sampled_from(["AND", "OR", "NOT"]),
        st.lists(children, min_size=1, max_size=3),
    ),
    max_leaves=5,
)


@settings(max_examples=300, derandomize=True, deadline=None, database=None)
@given(ORACLE_TREES, ORACLE_META)
def test_the_reference_evaluator_agrees_with_haystacks(filters: dict[str, Any], metadata: dict[str, Any]) -> None:
    from haystack import Document as HaystackDocument
    from haystack.utils.filters import document_matches_filter

    expected = document_matches_filter(filters, HaystackDocument(content="x", meta=metadata))
    assert matches(parse_filters(filters), metadata) == expected
