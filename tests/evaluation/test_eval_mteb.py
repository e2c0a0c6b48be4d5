"""The mteb adapter: our embedders scored by mteb itself on its offline mock tasks; hub tasks skip offline."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from care_retriever.evaluation.mteb_adapter import run_mteb_tasks, skip_reason


def test_hub_tasks_are_skipped_with_a_reason_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    reason = skip_reason()
    assert reason is not None
    (result,) = run_mteb_tasks(object(), ["CmedqaRetrieval"], model_name="m")
    assert result.main_score is None and result.skipped == reason


def test_mock_tasks_run_through_mteb_with_the_care_encoder(tiny_model_dir: Path) -> None:
    importlib.import_module("mteb")
    from mteb.mocks.mock_tasks.reranking import MockRerankingTask
    from mteb.mocks.mock_tasks.retrieval import MockRetrievalTask

    from care_retriever.model.baselines import load_embedder

    embedder = load_embedder(str(tiny_model_dir))
    results = run_mteb_tasks(
        embedder,
        ["mock-retrieval", "mock-rerank"],
        model_name="tiny",
        tasks=[MockRetrievalTask(), MockRerankingTask()],
    )
    assert [r.type for r in results] == ["retrieval", "rerank"]
    for r in results:
        assert r.skipped is None, r.skipped
        assert 0 <= r.main_score <= 1
        assert "ndcg_at_10" in r.metrics and "map_at_10" in r.metrics
