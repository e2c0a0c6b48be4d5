"""Raw CBLUE JSON and question/answer JSONL -> task folders that `care-retriever eval` reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from care_retriever.cli.main import main
from care_retriever.errors import InputError
from care_retriever.evaluation.converters import chip_sts, kuake_qqr, kuake_qtr, qa_jsonl
from care_retriever.evaluation.tasks import RerankTask, RetrievalTask, STSTask, load_task

QTR = [
    {"id": "s1", "query": "艾滋病治愈", "title": "艾滋病能治愈吗？", "query_id": "q1", "label": "3"},
    {"id": "s2", "query": "艾滋病治愈", "title": "艾滋病的传播途径", "query_id": "q1", "label": "1"},
    {"id": "s3", "query": "宝宝发烧", "title": "宝宝发烧怎么办", "query_id": "q2", "label": "2"},
    {"id": "s4", "query": "宝宝发烧", "title": "艾滋病的传播途径", "query_id": "q2", "label": "0"},
]


def write_json(path: Path, data: list[dict]) -> Path:
    path.write_text(json.dumps(data, ensure_ascii=False, indent=1), encoding="utf-8")
    return path


def test_kuake_qtr_to_retrieval_and_rerank(tmp_path: Path) -> None:
    src = write_json(tmp_path / "KUAKE-QTR_dev.json", QTR)
    task = load_task(kuake_qtr(src, tmp_path / "qtr"))
    assert isinstance(task, RetrievalTask)
    assert len(task.corpus_ids) == 3  # titles are deduplicated into one corpus
    assert task.relevance_level == 2
    assert sorted(task.qrels["q1"].values()) == [1, 3]
    rr = load_task(kuake_qtr(src, tmp_path / "qtr-rr", as_="rerank"))
    assert isinstance(rr, RerankTask)
    assert [(r.positive, r.negative) for r in rr.rows] == [
        (["艾滋病能治愈吗？"], ["艾滋病的传播途径"]),
        (["宝宝发烧怎么办"], ["艾滋病的传播途径"]),
    ]


def test_sts_converters(tmp_path: Path) -> None:
    qqr = write_json(
        tmp_path / "qqr.json",
        [
            {"id": "s1", "query1": "头痛", "query2": "头疼", "label": "2"},
            {"id": "s2", "query1": "头痛", "query2": "脚痛", "label": "0"},
        ],
    )
    sts = load_task(kuake_qqr(qqr, tmp_path / "qqr"))
    assert isinstance(sts, STSTask) and sts.scores == [2.0, 0.0]
    chip = tmp_path / "chip.jsonl"  # JSONL copies of CBLUE files read too
    chip.write_text(
        '{"id": 1, "text1": "糖尿病吃什么", "text2": "糖尿病饮食", "label": "1", "category": "diabetes"}\n'
        '{"id": 2, "text1": "糖尿病吃什么", "text2": "高血压", "label": "0", "category": "diabetes"}\n',
        encoding="utf-8",
    )
    assert load_task(chip_sts(chip, tmp_path / "chip")).sentence2 == ["糖尿病饮食", "高血压"]


def test_qa_jsonl_to_retrieval(tmp_path: Path) -> None:
    src = tmp_path / "qa.jsonl"
    rows = [
        {"query": "高血压吃什么", "description": "我五十岁", "text": "低盐饮食"},
        {"query": "感冒怎么办", "text": "多喝水"},
        {"query": "高血压吃什么药", "text": "低盐饮食"},
    ]
    src.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    task = load_task(qa_jsonl(src, tmp_path / "qa", with_description=True))
    assert isinstance(task, RetrievalTask)
    assert task.corpus_texts == ["低盐饮食", "多喝水"]
    assert task.queries["q0"] == "高血压吃什么\n我五十岁"
    assert task.qrels == {"q0": {"a0": 1}, "q1": {"a1": 1}, "q2": {"a0": 1}}


def test_bad_raw_files_name_the_entry_and_leave_nothing(tmp_path: Path) -> None:
    unlabelled = write_json(tmp_path / "test.json", [{**QTR[0], "label": ""}])
    with pytest.raises(InputError, match=r"test.json: entry 0: no label"):
        kuake_qtr(unlabelled, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.glob(".out.*"))  # the temporary folder is gone too
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"query": "a", "text": "b"}\n{"query": \n', encoding="utf-8")
    with pytest.raises(InputError, match=r"broken.jsonl:2: invalid JSON"):
        qa_jsonl(broken, tmp_path / "qa")
    missing = write_json(tmp_path / "m.json", [{"query1": "a", "label": "1"}])
    with pytest.raises(InputError, match=r"m.json: entry 0: missing text field \(one of query2\)"):
        kuake_qqr(missing, tmp_path / "m")


def test_convert_task_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write_json(tmp_path / "qtr.json", QTR)
    assert main(["convert-task", "kuake-qtr", str(src), str(tmp_path / "t"), "--as", "rerank"]) == 0
    assert "wrote rerank task 't'" in capsys.readouterr().out
    assert main(["convert-task", "kuake-qtr", str(src), str(tmp_path / "t")]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert main(["convert-task", "cmedqa", str(src), str(tmp_path / "u")]) == 2
    assert "unknown format" in capsys.readouterr().err
