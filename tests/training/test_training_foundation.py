"""The miniature foundation recipe: it parses, gives the document tower the head start, dry-runs on the
shared data in seconds, and its texts never equal an evaluation task's query or document."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from care_retriever.cli.main import main


def test_foundation_recipe_pretrains_both_towers_on_the_pretraining_corpus() -> None:
    from care_retriever.training.recipe import load_recipe

    recipe = load_recipe("miniature-foundation")
    assert [(s.type, s.name) for s in recipe.stages] == [("mlm", "mlm-query"), ("clm", "clm-document")]
    pretrain = [name for name, spec in recipe.datasets.items() if spec.path == "pretrain/cblue-medical-texts.jsonl"]
    assert pretrain and all(set(pretrain) <= set(s.datasets) for s in recipe.stages)
    # The document tower sees the same texts for more epochs (its larger size does the rest).
    epochs = {s.type: s.args["num_train_epochs"] for s in recipe.stages}
    assert epochs["clm"] >= 4 * epochs["mlm"]


@pytest.mark.slow
@pytest.mark.shared_data
def test_foundation_recipe_dry_run_on_shared_data(shared_data: Path, tmp_path: Path, capsys) -> None:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = tmp_path / "foundation"
        args = ["train", "--recipe", "miniature-foundation", "--out", str(out), "--data-dir", str(shared_data)]
        code = main([*args, "--preset", "tiny", "--dry-run-steps", "1", "--no-progress"])
        captured = capsys.readouterr()
    finally:
        torch.set_num_threads(threads)
    assert code == 0, captured.err
    state = json.loads((out / "run.json").read_text())
    assert state["done"] == ["init", "mlm-query", "clm-document"]
    assert [r["tower"] for r in state["reports"]] == ["query", "document"]
    assert "pretraining compute, document / query tower:" in captured.out
    # what the miniature recipes start from
    assert (out / "final" / "care_config.json").is_file()


# ------------------------------------------------------------------ no evaluation text in training
def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _rows(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def task_texts(tasks: Path) -> set[str]:
    """Every query and document of every evaluation task (whitespace removed)."""
    texts: set[str] = set()
    for task in sorted(p for p in tasks.iterdir() if p.is_dir()):
        for name in ("corpus.jsonl", "queries.jsonl", "test.jsonl"):
            path = task / name
            if not path.is_file():
                continue
            for row in _rows(path):
                for key in ("title", "text", "query", "sentence1", "sentence2", "positive", "negative"):
                    value = row.get(key)
                    for item in value if isinstance(value, list) else [value]:
                        if isinstance(item, str) and _squash(item):
                            texts.add(_squash(item))
    return texts


def recipe_texts(shared: Path, *, pretraining: bool) -> dict[str, set[str]]:
    """What the foundation recipe trains on, read by the training code itself, per data set."""
    from care_retriever.training.pairs import load_pairset, read_texts, resolve_data_path
    from care_retriever.training.recipe import load_recipe

    found: dict[str, set[str]] = {}
    for name, spec in load_recipe("miniature-foundation").datasets.items():
        if (spec.format == "text") != pretraining:
            continue
        if spec.format == "text":
            texts = read_texts(resolve_data_path(spec.path, shared))
        else:
            pairs = load_pairset(spec, shared)
            texts = pairs.queries() + pairs.documents()
        found[name] = {_squash(t) for t in texts}
    return found


@pytest.fixture(scope="module")
def evaluation_texts(shared_data: Path) -> set[str]:
    if not (shared_data / "tasks").is_dir():
        pytest.skip(f"no evaluation tasks under {shared_data}")
    return task_texts(shared_data / "tasks")


@pytest.mark.shared_data
def test_no_pretraining_text_equals_a_task_query_or_document(shared_data: Path, evaluation_texts: set[str]) -> None:
    found = recipe_texts(shared_data, pretraining=True)
    assert found and sum(map(len, found.values())) > 10_000
    leaked = {name: sorted(texts & evaluation_texts)[:3] for name, texts in found.items() if texts & evaluation_texts}
    assert not leaked, leaked


@pytest.mark.shared_data
@pytest.mark.parametrize("recipe_name", ["miniature-foundation", "miniature", "miniature-ablations"])
def test_no_training_query_equals_a_task_query(shared_data: Path, recipe_name: str) -> None:
    """The shared training files repeat dev queries (2,498 KUAKE-QTR queries, 3,856 CHIP-STS sentences,
    measured 2026-11-23): the recipes drop those examples (``exclude_task_queries``) as they load them.
    Documents are not compared: a retrieval corpus holds its training documents (every KUAKE-QTR training
    title is in the task's corpus), as BEIR's and MS MARCO's do."""
    from care_retriever.training.pairs import squash, task_queries
    from care_retriever.training.recipe import load_recipe
    from care_retriever.training.runner import preload_datasets, used_datasets

    recipe = load_recipe(recipe_name)
    evaluated = task_queries(shared_data / "tasks")
    assert len(evaluated) > 4_000
    load = preload_datasets(recipe, shared_data)
    queries = {name: {squash(q) for q in load(name).queries()} for name in used_datasets(recipe)}
    assert queries and all(queries.values())
    leaked = {name: len(texts & evaluated) for name, texts in queries.items() if texts & evaluated}
    assert not leaked, leaked


def test_exclude_task_queries_drops_pairs_whose_query_is_evaluated(tmp_path: Path) -> None:
    from care_retriever.training.pairs import Example, PairSet, task_queries, without_queries

    task = tmp_path / "tasks" / "sts"
    task.mkdir(parents=True)
    (task / "test.jsonl").write_text(json.dumps({"sentence1": "头痛 怎么办", "sentence2": "发烧", "score": 1}) + "\n")
    evaluated = task_queries(tmp_path / "tasks")
    pairs = PairSet("p", [Example("头痛怎么办", "止痛药"), Example("咳嗽", "发烧"), Example("咳嗽", "止咳")])
    kept, dropped = without_queries(pairs, evaluated)
    assert [e.query for e in kept.examples] == ["咳嗽", "咳嗽"] and dropped == 1  # documents stay
    symmetric, dropped = without_queries(PairSet("s", pairs.examples, symmetric=True), evaluated)
    assert [(e.query, e.positive) for e in symmetric.examples] == [("咳嗽", "止咳")] and dropped == 2
