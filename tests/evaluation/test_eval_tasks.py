"""Task folders: type detection, loading, and one-line errors that name the file and line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from care_retriever.errors import InputError
from care_retriever.evaluation.tasks import INSTRUCTIONS, RerankTask, RetrievalTask, STSTask, load_task
from tests.support.data import write_jsonl


def beir(folder: Path, qrels: str | None = None) -> Path:
    write_jsonl(
        folder / "corpus.jsonl",
        [
            {"_id": "t0", "title": "", "text": ""},  # empty documents exist in the real data
            {"_id": "t1", "title": "高血压", "text": "高血压患者应低盐饮食"},
            {"_id": "t2", "text": "感冒多休息多喝水"},
        ],
    )
    write_jsonl(folder / "queries.jsonl", [{"_id": "q1", "text": "高血压吃什么"}, {"_id": "q2", "text": "感冒"}])
    (folder / "qrels").mkdir(exist_ok=True)
    (folder / "qrels" / "test.tsv").write_text(
        qrels or "query-id\tcorpus-id\tscore\nq1\tt1\t3\nq1\tt0\t0\n", encoding="utf-8"
    )
    return folder


def test_retrieval_folder_loads_with_empty_documents_and_only_judged_queries(tmp_path: Path) -> None:
    task = load_task(beir(tmp_path / "qtr"))
    assert isinstance(task, RetrievalTask)
    assert task.corpus_ids == ["t0", "t1", "t2"]
    assert task.corpus_texts == ["", "高血压\n高血压患者应低盐饮食", "感冒多休息多喝水"]
    assert task.qrels == {"q1": {"t1": 3, "t0": 0}}
    assert task.query_ids == ["q1"]  # q2 has no judgements: not scored (BEIR / MTEB convention)
    assert task.instruction == INSTRUCTIONS["retrieval"]
    assert task.relevance_level == 1


def test_task_json_overrides_name_instruction_and_relevance_level(tmp_path: Path) -> None:
    folder = beir(tmp_path / "x")
    (folder / "task.json").write_text(json.dumps({"name": "mine", "instruction": "找", "relevance_level": 2}))
    task = load_task(folder)
    assert (task.name, task.instruction, task.relevance_level) == ("mine", "找", 2)
    assert load_task(folder, instruction="override").instruction == "override"


def test_known_kuake_qtr_counts_grade_two_as_relevant(tmp_path: Path) -> None:
    assert load_task(beir(tmp_path / "kuake-qtr-retrieval")).relevance_level == 2


def test_rerank_and_sts_detected_from_rows(tmp_path: Path) -> None:
    rr = write_jsonl(tmp_path / "rr" / "test.jsonl", [{"query": "头痛", "positive": ["a"], "negative": ["b", "c"]}])
    sts = write_jsonl(
        tmp_path / "sts" / "test.jsonl",
        [
            {"sentence1": "a", "sentence2": "b", "score": 1},
            {"sentence1": "c", "sentence2": "d", "score": "0"},
        ],
    )
    task = load_task(rr.parent)
    assert isinstance(task, RerankTask) and task.rows[0].negative == ["b", "c"]
    assert task.instruction == INSTRUCTIONS["rerank"]
    sts_task = load_task(sts)  # a rows file works as well as its folder
    assert isinstance(sts_task, STSTask) and sts_task.scores == [1.0, 0.0]
    assert sts_task.instruction == INSTRUCTIONS["sts"]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda f: (f / "queries.jsonl").unlink(), "queries.jsonl: missing queries.jsonl"),
        (lambda f: (f / "qrels" / "test.tsv").unlink(), "test.tsv: missing qrels/test.tsv"),
        (
            lambda f: (f / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\tt9\t1\n"),
            "test.tsv:2: unknown corpus id 't9'",
        ),
        (
            lambda f: (f / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\tt1\t1\nq7\tt1\t1\n"),
            "test.tsv:3: unknown query id 'q7'",
        ),
        (
            lambda f: (f / "qrels" / "test.tsv").write_text("q-id\tc-id\tscore\nq1\tt1\thigh\n"),
            "test.tsv:2: score 'high' is not an integer",
        ),
        (lambda f: (f / "queries.jsonl").write_text(""), "queries.jsonl: empty query set"),
        (
            lambda f: (f / "corpus.jsonl").write_text('{"_id": "t1", "text": "a"}\n{"_id": "t1", "text": "b"}\n'),
            "corpus.jsonl:2: duplicate document id 't1'",
        ),
        (
            lambda f: (f / "queries.jsonl").write_text('{"_id": "q1", "text": "a"}\n{"_id": "q2"\n'),
            "queries.jsonl:2: invalid JSON",
        ),
    ],
)
def test_bad_retrieval_folders_fail_with_file_and_line(tmp_path: Path, mutate, message: str) -> None:
    folder = beir(tmp_path / "t")
    mutate(folder)
    with pytest.raises(InputError) as err:
        load_task(folder)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_bad_sts_and_rerank_rows(tmp_path: Path) -> None:
    sts = write_jsonl(
        tmp_path / "s" / "test.jsonl",
        [
            {"sentence1": "a", "sentence2": "b", "score": 1},
            {"sentence1": "a", "sentence2": "b", "score": "yes"},
        ],
    )
    with pytest.raises(InputError, match=r"test.jsonl:2: score 'yes' is not a number"):
        load_task(sts)
    rr = write_jsonl(tmp_path / "r" / "test.jsonl", [{"query": "q", "positive": [], "negative": ["x"]}])
    with pytest.raises(InputError, match=r"test.jsonl:1: no \"positive\" candidates"):
        load_task(rr)
    empty = tmp_path / "e" / "test.jsonl"
    empty.parent.mkdir()
    empty.write_text("\n")
    with pytest.raises(InputError, match="empty task file"):
        load_task(empty)
    with pytest.raises(InputError, match="task not found"):
        load_task(tmp_path / "nope")
    with pytest.raises(InputError, match="not a task folder"):
        load_task(tmp_path)


def test_shared_dev_tasks_load(shared_data: Path) -> None:
    tasks = shared_data / "tasks"
    qtr = load_task(tasks / "kuake-qtr-retrieval")
    assert isinstance(qtr, RetrievalTask) and len(qtr.corpus_ids) == 32176 and len(qtr.query_ids) == 709
    assert "" in qtr.corpus_texts  # t0 is empty: evaluation keeps it
    assert isinstance(load_task(tasks / "kuake-qtr-rerank"), RerankTask)
    assert isinstance(load_task(tasks / "chip-sts"), STSTask)
