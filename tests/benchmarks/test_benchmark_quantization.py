"""The quantization benchmark's dev-task part with a saved model (``--model``): each setting is scored against
the exact ranking of the model's own vectors, rows are merged per model, and the random tower's rows stay.

Runs the real script (``benchmarks.quantization.main``) on the shipped 300-passage sample laid out as a task.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from benchmarks import quantization

SAMPLE = Path(__file__).resolve().parents[2] / "care_retriever" / "data" / "sample"


@pytest.fixture()
def task_root(tmp_path: Path) -> Path:
    if not (SAMPLE / "corpus.jsonl").is_file():
        pytest.skip(f"shipped sample missing at {SAMPLE}")
    task = tmp_path / "tasks" / "sample"
    (task / "qrels").mkdir(parents=True)
    shutil.copy(SAMPLE / "corpus.jsonl", task / "corpus.jsonl")
    shutil.copy(SAMPLE / "queries.jsonl", task / "queries.jsonl")
    shutil.copy(SAMPLE / "qrels.tsv", task / "qrels" / "test.tsv")
    return tmp_path / "tasks"


def _run(tmp_path: Path, task_root: Path, model: Path, settings: str, sweep: str) -> dict:
    argv = ["--skip-synthetic", "--model", str(model), "--data-root", str(task_root), "--tasks", "sample"]
    argv += ["--settings", settings, "--oversample-sweep", sweep, "--cache", str(tmp_path / "cache")]
    argv += ["--json", str(tmp_path / "q.json"), "--docs", str(tmp_path / "scale.md")]
    assert quantization.main(argv) == 0
    return json.loads((tmp_path / "q.json").read_text())


def _exact_ndcg(model: Path, task: Path) -> float:
    """nDCG@10 of exact inner-product search, computed here without the store."""
    from care_retriever.model.embedder import AsymmetricEmbedder

    docs, queries, qrels = quantization.read_task(task)
    embedder = AsymmetricEmbedder.from_pretrained(model, dtype="fp32")
    d = embedder.embed_documents([doc.embedding_text() for doc in docs])
    q = embedder.embed_queries(list(queries.values()))
    scores = []
    for qid, row in zip(queries, q @ d.T, strict=True):
        ranked = [docs[i].id for i in np.argsort(-row, kind="stable")[:10]]
        dcg = sum(qrels[qid].get(doc, 0) / math.log2(i + 2) for i, doc in enumerate(ranked))
        ideal = sum(r / math.log2(i + 2) for i, r in enumerate(sorted(qrels[qid].values(), reverse=True)[:10]))
        scores.append(dcg / ideal)
    return float(np.mean(scores))


def test_model_rows_against_exact_and_merged_per_model(tmp_path: Path, task_root: Path, tiny_model_dir: Path) -> None:
    (tmp_path / "scale.md").write_text("# Scale\n\nprose kept\n", encoding="utf-8")
    random_tower = {"model": "random base", "dim": 768, "measured": "then", "command": "older run", "tasks": {}}
    none = {"setting": "none", "ndcg_at_10": 0.0, "overlap_at_10_with_exact": 1.0, "oversample": None}
    random_tower["tasks"]["sample"] = {"documents": 300, "queries": 1, "rows": [none]}
    (tmp_path / "q.json").write_text(json.dumps({"dev": random_tower}))

    result = _run(tmp_path, task_root, tiny_model_dir, "none,sq8,binary", "1,1000")
    assert result["dev"] == random_tower  # a --model run leaves the random tower's rows alone
    (entry,) = result["dev_models"]
    assert entry["model"] == str(tiny_model_dir) and entry["dim"] == 32
    rows = {r["setting"]: r for r in entry["tasks"]["sample"]["rows"]}
    assert list(rows) == ["none", "sq8", "binary"]
    assert rows["none"]["overlap_at_10_with_exact"] == pytest.approx(1.0)
    assert rows["none"]["ndcg_at_10"] == pytest.approx(_exact_ndcg(tiny_model_dir, task_root / "sample"), abs=1e-6)
    assert rows["binary"]["oversample"] == 100.0  # the store's default
    # Oversample 1000 rescores every document: exact again. At 1, 32-bit codes alone rank most of the top 10
    # wrong: the overlap is a measurement, not a constant.
    assert rows["binary"]["oversample_sweep"]["1000"]["overlap_at_10_with_exact"] == pytest.approx(1.0)
    assert rows["binary"]["oversample_sweep"]["1"]["overlap_at_10_with_exact"] < 0.9
    text = (tmp_path / "scale.md").read_text(encoding="utf-8")
    assert "prose kept" in text and f"`{tiny_model_dir}`" in text and "random base" in text

    # Re-running one setting replaces its row and keeps the others, each with the command that measured it.
    again = _run(tmp_path, task_root, tiny_model_dir, "binary", "1")
    rows2 = {r["setting"]: r for r in again["dev_models"][0]["tasks"]["sample"]["rows"]}
    assert list(rows2) == ["none", "sq8", "binary"]
    assert rows2["sq8"] == rows["sq8"]
    assert list(rows2["binary"]["oversample_sweep"]) == ["1"]
    assert len(again["dev_models"][0]["commands"]) == 2


def test_model_must_be_a_saved_care_folder(tmp_path: Path, task_root: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        quantization.main(["--skip-synthetic", "--model", str(tmp_path), "--data-root", str(task_root)])
    assert exc.value.code == 2
