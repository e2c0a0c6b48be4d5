"""``search --filter`` / ``--filter-json``: typed values and operators find the documents the Python filter finds,
on FAISS and Qdrant Edge; repeated flags AND-ed; a malformed or contradictory filter is one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from care_retriever.cli.main import main

ROWS = [
    {
        "_id": "a",
        "text": "高血压患者应低盐饮食。",
        "metadata": {"year": 2019, "dept": "心内科", "n": 3, "src": {"kind": "guide"}},
    },
    {
        "_id": "b",
        "text": "糖尿病需要控制血糖。",
        "metadata": {"year": 2021, "dept": "内分泌科", "n": "3", "flag": True},
    },
    {"_id": "c", "text": "感冒多休息多喝水。", "metadata": {"year": 2023.5, "dept": "心内科", "flag": False}},
    {"_id": "d", "text": "血压高怎么办？", "metadata": {"dept": ["心内科", "急诊"], "src": {"kind": "faq"}}},
]


def _run(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def filter_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("filter-corpus") / "corpus.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in ROWS), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def filter_stores(tmp_path_factory: pytest.TempPathFactory, filter_corpus: Path) -> tuple[Path, list[str]]:
    root = tmp_path_factory.mktemp("filter-cli")
    model = root / "model"
    assert main(["init", str(model), "--preset", "tiny", "--vocab-from", str(filter_corpus)]) == 0
    stores = [f"faiss:{root / 'faiss'}", f"qdrant:{root / 'edge'}"]
    for store in stores:
        args = ["index", "--model", str(model), "--corpus", str(filter_corpus), "--store", store, "--no-progress"]
        assert main(args) == 0
    return model, stores


CASES = [
    (["--filter", "n=3"], {"a"}),  # a number matches the stored number only
    (["--filter", "n='3'"], {"b"}),  # quotes make it a string
    (["--filter", "year>=2020"], {"b", "c"}),
    (["--filter", "year>=2020", "--filter", "dept=心内科"], {"c"}),  # AND-ed
    (["--filter", "dept=心内科"], {"a", "c", "d"}),  # a stored list matches on any element
    (["--filter", "dept!=心内科,内分泌科"], set()),
    (["--filter", "flag!=true"], {"a", "c", "d"}),  # a missing field is not equal
    (["--filter", "src.kind=faq"], {"d"}),  # a dotted field is a nested path
    (
        [
            "--filter-json",
            '{"operator": "OR", "conditions": [{"field": "meta.year", "operator": "<", "value": 2020},'
            ' {"field": "meta.flag", "operator": "==", "value": true}]}',
        ],
        {"a", "b"},
    ),
    (["--filter-json", '{"year": [2019, 2021]}', "--filter", "n=3"], {"a"}),
]


@pytest.mark.parametrize(("flags", "expected"), CASES, ids=[" ".join(f) for f, _ in CASES])
def test_filter_flags_find_the_typed_matches_on_every_store(capsys, filter_stores, flags, expected) -> None:
    model, stores = filter_stores
    for store in stores:
        code, out, err = _run(capsys, "search", "--model", model, "--store", store, "--json", *flags, "血压")
        assert code == 0, err
        assert {h["id"] for h in json.loads(out)["hits"]} == expected, store


def test_filter_json_reads_a_file(capsys, filter_stores, tmp_path: Path) -> None:
    model, stores = filter_stores
    path = tmp_path / "f.json"
    path.write_text('{"field": "meta.year", "operator": ">", "value": 2020}', encoding="utf-8")
    code, out, _ = _run(
        capsys, "search", "--model", model, "--store", stores[0], "--json", "--filter-json", f"@{path}", "x"
    )
    assert code == 0 and {h["id"] for h in json.loads(out)["hits"]} == {"b", "c"}


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--filter", "a.=x"], "error: invalid filter field 'meta.a.'"),
        (["--filter", ".=x"], "error: invalid filter field 'meta..'"),
        (["--filter", "s=高血压", "--filter", "s=fever"], "error: --filter s='高血压' and s='fever': a field cannot"),
        (["--filter", "year>=a,b"], "error: --filter 'year>=a,b': >= takes one value"),
        (["--filter", "year>abc"], "error: filter 'meta.year': '>' compares numbers or ISO 8601 dates"),
        (["--filter", "year"], "error: --filter 'year': expected FIELD OP VALUE"),
        (["--filter-json", "{bad"], "error: --filter-json: not JSON"),
        (["--filter-json", '{"operator": "XOR", "conditions": []}'], "error: unknown logical operator 'XOR'"),
    ],
)
def test_a_bad_filter_is_one_line_and_exit_2(capsys, filter_stores, flags, message) -> None:
    model, stores = filter_stores
    for store in stores:
        code, out, err = _run(capsys, "search", "--model", model, "--store", store, *flags, "血压")
        assert (code, out) == (2, "")
        assert err.startswith(message) and err.count("\n") == 1, err
