"""The BM25 baseline: bm25s over the sparse side's tokens (:mod:`care_retriever.sparse.tokenizer`).

Tokens are jieba search-mode tokens (a long word also yields its shorter in-vocabulary parts, so
高血压 matches 血压), NFKC-folded, lower-cased, punctuation and Chinese function words dropped: the
same tokens a store's BM25 side holds, so ``eval --model bm25`` and ``search --mode sparse`` agree.
bm25s's defaults (Lucene variant, k1=1.5, b=0.75). On the dev tasks this gives kuake-qtr-retrieval
nDCG@10 0.550 and im-qa-retrieval 0.217; the data README's reference figures (0.546 / 0.189) are
those of raw ``jieba.lcut_for_search`` tokens with every token kept (docs/hybrid.md).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from care_retriever.sparse.tokenizer import tokenize

NAME = "bm25"

__all__ = ["NAME", "BM25Model", "tokenize"]


class BM25Model:
    """A lexical baseline with the evaluation runner's vocabulary: index documents, score queries."""

    name = NAME
    kind = "lexical"

    def __init__(self, k1: float = 1.5, b: float = 0.75, method: str = "lucene") -> None:
        self.k1, self.b, self.method = k1, b, method
        self._index: Any = None  # a bm25s.BM25 (bm25s ships no type information)
        self.size = 0

    def index(self, texts: Sequence[str], *, show_progress: bool = False) -> None:
        import bm25s

        logging.getLogger("bm25s").setLevel(logging.WARNING)  # it sets itself to DEBUG on import
        tokens = tokenize(texts, show_progress=show_progress, desc="Tokenizing documents")
        self._index = bm25s.BM25(k1=self.k1, b=self.b, method=self.method)
        self._index.index(tokens, show_progress=False)
        self.size = len(texts)

    def _require(self):
        if self._index is None:
            raise RuntimeError("BM25Model.index() must be called before searching")
        return self._index

    def search(
        self, queries: Sequence[str], top_k: int, *, show_progress: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(indices, scores)``, each ``(len(queries), min(top_k, size))``, best first."""
        index = self._require()
        tokens = tokenize(queries, desc="Tokenizing queries")
        k = min(top_k, self.size)
        docs, scores = index.retrieve(tokens, k=k, show_progress=show_progress, n_threads=1)
        return np.asarray(docs), np.asarray(scores, dtype=np.float32)

    def score(self, query: str, doc_indices: Sequence[int]) -> np.ndarray:
        """BM25 score of ``query`` against the indexed documents ``doc_indices``."""
        index = self._require()
        (tokens,) = tokenize([query])
        vocab = index.vocab_dict
        known = [t for t in tokens if t in vocab]
        if not known:
            return np.zeros(len(doc_indices), dtype=np.float32)
        return np.asarray(index.get_scores(known), dtype=np.float32)[list(doc_indices)]

    def __repr__(self) -> str:
        return f"BM25Model(jieba.lcut_for_search, bm25s {self.method}, k1={self.k1}, b={self.b})"
