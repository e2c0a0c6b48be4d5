"""Retrieval scores for the quickstart and the miniature reports: nDCG@10 (pytrec_eval) and BM25.

Kept small on purpose: ``care_retriever.evaluation`` is the full evaluation suite; this module
only scores a run against qrels with trec_eval's ``ndcg_cut.10`` (graded gain) and builds the BM25
baseline the paper and ``shared/data/README.md`` compare against (bm25s over jieba search-mode
tokens, Lucene BM25 with k1=1.5, b=0.75).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import numpy as np

Run = dict[str, dict[str, float]]
Qrels = Mapping[str, Mapping[str, int]]


def ndcg_at_10(run: Mapping[str, Mapping[str, float]], qrels: Qrels) -> float:
    """Mean nDCG@10 over the queries of ``qrels`` (a query missing from ``run`` scores 0)."""
    import pytrec_eval

    judged = {q: {d: int(s) for d, s in docs.items()} for q, docs in qrels.items()}
    full_run = {q: {d: float(s) for d, s in run.get(q, {}).items()} for q in judged}
    evaluator = pytrec_eval.RelevanceEvaluator(judged, {"ndcg_cut.10"})
    scores = evaluator.evaluate(full_run)
    return float(np.mean([scores.get(q, {}).get("ndcg_cut_10", 0.0) for q in judged])) if judged else 0.0


def dense_run(
    query_vectors: np.ndarray, doc_vectors: np.ndarray, query_ids: Sequence[str], doc_ids: Sequence[str], k: int = 100
) -> Run:
    """Exact inner-product top-``k`` (FAISS flat index) as a run ``{qid: {did: score}}``."""
    import faiss

    index = faiss.IndexFlatIP(doc_vectors.shape[1])
    index.add(np.ascontiguousarray(doc_vectors, dtype=np.float32))
    scores, ids = index.search(np.ascontiguousarray(query_vectors, dtype=np.float32), min(k, len(doc_ids)))
    return {
        qid: {doc_ids[j]: float(s) for s, j in zip(row_s, row_i, strict=True) if j >= 0}
        for qid, row_s, row_i in zip(query_ids, scores, ids, strict=True)
    }


def tokenize(texts: Sequence[str]) -> list[list[str]]:
    import jieba

    jieba.setLogLevel(logging.WARNING)
    return [jieba.lcut_for_search(t) for t in texts]


def bm25_run(
    doc_texts: Sequence[str], doc_ids: Sequence[str], queries: Sequence[str], query_ids: Sequence[str], k: int = 100
) -> Run:
    """BM25 (bm25s, jieba tokens) top-``k`` run."""
    import bm25s

    logging.getLogger("bm25s").setLevel(logging.WARNING)
    retriever = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
    retriever.index(tokenize(doc_texts), show_progress=False)
    results, scores = retriever.retrieve(tokenize(queries), k=min(k, len(doc_ids)), show_progress=False)
    return {
        qid: {doc_ids[int(j)]: float(s) for j, s in zip(row_i, row_s, strict=True) if s > 0}
        for qid, row_i, row_s in zip(query_ids, results, scores, strict=True)
    }
