"""The seeded miniature report's arithmetic, on synthetic run folders (their scores written by hand)."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from benchmarks import make_results
from experiments import training_miniature_report


@pytest.fixture(scope="module")
def report() -> ModuleType:
    return training_miniature_report


# (kuake-qtr-retrieval, kuake-qtr-rerank) per seed; Avg is their mean
SCORES = {
    "small-symmetric": [(0.50, 0.70), (0.52, 0.72), (0.54, 0.74)],  # Avg 0.60, 0.62, 0.64
    "large-symmetric": [(0.56, 0.76), (0.58, 0.78), (0.60, 0.80)],  # Avg 0.66, 0.68, 0.70
    "asymmetric-two-stage": [(0.56, 0.74), (0.57, 0.77), (0.58, 0.78)],  # Avg 0.65, 0.67, 0.68
    "without-stage-ii": [(0.55, 0.73), (0.55, 0.73), (0.55, 0.73)],
    "without-stage-i": [(0.30, 0.60), (0.31, 0.61), (0.32, 0.62)],
    "bm25": [(0.546, 0.80)] * 3,
}
# im-qa-retrieval per seed (0.1 + seed / 100 for the models above)
IMQA = {"bm25": [0.20, 0.20, 0.20], "hybrid": [0.24, 0.22, 0.23]}


def hybrid_row() -> str:
    """The hybrid row's name: the product's default fusion in the label (`eval --mode hybrid` tables)."""
    from care_retriever.evaluation.hybrid import mode_label
    from care_retriever.sparse.fusion import FusionConfig

    return mode_label("asymmetric-two-stage", "hybrid", FusionConfig())


def synthetic_run(folder: Path, seed: int) -> Path:
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(
        json.dumps(
            {
                "recipe": "miniature-ablations",
                "done": ["init", "stage0-query"],
                "init_seconds": 1.0,
                "reports": [
                    {
                        "name": "stage0-query",
                        "steps": 10,
                        "seconds": 60.0,
                        "wall_seconds": 61.0,
                        "first_loss": 2.0,
                        "last_loss": 1.0,
                    }
                ],
            }
        )
    )
    models = {
        name: {
            "kuake-qtr-retrieval": {"main_score": rows[seed][0]},
            "kuake-qtr-rerank": {"main_score": rows[seed][1]},
            "im-qa-retrieval": {"main_score": IMQA.get(name, [0.1 + s / 100 for s in range(3)])[seed]},
        }
        for name, rows in SCORES.items()
    }
    # the hybrid row: kuake-qtr +0.03 over the dense model in every seed
    models[hybrid_row()] = {
        "kuake-qtr-retrieval": {"main_score": SCORES["asymmetric-two-stage"][seed][0] + 0.03},
        "im-qa-retrieval": {"main_score": IMQA["hybrid"][seed]},
    }
    # the same asymmetric model with its documents cut short: im-qa 0.05 lower in every seed
    models["asymmetric-two-stage (documents cut to 64 tokens)"] = {"im-qa-retrieval": {"main_score": 0.05 + seed / 100}}
    (folder / "miniature_scores.json").write_text(json.dumps({"seed": seed, "models": models, "info": {}}))
    return folder


def test_report_of_three_seeds(report, tmp_path: Path) -> None:
    runs = [str(synthetic_run(tmp_path / f"seed-{s}", s)) for s in range(3)]
    doc, kept = tmp_path / "m.md", tmp_path / "m.json"
    report.main(["--run", *runs, "--doc", str(doc), "--json", str(kept)])

    seeds = json.loads(kept.read_text())["seeds"]
    assert [e["seed"] for e in seeds] == [0, 1, 2]
    assert seeds[1]["models"]["small-symmetric"]["kuake-qtr-retrieval"] == {"main_score": 0.52}
    text = doc.read_text()
    # mean +- sample sd: small Avg 0.60/0.62/0.64 -> 0.6200 +- 0.0200; asym 0.65/0.67/0.68 -> 0.6667 +- 0.0153
    assert "| small-symmetric |  |  | 0.5200 ± 0.0200 | 0.7200 ± 0.0200 | 0.6200 ± 0.0200 |" in text
    assert "0.6667 ± 0.0153" in text
    # gap (0.68 - 0.62) = 0.06; closed (0.6667 - 0.62) / 0.06 = 78%
    assert report.gap_closure(seeds) == pytest.approx((2.0 / 3 - 0.62) / 0.06)
    assert "Gap-closure ratio (asymmetric - small) / (large - small) on mean Avg: 78%." in text
    assert "on Avg (mean of 3 seeds): **met** (0.6800 vs 0.6200, +0.0600)" in text
    assert "closes >= 90% of that gap: **missed**, closed 78%" in text
    # kuake-qtr margins over BM25 0.546: +0.014, +0.024, +0.034 -> missed in seed 0
    assert "in every seed: **missed** (margins +0.0140, +0.0240, +0.0340)" in text
    assert "full > without Stage II > without Stage I (mean Avg): **met**" in text
    assert text.count("| stage0-query | 10 | 60 | 61 | 2.000 -> 1.000 |") == 3
    # hybrid target: kuake-qtr hybrid 0.6000 vs dense 0.5700 (+0.03: met); im-qa 0.2300 vs BM25 0.2000 (+0.03: met)
    assert "on kuake-qtr-retrieval (hybrid target, mean of 3 seeds): **met** (0.6000 vs 0.5700, +0.0300)" in text
    assert "on im-qa-retrieval (hybrid target, mean of 3 seeds): **met** (0.2300 vs 0.2000, +0.0300)" in text
    assert f"| {hybrid_row()} |" in text
    assert (
        "rises with the longer documents (whole answers, 256 tokens, against the same model's documents cut to 64 "
        "tokens): **met** (0.1100 vs 0.0600; per seed +0.0500, +0.0500, +0.0500)."
    ) in text
    assert "| asymmetric-two-stage (documents cut to 64 tokens) |" in text


def test_a_model_some_seeds_lack_says_over_how_many_seeds_its_mean_is(report, tmp_path: Path) -> None:
    """Table 5's variants trained in seed 0 only (``train --stage``): their row is not passed off as a
    3-seed mean, while the rows every seed has stay plain."""
    runs = [synthetic_run(tmp_path / f"seed-{s}", s) for s in range(3)]
    scores = json.loads((runs[0] / "miniature_scores.json").read_text())
    scores["models"]["stage1-without-mse"] = {"kuake-qtr-retrieval": {"main_score": 0.5}}
    (runs[0] / "miniature_scores.json").write_text(json.dumps(scores))
    doc = tmp_path / "m.md"
    report.main(["--run", *map(str, runs), "--doc", str(doc), "--json", str(tmp_path / "m.json")])
    text = doc.read_text()
    assert "| stage1-without-mse |  |  | 0.5000 ± 0.0000 (1 of 3 seeds) |" in text
    assert "| small-symmetric |  |  | 0.5200 ± 0.0200 | 0.7200 ± 0.0200 |" in text


def test_a_runs_seed_is_its_own_not_its_recipe_files(report, tmp_path: Path) -> None:
    """``--seeds`` runs share one recipe file (seed 0): run.json's seed, else the seed-<k> folder's."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("seed: 0\n")
    assert report.seed_of({"source": str(recipe)}, tmp_path / "seed-2") == 2
    assert report.seed_of({"source": str(recipe), "seed": 5}, tmp_path / "seed-2") == 5
    assert report.seed_of({"source": str(recipe)}, tmp_path / "run") == 0


def test_a_runs_cached_scores_take_the_runs_seed(report, tmp_path: Path) -> None:
    """Scores cached before run.json kept the seed say the recipe file's seed (0 for every --seeds run):
    the report labels them with the run's seed, not the cache's (miniature.json once said 0, 0, 2)."""
    runs = [synthetic_run(tmp_path / f"seed-{s}", s) for s in range(3)]
    cached = runs[1] / "miniature_scores.json"
    cached.write_text(json.dumps({**json.loads(cached.read_text()), "seed": 0}))
    doc, kept = tmp_path / "m.md", tmp_path / "m.json"
    report.main(["--run", *map(str, runs), "--doc", str(doc), "--json", str(kept)])
    assert [e["seed"] for e in json.loads(kept.read_text())["seeds"]] == [0, 1, 2]


def test_a_seed_given_twice_is_an_error_not_a_mean(report, tmp_path: Path) -> None:
    run = synthetic_run(tmp_path / "seed-0", 0)
    doc, kept = tmp_path / "m.md", tmp_path / "m.json"
    with pytest.raises(SystemExit, match=r"seed\(s\) \[0\] given more than once"):
        report.main(["--run", str(run), str(run), "--doc", str(doc), "--json", str(kept)])
    assert not doc.exists() and not kept.exists()


def test_seed_labels_correct_a_saved_file_that_named_one_seed_twice(report, tmp_path: Path) -> None:
    runs = [str(synthetic_run(tmp_path / f"seed-{s}", s)) for s in range(3)]
    saved, doc, kept = tmp_path / "saved.json", tmp_path / "m.md", tmp_path / "m.json"
    report.main(["--run", *runs, "--doc", str(doc), "--json", str(saved)])
    broken = json.loads(saved.read_text())
    broken["seeds"][1]["seed"] = 0  # what the report wrote before a run's seed came from its run.json
    saved.write_text(json.dumps(broken))
    with pytest.raises(SystemExit, match=r"seed\(s\) \[0\] given more than once"):
        report.main(["--from-json", str(saved), "--doc", str(doc), "--json", str(kept)])
    with pytest.raises(SystemExit, match="--seed-labels gives 2 seed"):
        report.main(["--from-json", str(saved), "--seed-labels", "0", "1", "--doc", str(doc), "--json", str(kept)])
    report.main(["--from-json", str(saved), "--seed-labels", "0", "1", "2", "--doc", str(doc), "--json", str(kept)])
    seeds = json.loads(kept.read_text())["seeds"]
    assert [e["seed"] for e in seeds] == [0, 1, 2]
    assert seeds[1]["models"] == broken["seeds"][1]["models"]  # relabelled, scores untouched
    assert "from 3 seed(s) (0, 1, 2)" in doc.read_text()


def test_a_re_render_from_the_json_keeps_each_runs_stage_times(report, tmp_path: Path) -> None:
    runs = [str(synthetic_run(tmp_path / f"seed-{s}", s)) for s in range(3)]
    doc, kept, again = tmp_path / "m.md", tmp_path / "m.json", tmp_path / "again.md"
    report.main(["--run", *runs, "--doc", str(doc), "--json", str(kept)])
    report.main(["--from-json", str(kept), "--doc", str(again), "--json", str(tmp_path / "again.json")])
    text = again.read_text()
    assert text.count("| stage0-query | 10 | 60 | 61 | 2.000 -> 1.000 |") == 3
    assert f"Time per stage, `{runs[1]}`" in text


class CountingEmbedder:
    """Stands in for a loaded model (the thing under test is the sharing, not the encoding)."""

    def __init__(self, fingerprint: str) -> None:
        self.space_fingerprint = fingerprint
        self.calls = 0

    def embed_documents(self, texts, **kwargs):
        self.calls += 1
        return [f"{self.space_fingerprint}:{t}" for t in texts]


def test_models_of_one_document_space_encode_each_corpus_once(report) -> None:
    shared: dict = {}
    large, asym, small = CountingEmbedder("doc"), CountingEmbedder("doc"), CountingEmbedder("query")
    a = report.SharedDocumentEmbeddings(large, shared).embed_documents(["x", "y"])
    b = report.SharedDocumentEmbeddings(asym, shared).embed_documents(["x", "y"])
    report.SharedDocumentEmbeddings(asym, shared).embed_documents(["x", "z"])  # another corpus
    c = report.SharedDocumentEmbeddings(small, shared).embed_documents(["x", "y"])  # another space
    assert a is b and (large.calls, asym.calls, small.calls) == (1, 1, 1)
    assert c == ["query:x", "query:y"]


def test_legacy_single_seed_file_is_kept_as_a_labelled_seed_zero(report, tmp_path: Path) -> None:
    legacy = tmp_path / "old.json"
    row = {
        "kuake-qtr-retrieval": 0.55,
        "kuake-qtr-rerank": 0.85,
        "chip-sts": None,
        "query_params": 1,
        "document_params": 2,
        "queries_per_s": 3.0,
    }
    legacy.write_text(json.dumps({"results": {"asymmetric-two-stage": row, "bm25": dict(row)}}))
    kept = tmp_path / "m.json"
    report.main(["--convert-legacy", str(legacy), "--doc", str(tmp_path / "m.md"), "--json", str(kept)])
    (seed,) = json.loads(kept.read_text())["seeds"]
    assert seed["seed"] == 0 and "converted from the previous" in seed["label"]
    assert seed["models"]["asymmetric-two-stage"]["kuake-qtr-rerank"]["main_score"] == 0.85
    assert "chip-sts" not in seed["models"]["bm25"]
    assert "> Seed 0 is the single-seed run" in (tmp_path / "m.md").read_text()


def test_results_table_reads_the_reports_seeds(report, tmp_path: Path) -> None:
    """`python -m benchmarks.make_results --from-miniature` reads the file this report writes (its first seed)."""
    runs = [str(synthetic_run(tmp_path / f"seed-{s}", s)) for s in range(2)]
    kept = tmp_path / "m.json"
    report.main(["--run", *runs, "--doc", str(tmp_path / "m.md"), "--json", str(kept)])
    tasks = tmp_path / "tasks"
    for name in ("kuake-qtr-retrieval", "im-qa-retrieval"):
        (tasks / name).mkdir(parents=True)
        (tasks / name / "corpus.jsonl").write_text('{"_id": "d", "text": "t"}\n')
    (tasks / "kuake-qtr-rerank").mkdir()
    (tasks / "kuake-qtr-rerank" / "test.jsonl").write_text('{"query": "q", "positive": ["a"], "negative": ["b"]}\n')
    rows = make_results.miniature_rows(kept, tasks, skip={"bm25"})
    found = {(r["model"], r["task"]): (r["type"], r["main_score"]) for r in rows}
    assert found[("small-symmetric", "kuake-qtr-retrieval")] == ("retrieval", 0.50)  # seed 0, not seed 1's 0.52
    assert found[("small-symmetric", "kuake-qtr-rerank")] == ("rerank", 0.70)
    assert not any(model == "bm25" for model, _ in found)


def test_a_run_scored_before_its_hybrid_row_gains_it_and_keeps_its_dense_scores(
    report, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Only missing rows are scored: a cached dense row stays as it was (a sentinel value here), its
    missing hybrid and short-document rows and BM25 are scored, and the document's load-average line
    appears only when something was."""
    import shutil

    from tests.support.eval_tasks import write_tasks

    toy = write_tasks(tmp_path / "toy")
    data = tmp_path / "data"
    for name, kind in zip(report.TASKS, ("retrieval", "retrieval", "rerank", "sts"), strict=True):
        shutil.copytree(toy[kind], data / "tasks" / name)
    run = tmp_path / "seed-0"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"recipe": "x", "seed": 0, "done": [], "reports": []}))
    shutil.copytree(tiny_model_dir, run / "models" / "asymmetric-two-stage")
    sentinel = {task: {"main_score": 0.123} for task in report.TASKS}
    cached = {"seed": 0, "models": {"asymmetric-two-stage": sentinel}, "info": {}}
    (run / report.SCORES_FILE).write_text(json.dumps(cached))
    doc, kept = tmp_path / "m.md", tmp_path / "m.json"

    report.main(["--run", str(run), "--data-dir", str(data), "--doc", str(doc), "--json", str(kept)])
    models = json.loads(kept.read_text())["seeds"][0]["models"]
    assert models["asymmetric-two-stage"] == sentinel
    assert set(models["bm25"]) == {report.KUAKE_RETRIEVAL, report.IMQA, report.RERANK}  # no sentence embedding
    hybrid = models[hybrid_row()]
    assert set(hybrid) == {report.KUAKE_RETRIEVAL, report.IMQA, report.RERANK}  # a hybrid has no STS row
    assert set(models[report.short_name("asymmetric-two-stage")]) == {report.IMQA}  # documents cut: im-qa only
    assert 0.0 < hybrid[report.KUAKE_RETRIEVAL]["main_score"] <= 1.0
    assert "load average" in doc.read_text()

    report.main(["--run", str(run), "--data-dir", str(data), "--doc", str(doc), "--json", str(kept)])
    assert json.loads(kept.read_text())["seeds"][0]["models"] == models
    assert "load average" not in doc.read_text()  # nothing scored: no load figures to claim
