"""The BM25 baseline: bm25s over jieba tokens.

Tokenisation is ``jieba.lcut_for_search`` (search-engine mode: a long word also yields its shorter
in-vocabulary parts, so 高血压 matches 血压), every token kept as jieba returns it (no stop words,
no punctuation filter), with bm25s's defaults (Lucene variant, k1=1.5, b=0.75). This is the
variant that reproduces the reference figures of ``shared/data/README.md``: kuake-qtr-retrieval
nDCG@10 0.546 and im-qa-retrieval nDCG@10 0.189 / Recall@100 0.515. Plain ``jieba.lcut`` gives
0.542 / 0.163, and dropping punctuation tokens gives 0.546 / 0.204.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
from tqdm.auto import tqdm

NAME = "bm25"


def _jieba():
    import jieba

    jieba.setLogLevel(logging.WARNING)
    jieba.initialize()
    return jieba


def tokenize(
    texts: Sequence[str], *, show_progress: bool = False, desc: str = "Tokenizing"
) -> list[list[str]]:
    """jieba search-mode tokens of each text (an empty text gives no tokens)."""
    jieba = _jieba()
    return [jieba.lcut_for_search(t) for t in tqdm(texts, desc=desc, unit="text", disable=not show_progress)]


class BM25Model:
    """A lexical baseline with the evaluation runner's vocabulary: index documents, score queries."""

    name = NAME
    kind = "lexical"

    def __init__(self, k1: float = 1.5, b: float = 0.75, method: str = "lucene") -> None:
        self.k1, self.b, self.method = k1, b, method
        self._index = None
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
