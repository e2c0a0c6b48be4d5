"""Our metric numbers (pytrec_eval) against a second library (ranx) and against mteb's definitions."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest
import ranx

from care_retriever.evaluation.metrics import rerank_metrics, retrieval_metrics, sts_metrics


def synthetic(seed: int = 0, n_queries: int = 60) -> tuple[dict, dict]:
    """Graded judgements (0..3) and a run with distinct scores (ranx and trec_eval break ties differently)."""
    rng = np.random.default_rng(seed)
    qrels, run = {}, {}
    for q in range(n_queries):
        docs = [f"d{i}" for i in rng.choice(400, 150, replace=False)]
        run[f"q{q}"] = {d: float(s) for d, s in zip(docs, rng.permutation(150) / 150 + q, strict=True)}
        judged = rng.choice(400, 10, replace=False)
        qrels[f"q{q}"] = {f"d{i}": int(rng.integers(0, 4)) for i in judged}
    return qrels, run


def ranx_scores(qrels: dict, run: dict, level: int) -> dict[str, float]:
    names = {
        "ndcg@10": "ndcg@10",
        "recall@10": f"recall@10-l{level}",
        "recall@100": f"recall@100-l{level}",
        "map@100": f"map@100-l{level}",
        "mrr@10": f"mrr@10-l{level}",
    }
    scores = ranx.evaluate(ranx.Qrels(qrels), ranx.Run(run), list(names.values()), make_comparable=True)
    return {ours: float(scores[theirs]) for ours, theirs in names.items()}


@pytest.mark.slow
@pytest.mark.parametrize("level", [1, 2])
def test_retrieval_metrics_match_ranx(level: int) -> None:
    qrels, run = synthetic()
    ours = retrieval_metrics(qrels, run, relevance_level=level)
    theirs = ranx_scores(qrels, run, level)
    assert set(ours) == set(theirs)
    for name, value in theirs.items():
        assert ours[name] == pytest.approx(value, abs=1e-9), name
    assert 0 < ours["recall@100"] < 1  # a run that is neither empty nor perfect: the check means something


@pytest.mark.slow
def test_saved_bm25_run_rescored_by_ranx_matches(shared_data: Path, tmp_path: Path) -> None:
    """The same cross-check on a real run: BM25 on kuake-qtr (graded, relevance level 2), re-read from
    the TREC file ``--save-run`` writes."""
    from care_retriever.evaluation.runner import evaluate
    from care_retriever.evaluation.tasks import load_task
    from care_retriever.sparse.bm25 import BM25Model

    task = load_task(shared_data / "tasks" / "kuake-qtr-retrieval")
    result = evaluate(BM25Model(), task, model_name="bm25", save_run=tmp_path / "bm25.trec")
    run: dict[str, dict[str, float]] = {}
    for line in (tmp_path / "bm25.trec").read_text().splitlines():
        qid, _, doc, rank, _score, tag = line.split()
        assert tag == "bm25"
        # Ranks as scores: BM25 has tied scores, which ranx would order differently from trec_eval.
        run.setdefault(qid, {})[doc] = -float(rank)
    theirs = ranx_scores(task.qrels, run, task.relevance_level)
    for name, value in theirs.items():
        assert result.metrics[name] == pytest.approx(value, abs=1e-6), name


def test_mrr_at_10_ignores_hits_below_rank_10() -> None:
    qrels = {"q": {"rel": 1}}
    run = {"q": {**{f"n{i}": 1.0 - i / 100 for i in range(10)}, "rel": 0.5}}
    assert retrieval_metrics(qrels, run)["mrr@10"] == 0.0
    run["q"]["rel"] = 0.995  # rank 2
    assert retrieval_metrics(qrels, run)["mrr@10"] == pytest.approx(0.5)


def test_rerank_map_at_10_is_mtebs_map_at_10() -> None:
    """MTEB v2 scores rerank tasks with pytrec_eval ``map_cut``; check against its own code when installed."""
    mteb_metrics = importlib.import_module("mteb._evaluators.retrieval_metrics")
    rng = np.random.default_rng(1)
    qrels, run = {}, {}
    for q in range(30):
        n_pos, n_neg = int(rng.integers(1, 4)), int(rng.integers(3, 15))
        ids = [f"c{j:03d}" for j in range(n_pos + n_neg)]
        qrels[f"q{q}"] = {d: int(j < n_pos) for j, d in enumerate(ids)}
        run[f"q{q}"] = {d: float(s) for d, s in zip(ids, rng.random(len(ids)), strict=True)}
    ours = rerank_metrics(qrels, run)
    theirs = mteb_metrics.calculate_retrieval_scores(run, qrels, [1, 3, 5, 10, 100, 1000])
    assert ours["map@10"] == pytest.approx(theirs.map["MAP@10"], abs=1e-5)
    assert ours["mrr@10"] == pytest.approx(theirs.mrr["MRR@10"], abs=1e-5)


def test_sts_metrics_are_scipy_correlations() -> None:
    from scipy import stats

    pred = [0.1, 0.4, 0.35, 0.8, 0.9]
    gold = [0, 1, 0, 1, 1]
    out = sts_metrics(pred, gold)
    assert out["pearson"] == pytest.approx(stats.pearsonr(pred, gold).statistic)
    assert out["spearman"] == pytest.approx(stats.spearmanr(pred, gold).statistic)
    assert sts_metrics([0.5] * 5, gold) == {"pearson": 0.0, "spearman": 0.0}
