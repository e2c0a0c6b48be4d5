"""End to end: `care-retriever eval` on small task folders with a tiny CARE model, BM25 and baselines."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from care_retriever.cli.eval import expand_greedy
from care_retriever.evaluation.tasks import load_task
from tests.support.cli import run_cli
from tests.support.eval_tasks import DOCS


def test_greedy_options_expand() -> None:
    assert expand_greedy(["--task", "a", "b", "--models", "x", "y", "--json"]) == [
        "--task",
        "a",
        "--task",
        "b",
        "--models",
        "x",
        "--models",
        "y",
        "--json",
    ]
    assert expand_greedy(["--model", "m", "--task"]) == ["--model", "m", "--task"]


def test_eval_json_all_task_types_with_tiny_model(
    tiny_model_dir: Path, tasks: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_file = tmp_path / "runs" / "tiny.trec"
    code, out, err = run_cli(
        capsys,
        "eval",
        "--model",
        tiny_model_dir,
        "--task",
        *tasks.values(),
        "--json",
        "--save-run",
        run_file,
        "--no-progress",
    )
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["type"] for r in rows] == ["retrieval", "rerank", "sts"]
    for row in rows:
        assert set(row) >= {"task", "type", "main_score", "metrics", "model", "seconds"}
        assert row["model"] == tiny_model_dir.name
        assert -1.0 <= row["main_score"] <= 1.0
    assert set(rows[0]["metrics"]) == {"ndcg@10", "recall@10", "recall@100", "mrr@10", "map@100"}
    assert rows[0]["main_score"] == rows[0]["metrics"]["ndcg@10"]
    assert set(rows[1]["metrics"]) == {"map@10", "mrr@10"}
    assert set(rows[2]["metrics"]) == {"pearson", "spearman"}
    # Recall@100 over a 6-document corpus: every judged relevant document is retrieved.
    assert rows[0]["metrics"]["recall@100"] == 1.0
    # Several (model, task) pairs: one run file per ranking task, re-scorable by trec_eval.
    retrieval_run = run_file.with_name(f"tiny.{tiny_model_dir.name}.toy-retrieval.trec")
    lines = retrieval_run.read_text().splitlines()
    assert len(lines) == 3 * len(DOCS)
    assert {line.split()[2] for line in lines} >= {"t0"}
    assert run_file.with_name(f"tiny.{tiny_model_dir.name}.toy-rerank.trec").is_file()


def test_eval_scores_equal_a_direct_computation(tiny_model_dir: Path, tasks: dict[str, Path]) -> None:
    """The harness adds nothing to the model's numbers: recompute STS and a retrieval ranking by hand."""
    from scipy import stats

    from care_retriever.evaluation.runner import evaluate
    from care_retriever.evaluation.tasks import INSTRUCTIONS, instruction_for
    from care_retriever.model.baselines import load_embedder

    model = load_embedder(str(tiny_model_dir))
    sts = load_task(tasks["sts"])
    result = evaluate(model, sts, model_name="tiny")
    # the task's instruction where the query tower takes one (the tiny BERT tower takes none)
    a = model.embed_queries(sts.sentence1, instruction=instruction_for(model, INSTRUCTIONS["sts"]))
    b = model.embed_queries(sts.sentence2, instruction=instruction_for(model, INSTRUCTIONS["sts"]))
    cos = (a * b).sum(axis=1)
    from care_retriever.evaluation.runner import Timer, _retrieval_run, _sts_cosines

    harness_cos = _sts_cosines(
        model, sts, Timer(), sts_encode="query", query_batch_size=32, doc_batch_size=16, show_progress=False
    )
    # A random tiny model puts every pair near cosine 1, so compare cosines, then the correlation of those.
    assert np.allclose(harness_cos, cos, atol=1e-6)
    assert result.metrics["pearson"] == pytest.approx(stats.pearsonr(harness_cos, sts.scores).statistic, abs=1e-9)
    ret = load_task(tasks["retrieval"])
    docs = model.embed_documents(ret.corpus_texts)
    queries = model.embed_queries(
        [ret.queries[q] for q in ret.query_ids], instruction=instruction_for(model, ret.instruction)
    )
    sims = queries @ docs.T

    run = _retrieval_run(model, ret, Timer(), top_k=3, query_batch_size=2, doc_batch_size=2, show_progress=False)
    for row, qid in zip(sims, ret.query_ids, strict=True):
        # Same scores for every document (FAISS exact search = the dot products), empty document included.
        assert sorted(run[qid].values(), reverse=True) == pytest.approx(sorted(row, reverse=True)[:3], abs=1e-5)
        for doc, score in run[qid].items():
            assert score == pytest.approx(float(row[ret.corpus_ids.index(doc)]), abs=1e-5)


def test_bm25_and_models_comparison_table(
    tiny_model_dir: Path, tasks: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(
        capsys,
        "eval",
        "--models",
        "bm25",
        tiny_model_dir,
        f"{tiny_model_dir}#document",
        "--task",
        tasks["retrieval"],
        tasks["sts"],
        "--no-progress",
    )
    assert code == 0, err
    table = out.strip().split("\n\n")[0].splitlines()
    assert table[0].startswith("| model | toy-retrieval (nDCG@10) | toy-sts (Pearson) | avg |")
    assert [line.split("|")[1].strip() for line in table[2:]] == ["bm25", "tiny", "tiny#document"]
    assert "n/a" in table[2]  # BM25 has no STS score; its average says it covers 1 of 2 tasks
    assert "(1/2)" in table[2]
    assert "skipped" in err


def test_bm25_ranks_lexical_matches_first(tasks: dict[str, Path]) -> None:
    from care_retriever.evaluation.runner import evaluate
    from care_retriever.sparse.bm25 import BM25Model

    result = evaluate(BM25Model(), load_task(tasks["retrieval"]), model_name="bm25")
    assert result.metrics["mrr@10"] == 1.0  # every query shares words only with its relevant document
    rerank = evaluate(BM25Model(), load_task(tasks["rerank"]), model_name="bm25")
    assert rerank.main_score is not None and 0 < rerank.main_score <= 1


def test_sentence_transformer_baseline(tiny_model_dir: Path, tasks: dict[str, Path]) -> None:
    """A plain sentence-transformers folder (the CARE folder read by ST itself) through the same path."""
    from care_retriever.evaluation.runner import evaluate
    from care_retriever.model.baselines import SentenceTransformerEmbedder, load_embedder

    st = SentenceTransformerEmbedder(str(tiny_model_dir))
    care = load_embedder(str(tiny_model_dir))
    texts = ["高血压吃什么", "感冒"]
    assert np.allclose(st.embed_documents(texts), care.embed_documents(texts), atol=1e-4)
    assert evaluate(st, load_task(tasks["rerank"]), model_name="st").main_score is not None


def test_cli_errors_are_one_line(tasks: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tasks["retrieval"] / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\tnope\t1\n")
    code, _out, err = run_cli(capsys, "eval", "--model", "bm25", "--task", tasks["retrieval"])
    assert code == 2
    assert err.strip().startswith("error: ") and "test.tsv:2: unknown corpus id 'nope'" in err
    assert len(err.strip().splitlines()) == 1
    code, _, err = run_cli(capsys, "eval", "--model", tmp_path / "missing", "--task", tasks["sts"])
    assert code == 2 and "model folder not found" in err
    code, _, err = run_cli(capsys, "eval", "--task", tasks["sts"])
    assert code == 2 and "--model" in err


def test_suite_all_runs_every_task(tasks: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "eval", "--model", "bm25", "--suite", "all", tasks["sts"].parent, "--json")
    assert code == 0, err
    assert sorted(json.loads(line)["task"] for line in out.splitlines()) == [
        "toy-rerank",
        "toy-retrieval",
        "toy-sts",
    ]
    code, _, err = run_cli(capsys, "eval", "--model", "bm25", "--suite", "cmedteb", tasks["sts"].parent)
    assert code == 2 and "none of the CMedTEB tasks" in err


@pytest.mark.slow
@pytest.mark.shared_data
def test_bm25_reproduces_reference_on_kuake_qtr(shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """shared/data/README.md: BM25 (jieba, bm25s) nDCG@10 0.546 on kuake-qtr-retrieval."""
    task = shared_data / "tasks" / "kuake-qtr-retrieval"
    code, out, err = run_cli(capsys, "eval", "--model", "bm25", "--task", task, "--json", "--no-progress")
    assert code == 0, err
    row = json.loads(out)
    assert row["main_score"] == pytest.approx(0.546, abs=0.01)
    assert row["metrics"]["recall@100"] == pytest.approx(0.937, abs=0.01)
    # the < 10 % overhead target is timed in benchmarks/eval_speed.py, not here: a busy CI machine moves it
    assert 0.0 <= row["timing"]["overhead_fraction"] < 1.0
