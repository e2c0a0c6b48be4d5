"""Scores from maintained libraries: pytrec_eval (trec_eval) for ranking, scipy for correlations.

Nothing here re-implements a metric. The definitions follow MTEB v2, which also calls pytrec_eval:
``MAP@k`` is trec_eval's ``map_cut.k`` (average precision of the top ``k``, divided by the number of
relevant documents), ``nDCG@k`` is ``ndcg_cut.k`` with the graded judgement as gain, and ``Recall@k``
is ``recall.k``. ``MRR@10`` is trec_eval's ``recip_rank`` on the run cut to its top 10, ordered the
way trec_eval orders it (score descending, then document id descending), so a document outside the
top 10 scores 0 as MTEB's ``mrr_at_10`` does.

Binary metrics count a judgement as relevant from ``relevance_level`` on (trec_eval ``-l``); nDCG
uses the graded score regardless.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pytrec_eval
from scipy import stats

Run = Mapping[str, Mapping[str, float]]
Qrels = Mapping[str, Mapping[str, int]]

RETRIEVAL_MAIN = "ndcg@10"
RERANK_MAIN = "map@10"
STS_MAIN = "pearson"

# Our metric name -> the pytrec_eval measure (and its result key).
RETRIEVAL_MEASURES: dict[str, tuple[str, str]] = {
    "ndcg@10": ("ndcg_cut.10", "ndcg_cut_10"),
    "recall@10": ("recall.10", "recall_10"),
    "recall@100": ("recall.100", "recall_100"),
    "map@100": ("map_cut.100", "map_cut_100"),
}
RERANK_MEASURES: dict[str, tuple[str, str]] = {
    "map@10": ("map_cut.10", "map_cut_10"),
}


def trec_order(scores: Mapping[str, float]) -> list[tuple[str, float]]:
    """Documents in the order trec_eval ranks them: score descending, ties by document id descending."""
    return sorted(scores.items(), key=lambda item: (item[1], item[0]), reverse=True)


def cut_run(run: Run, k: int) -> dict[str, dict[str, float]]:
    """The top ``k`` of each ranking, in trec_eval's order."""
    return {qid: dict(trec_order(docs)[:k]) for qid, docs in run.items()}


def _evaluate(qrels: Qrels, run: Run, measures: set[str], relevance_level: int) -> dict[str, dict[str, float]]:
    evaluator = pytrec_eval.RelevanceEvaluator(
        {q: dict(d) for q, d in qrels.items()}, measures, relevance_level=relevance_level
    )
    return evaluator.evaluate({q: {d: float(s) for d, s in docs.items()} for q, docs in run.items()})


def _mean(per_query: dict[str, dict[str, float]], key: str, query_ids: Sequence[str]) -> float:
    # A judged query missing from the run (no hits at all) counts as 0, as trec_eval -c would.
    return float(np.mean([per_query.get(q, {}).get(key, 0.0) for q in query_ids])) if query_ids else 0.0


def ranking_metrics(
    qrels: Qrels,
    run: Run,
    measures: Mapping[str, tuple[str, str]],
    *,
    relevance_level: int = 1,
    mrr_k: int = 10,
) -> dict[str, float]:
    """Mean of each measure over the judged queries, plus ``mrr@{mrr_k}``."""
    query_ids = list(qrels)
    per_query = _evaluate(qrels, run, {m for m, _ in measures.values()}, relevance_level)
    out = {name: _mean(per_query, key, query_ids) for name, (_, key) in measures.items()}
    rr = _evaluate(qrels, cut_run(run, mrr_k), {"recip_rank"}, relevance_level)
    out[f"mrr@{mrr_k}"] = _mean(rr, "recip_rank", query_ids)
    return out


def retrieval_metrics(qrels: Qrels, run: Run, *, relevance_level: int = 1) -> dict[str, float]:
    """nDCG@10 (main), Recall@10/100, MRR@10 and MAP@100 of a retrieval run."""
    return ranking_metrics(qrels, run, RETRIEVAL_MEASURES, relevance_level=relevance_level)


def rerank_metrics(qrels: Qrels, run: Run) -> dict[str, float]:
    """MAP@10 (main, MTEB's ``map_at_10``) and MRR@10 of a rerank run (positives 1, negatives 0)."""
    return ranking_metrics(qrels, run, RERANK_MEASURES, relevance_level=1)


def sts_metrics(predicted: Sequence[float] | np.ndarray, gold: Sequence[float]) -> dict[str, float]:
    """Pearson (main, as the paper) and Spearman correlation of cosine similarity with the gold score."""
    pred = np.asarray(predicted, dtype=np.float64)
    ref = np.asarray(gold, dtype=np.float64)
    if np.ptp(pred) == 0:
        # A model that gives every pair the same similarity has no correlation with anything.
        return {"pearson": 0.0, "spearman": 0.0}
    return {
        "pearson": float(stats.pearsonr(pred, ref).statistic),
        "spearman": float(stats.spearmanr(pred, ref).statistic),
    }
