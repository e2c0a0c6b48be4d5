"""The BM25 side of a FAISS store (postings in its docstore, care_retriever.sparse.sqlite_bm25) and the
hybrid fusion of dense and BM25 rankings on row ids, run in this process."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

import numpy as np
from tqdm.auto import tqdm

from care_retriever.documents import Document
from care_retriever.errors import InputError, StoreError
from care_retriever.sparse.fusion import FusionConfig, fuse
from care_retriever.sparse.sqlite_bm25 import SqliteBM25
from care_retriever.stores.base import Hit
from care_retriever.stores.faiss import docstore

Ranking = list[tuple[int, float]]  # (row id, score), best first


def check_search(store: str, writing: bool, top_k: int) -> None:
    if writing:
        raise StoreError(f"{store}: sparse search on a store being written; finalize() first")
    if top_k < 1:
        raise InputError(f"top_k must be >= 1, got {top_k}")


def add(
    db: sqlite3.Connection, rows: Sequence[int], documents: Sequence[Document], tokens: Sequence[list[str]] | None
) -> None:
    """Postings of ``documents`` under ``rows`` in ``db``'s open transaction (``tokens``: already tokenized)."""
    SqliteBM25(db).add(list(rows), [d.embedding_text() for d in documents], tokens)


def remove(db: sqlite3.Connection, rows: Sequence[int]) -> None:
    SqliteBM25(db).remove(list(rows))


def build(db: sqlite3.Connection, *, show_progress: bool = False) -> int:
    """(Re)build the BM25 postings from the stored texts in ``db``'s open transaction; returns the number of
    documents tokenized. Nothing is committed: the caller's commit publishes the postings."""
    from care_retriever.sparse.tokenizer import tokenize

    bm25 = SqliteBM25(db)
    bm25.clear()  # a killed earlier build (or another tokenizer's) may have committed postings
    done, last = 0, -1
    total = docstore.count(db)
    with tqdm(total=total, desc="Sparse index", unit="doc", disable=not show_progress or not total) as bar:
        while rows := db.execute(
            "SELECT row_id, text, title FROM documents WHERE row_id > ? ORDER BY row_id LIMIT 2000", (last,)
        ).fetchall():
            texts = [Document(id="", text=text, title=title).embedding_text() for _, text, title in rows]
            bm25.add([r for r, _, _ in rows], texts, tokenize(texts))
            done += len(rows)
            last = rows[-1][0]
            bar.update(len(rows))
    return done


def query_tokens(queries: Sequence[str]) -> list[list[str]]:
    from care_retriever.sparse.tokenizer import tokenize

    return tokenize(list(queries))


class Scorer:
    """The query side of the BM25 index, kept across searches: one per connection (it keeps the postings
    in memory)."""

    def __init__(self) -> None:
        self._bm25: SqliteBM25 | None = None

    def ranked(
        self, db: sqlite3.Connection, tokens: Sequence[list[str]], top_k: int, allowed: np.ndarray | None
    ) -> list[Ranking]:
        """Each query's BM25 top-``k`` (row id, score), best first, ties by row id; ``allowed``: row ids."""
        if self._bm25 is None or self._bm25.db is not db:
            self._bm25 = SqliteBM25(db)
        return [self._bm25.top(toks, top_k, allowed) for toks in tokens]


def with_ties(ranked: Ranking, k: int) -> Ranking:
    """The first ``k`` of a ranking and every later entry tied with the ``k``-th."""
    end = min(k, len(ranked))
    while 0 < end < len(ranked) and ranked[end][1] == ranked[k - 1][1]:
        end += 1
    return ranked[:end]


def fused_cuts(dense: Sequence[Ranking], sparse: Sequence[Ranking], fusion: FusionConfig, top_k: int) -> list[Ranking]:
    """Each query's fused ranking cut at ``top_k`` with its ties (a query with no BM25 hit: its dense one)."""
    fused = [fuse(d, s, fusion) if s else d for d, s in zip(dense, sparse, strict=True)]
    return [with_ties(row, top_k) for row in fused]


def hybrid_hits(cuts: Sequence[Ranking], docs: dict[int, Document], top_k: int) -> list[list[Hit]]:
    """Hits of the fused cuts; ties at the cut are broken by document id, as fuse() breaks them on ids for
    other stores."""
    return [sorted(docstore.hits(row, docs, len(row)), key=lambda h: (-h.score, h.id))[:top_k] for row in cuts]
