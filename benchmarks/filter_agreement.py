"""Does one filter give the same answer on every engine and through every door? Generated corpora (nested objects,
numbers at type boundaries, booleans, unicode keys and values, missing fields, lists, ISO dates) and random filter
trees run on ``faiss:``, ``qdrant:DIR`` (Edge), ``qdrant::memory:``, qdrant-client's local engine and a FAISS store
copied to Edge; each (filter, query) case is checked against the reference evaluator
(:func:`care_retriever.stores.filter_matching.matches`): each store's count, and its top-k ids and scores against an
exact numpy search of the matching documents. Each case also asks one door over one store (the next pair each case,
:mod:`benchmarks.filter_doors`: the Python API, the HTTP service, LangChain; Haystack on FAISS) with a query text a
tiny model encodes.

    python -m benchmarks.filter_agreement --cases 10000      # the count of disagreements, into docs/filters.md

The property suite (tests/cross/test_filter_agreement.py) runs the same cases, a few dozen, derandomized.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import faiss
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import NonInteractiveExampleWarning

from benchmarks.filter_doors import Door, Ranked, opened_doors, tiny_model
from benchmarks.marked_sections import write_marked
from care_retriever.documents import Document
from care_retriever.stores import open_store
from care_retriever.stores.base import VectorStore
from care_retriever.stores.filter_matching import matches
from care_retriever.stores.filters import parse_filters

TOP_K = 5
DOCS = Path(__file__).resolve().parents[1] / "docs" / "filters.md"
# what the text doors are asked (each encoded by the query tower of the run's model)
QUERIES = ["高血压怎么办", "糖尿病饮食注意什么", "感冒发烧", "头痛失眠", "心内科门诊", "儿童咳嗽"]
INTEGERS = [0, 1, -1, 2, 3, 2**31 - 1, 2**31, -(2**31), 2**53 - 1, -(2**53 - 1)]
FLOATS = [0.0, 1.0, 0.5, -2.5, 2.0, 3.0, 2.0**31, 1e-7, 123456.789]
STRINGS = [
    "",
    "a",
    "A",
    "3",
    "true",
    "高血压",
    "心内科",
    "é",
    "2021-03-01",
    "2021-03-01T08:00:00+08:00",
    "1999-12-31T23:59:59Z",
    "2021-03-01T08:00",
    "2021-03-01 00:00:00.0005",
    "2021-03-01T00:00:00.000001+00:00",
]
DATES = [
    "2021-03-01",
    "2021-03-01T00:00:00Z",
    "2000-01-01T00:00:00+08:00",
    "2021-02-28T23:00:00-02:00",
    "2021-03-01T00:00:00.0004Z",  # between stored instants a microsecond apart
    "2021-03-01 08:00",
]
SCALARS = st.one_of(
    st.sampled_from(INTEGERS), st.sampled_from(FLOATS), st.sampled_from(STRINGS), st.booleans(), st.none()
)
STORED = st.one_of(SCALARS, st.lists(SCALARS.filter(lambda v: v is not None), max_size=3))
FIELDS = ["n", "s", "年份", "x-y", "l", "o.k", "o.p.q", "absent"]


def _metadata() -> st.SearchStrategy[dict[str, Any]]:
    inner = st.fixed_dictionaries({}, optional={"q": STORED})
    nested = st.fixed_dictionaries({}, optional={"k": STORED, "p": inner})
    return st.fixed_dictionaries(
        {}, optional={"n": STORED, "s": STORED, "年份": STORED, "x-y": STORED, "l": STORED, "o": nested | SCALARS}
    )


CORPORA = st.lists(_metadata(), min_size=1, max_size=14)


def _comparison() -> st.SearchStrategy[dict[str, Any]]:
    field = st.sampled_from(FIELDS).map(lambda f: f"meta.{f}")
    equal = st.tuples(field, st.sampled_from(["==", "!="]), SCALARS)
    listed = st.tuples(field, st.sampled_from(["in", "not in"]), st.lists(SCALARS, min_size=1, max_size=3))
    bound = st.one_of(st.sampled_from(INTEGERS + FLOATS), st.sampled_from(DATES), st.none())
    ordered = st.tuples(field, st.sampled_from([">", ">=", "<", "<="]), bound)
    return st.one_of(equal, listed, ordered).map(lambda t: {"field": t[0], "operator": t[1], "value": t[2]})


def _short_form() -> st.SearchStrategy[dict[str, Any]]:
    value = SCALARS.filter(lambda v: v is not None) | st.lists(SCALARS.filter(lambda v: v is not None), min_size=1)
    return st.dictionaries(st.sampled_from(FIELDS), value, min_size=1, max_size=2)


FILTERS = st.one_of(
    _short_form(),
    st.recursive(
        _comparison(),
        lambda children: st.builds(
            lambda op, conditions: {"operator": op, "conditions": conditions},
            st.sampled_from(["AND", "OR", "NOT"]),
            st.lists(children, min_size=1, max_size=3),
        ),
        max_leaves=6,
    ),
)


def _vectors(n: int, seed: int, dim: int) -> np.ndarray:
    vectors = np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def build_stores(
    documents: list[Document], vectors: np.ndarray, root: Path, fingerprint: str
) -> dict[str, VectorStore]:
    """The same documents in every engine (and a FAISS store copied to Edge), in the space ``fingerprint``."""
    from qdrant_client import QdrantClient

    from care_retriever.stores.copying import copy_store
    from care_retriever.stores.qdrant import QdrantStore

    stores: dict[str, VectorStore] = {
        "faiss": open_store(f"faiss:{root / 'faiss'}"),
        "qdrant:DIR": open_store(f"qdrant:{root / 'edge'}"),
        "qdrant::memory:": open_store("qdrant::memory:"),
        "qdrant-client local": QdrantStore("http://localhost:6333", client=QdrantClient(location=":memory:")),
    }
    for store in stores.values():
        store.prepare(vectors.shape[1], fingerprint, "model")
        store.upsert(documents, vectors)
        store.finalize()
    copy = open_store(f"qdrant:{root / 'copy'}")
    copy_store(stores["faiss"], copy, verify=False)
    stores["faiss -> qdrant:DIR copy"] = copy
    return stores


def check_case(
    stores: dict[str, VectorStore], documents: list[Document], vectors: np.ndarray, filters: Any, query: np.ndarray
) -> list[str]:
    """What each store answers differently from the reference for one (filter, query) case."""
    matching, want_ids, want_scores = reference(documents, vectors, filters, query)
    problems = []
    for name, store in stores.items():
        count = store.count(filters)
        hits = store.search(query[None, :], TOP_K, filters)[0]
        ids, got_scores = [h.id for h in hits], [h.score for h in hits]
        if count != len(matching):
            every = {h.id for h in store.search(query[None, :], len(documents), filters)[0]}
            differ = [d.metadata for i, d in enumerate(documents) if (d.id in every) != (i in matching)]
            problems.append(f"{name}: count {count}, reference {len(matching)} for {filters!r}; differ on {differ}")
        elif ids != want_ids or not np.allclose(got_scores, want_scores, atol=1e-4):
            problems.append(f"{name}: hits {ids}, reference {want_ids} for {filters!r}")
    return problems


def reference(
    documents: list[Document], vectors: np.ndarray, filters: Any, query: np.ndarray
) -> tuple[list[int], list[str], list[float]]:
    """The matching documents' positions, and the top-k ids and scores of an exact search of them."""
    node = parse_filters(filters)
    matching = [i for i, d in enumerate(documents) if matches(node, d.metadata)]
    scores = vectors[matching] @ query
    order = sorted(range(len(matching)), key=lambda j: -scores[j])[:TOP_K]
    return matching, [documents[matching[j]].id for j in order], [float(scores[j]) for j in order]


def check_doors(
    doors: dict[str, Door], documents: list[Document], vectors: np.ndarray, filters: Any, text: str, query: np.ndarray
) -> list[str]:
    """What each of ``doors`` answers differently from the reference for the query ``text`` (its vector:
    ``query``)."""
    _, want_ids, want_scores = reference(documents, vectors, filters, query)
    problems = []
    for name, door in doors.items():
        ranked: Ranked = door(text, filters, TOP_K)
        ids, scores = [i for i, _ in ranked], [s for _, s in ranked]
        if ids != want_ids or not np.allclose(scores, want_scores, atol=1e-4):
            problems.append(f"{name}: hits {ids}, reference {want_ids} for {filters!r}")
    return problems


def corpus_documents(metadata: list[dict[str, Any]], seed: int, dim: int) -> tuple[list[Document], np.ndarray]:
    """Documents with the generated metadata, and their unit vectors."""
    documents = [Document(f"d{i}", f"文本 {i}", metadata=m) for i, m in enumerate(metadata)]
    return documents, _vectors(len(documents), seed, dim)


@contextlib.contextmanager
def opened_stores(
    documents: list[Document], vectors: np.ndarray, embedder: Any, model: Path
) -> Iterator[tuple[dict[str, VectorStore], dict[str, Door]]]:
    """:func:`build_stores` in a temporary folder, in the space of ``embedder`` (saved in ``model``), with each
    store's doors (:func:`benchmarks.filter_doors.opened_doors`); closed (and removed) on exit."""
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Payload indexes have no effect in the local Qdrant")
        stores = build_stores(documents, vectors, Path(tmp), embedder.space_fingerprint)
        try:
            with opened_doors(stores, embedder, model, f"faiss:{Path(tmp) / 'faiss'}") as doors:
                yield stores, doors
        finally:
            for store in stores.values():
                store.close()


def query_vectors(embedder: Any) -> dict[str, np.ndarray]:
    """Each of :data:`QUERIES`, encoded on its own as a door encodes it."""
    return {text: embedder.embed_queries([text])[0] for text in QUERIES}


def run_cases(
    stores: dict[str, VectorStore],
    doors: dict[str, Door],
    texts: dict[str, np.ndarray],
    documents: list[Document],
    vectors: np.ndarray,
    n: int,
) -> tuple[int, list[str]]:
    """Up to ``n`` generated (filter, query) cases on one corpus's stores and doors: how many ran, the disagreements
    found. Each case checks every store, and one door over one store (the next pair each case)."""
    found: list[str] = []
    ran = 0
    names = list(doors)

    @settings(max_examples=n, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(FILTERS, st.integers(0, 2**16), st.sampled_from(QUERIES))
    def one(filters: Any, seed: int, text: str) -> None:
        nonlocal ran
        found.extend(check_case(stores, documents, vectors, filters, _vectors(1, seed, vectors.shape[1])[0]))
        through = names[ran % len(names)]
        found.extend(check_doors({through: doors[through]}, documents, vectors, filters, text, texts[text]))
        ran += 1

    one()
    return ran, found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=10_000, help="(corpus, filter, query) cases to run")
    parser.add_argument("--per-corpus", type=int, default=100, help="(filter, query) cases per generated corpus")
    parser.add_argument("--show", type=int, default=5, help="disagreements to print")
    parser.add_argument("--no-write", action="store_true", help="print the result only (not into docs/filters.md)")
    args = parser.parse_args(argv)
    faiss.omp_set_num_threads(1)  # a search of a few vectors: OpenMP's thread start-up would be all of its cost
    found: list[str] = []
    cases = 0
    start = time.perf_counter()
    load = "/".join(f"{x:.1f}" for x in os.getloadavg())
    with tempfile.TemporaryDirectory() as tmp:
        embedder = tiny_model(Path(tmp) / "tiny")
        texts = query_vectors(embedder)
        for corpus in range(max(1, args.cases // args.per_corpus)):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", NonInteractiveExampleWarning)
                metadata = CORPORA.example()
            documents, vectors = corpus_documents(metadata, corpus, embedder.dim)
            with opened_stores(documents, vectors, embedder, Path(tmp) / "tiny") as (stores, doors):
                ran, problems = run_cases(stores, doors, texts, documents, vectors, args.per_corpus)
            cases += ran
            found += problems
    for line in found[: args.show]:
        print(line)
    seconds = time.perf_counter() - start
    summary = f"{cases:,} cases, {len(found)} disagreements, {seconds:.0f} s"
    print(summary)
    if not args.no_write:
        from benchmarks.core_common import machine_line

        write_marked(
            DOCS,
            "filter_agreement",
            f"`python -m benchmarks.filter_agreement --cases {args.cases}`: {summary} ({machine_line()}; load "
            f"average {load} at the start).",
            add=True,
        )
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
