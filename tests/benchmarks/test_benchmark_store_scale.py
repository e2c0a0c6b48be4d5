"""The store scale benchmark's cell, run for every store kind on a tiny synthetic set: the figures it reports are
there, exact search finds exactly the exact neighbours, and a cell stopped by its budget says how far it got."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("faiss")
pytest.importorskip("qdrant_edge")
pytest.importorskip("qdrant_client")

from benchmarks.store_scale import dataset_ids, recall_against, row, run_cell_process, synthetic_dataset
from benchmarks.store_scale_cell import KINDS, run_cell

N, DIM, QUERIES, K = 400, 32, 20, 10


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthetic_dataset(tmp_path_factory.mktemp("scale"), N, DIM, QUERIES, K)


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_cell_reports_its_figures_and_recall_against_exact_search(kind: str, dataset: Path, tmp_path: Path) -> None:
    result = run_cell(kind, dataset, tmp_path / "store", k=K, threads=(1, 8), min_search_s=0.0, max_search_s=10.0)
    assert (result["kind"], result["n"], result["dim"]) == (kind, N, DIM)
    assert 0 < result["upsert_s"] <= result["build_s"]
    assert result["disk_bytes"] > N * DIM  # at least the rows' bytes in some form (sq8 keeps the originals too)
    assert result["peak_rss_bytes"] > 0 and result["rss_serving_bytes"] > 0
    for threads in (1, 8):
        search = result[f"search_{threads}"]
        assert search["answered"] >= QUERIES and search["qps"] > 0
    found = result.pop("found")
    assert all(len(hits) == K for hits in found)
    recall, answered = recall_against(found, np.load(dataset / "truth.npy"), dataset_ids(dataset), K)
    assert answered == QUERIES
    if kind == "faiss-flat":  # exact search against the exact reference: a broken reference or recall shows here
        assert recall == 1.0
    assert 0.5 <= recall <= 1.0
    assert row({**result, "recall": recall, "recall_queries": answered, "dataset": "tiny"}).count("|") == 12


def test_recall_counts_only_the_queries_answered() -> None:
    truth = np.array([[0, 1], [2, 3]])
    ids = ["a", "b", "c", "d"]
    assert recall_against([["a", "x"], None], truth, ids, 2) == (0.5, 1)
    assert math.isnan(recall_against([None, None], truth, ids, 2)[0])


def test_a_cell_past_its_budget_is_recorded_as_stopped(dataset: Path, tmp_path: Path) -> None:
    args = argparse.Namespace(k=K, min_search_s=0.0, max_search_s=1.0, cell_budget=0.01)
    result = run_cell_process(dataset, "faiss-flat", tmp_path, args)
    assert result["stopped"] == "stopped by the 0 s budget"
    assert result["points"] == 0 and result["stopped_after_s"] > 0
    assert not (tmp_path / "stores" / f"{dataset.name}--faiss-flat").exists()
    assert "stopped by the 0 s budget after" in row(result)
