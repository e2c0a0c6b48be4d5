"""``format: flag``: FlagEmbedding's fine-tuning JSONL read into training examples, row by row.

Rows ``{query, pos: [...], neg: [...], prompt?, type?, pos_scores?, neg_scores?}`` (the CARE authors' released
data is in this format). Each test writes its own small files; the last one rewrites the shared KUAKE-QTR
training file in this format and checks it reads into the examples the ``qtr`` reader gives.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from care_retriever.errors import InputError
from care_retriever.model.config import CareConfig
from care_retriever.training.pairs import load_pairset, read_flag, read_pairs
from care_retriever.training.recipe import build_stage, parse_recipe
from care_retriever.training.recipe_spec import DatasetSpec
from care_retriever.training.row_prompts import check_row_prompts, row_prompted

RETRIEVAL = "Given a Chinese medical question, retrieve medical documents that answer the question."
STS = "Retrieve semantically similar text."
TEMPLATE = "<instruct>{instruction}\n<query>"


def write(path: Path, rows: list[object]) -> Path:
    lines = [row if isinstance(row, str) else json.dumps(row, ensure_ascii=False) for row in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def config(template: str | None) -> CareConfig:
    from care_retriever.model.config import TowerInfo

    default = RETRIEVAL if template and "{instruction}" in template else None
    return CareConfig(
        mode="asymmetric",
        dim=8,
        query=TowerInfo("cls", 8),
        document=TowerInfo("last_token", 16),
        query_prompt_template=template,
        default_instruction=default,
    )


def test_rows_become_one_example_per_positive_with_their_negatives(tmp_path: Path) -> None:
    negatives = [f"负例{i}" for i in range(15)]
    path = write(
        tmp_path / "retrieval.jsonl",
        [
            {"query": "高血压吃什么", "pos": ["低盐饮食", "按时服药"], "neg": [*negatives, "低盐饮食", "负例0"]},
            {"query": "感冒", "pos": ["多喝水"], "neg": [], "pos_id": "x1", "pos_scores": [1.0], "neg_scores": []},
        ],
    )
    examples, symmetric = read_flag(path)
    assert not symmetric
    assert [(e.query, e.positive) for e in examples] == [
        ("高血压吃什么", "低盐饮食"),
        ("高血压吃什么", "按时服药"),
        ("感冒", "多喝水"),
    ]
    # the row's negatives, de-duplicated and without its positives, in an order seeded by the line
    first = examples[0].negatives
    assert sorted(first) == sorted(negatives) and first != negatives
    assert examples[1].negatives == first and read_flag(path)[0][0].negatives == first  # reproducible
    assert examples[2].negatives == [] and examples[0].where == f"{path}:1"


def test_prompt_and_type_of_the_authors_sts_rows(tmp_path: Path) -> None:
    path = write(
        tmp_path / "sts.jsonl",
        [
            {
                "query": "荨麻疹如何治",
                "pos": ["瘾疹怎么治"],
                "neg": ["胃胀", "发烧"],
                "prompt": STS,
                "type": "symmetric_sts",
            }
        ],
    )
    spec = DatasetSpec(name="sts", path=str(path), format="flag")
    pairs = load_pairset(spec, tmp_path)
    assert pairs.symmetric and pairs.queries() == ["荨麻疹如何治", "瘾疹怎么治"] and pairs.documents() == []
    (example,) = pairs.examples
    assert example.instruction == STS and example.instruct_candidates
    # the row's prompt fills the model's template, before the query and (symmetric_sts) before every candidate
    (written,), anchor = row_prompted([example], config(TEMPLATE))
    prompt = f"<instruct>{STS}\n<query>"
    assert anchor == [] and written.query == prompt + "荨麻疹如何治" and written.positive == prompt + "瘾疹怎么治"
    assert sorted(written.negatives) == sorted(prompt + n for n in ("胃胀", "发烧"))
    # use_prompt: false drops it: the rows train under the model's own prompt, as rows of other formats do
    plain = load_pairset(DatasetSpec(name="sts", path=str(path), format="flag", use_prompt=False), tmp_path)
    assert plain.examples[0].instruction is None
    assert row_prompted(plain.examples, config(TEMPLATE)) == (plain.examples, ["anchor"])


def test_rows_without_a_prompt_get_the_models_default_instruction(tmp_path: Path) -> None:
    path = write(
        tmp_path / "mixed.jsonl",
        [
            {"query": "头痛", "pos": ["休息"], "neg": ["运动"], "prompt": "Find answers."},
            {"query": "咳嗽", "pos": ["止咳"], "neg": ["跑步"]},
        ],
    )
    examples, _ = read_flag(path)
    written, anchor = row_prompted(examples, config(TEMPLATE))
    assert anchor == []
    assert written[0].query == "<instruct>Find answers.\n<query>头痛" and written[0].positive == "休息"
    assert written[1].query == f"<instruct>{RETRIEVAL}\n<query>咳嗽"


def recipe(tmp_path: Path, stages: list[dict[str, object]]):
    return parse_recipe(
        {
            "model": {"path": "unused"},
            "datasets": {
                "flag": {"path": "flag.jsonl", "format": "flag"},
                "plain": {"path": "plain.jsonl", "format": "pairs"},
            },
            "stages": stages,
        },
        "recipe.yaml",
    )


def test_prompts_a_stage_or_the_model_cannot_apply_are_refused_naming_the_row(tmp_path: Path) -> None:
    path = write(
        tmp_path / "flag.jsonl",
        [
            {"query": "头痛", "pos": ["休息"], "neg": []},
            {"query": "咳嗽", "pos": ["止咳"], "neg": [], "prompt": "Find answers."},
        ],
    )
    examples, _ = read_flag(path)
    from care_retriever.training.pairs import PairSet

    def load(name: str) -> PairSet:
        return PairSet(name, examples)

    formats = {"flag": "flag", "plain": "pairs"}
    stage2 = recipe(tmp_path, [{"name": "s2", "type": "stage2_joint", "datasets": ["plain", "flag"]}]).stages
    check_row_prompts(stage2, formats, load, TEMPLATE)  # the template has the slot: honoured
    for template in (None, "query: "):  # a BERT tower without a prompt, a fixed prompt
        with pytest.raises(InputError) as refused:
            check_row_prompts(stage2, formats, load, template)
        message = str(refused.value)
        assert message.startswith(f"{path}:2: row has a 'prompt'") and "use_prompt: false" in message
        assert "\n" not in message
    stage1 = recipe(tmp_path, [{"name": "s1", "type": "stage1_align", "alignment": {"queries": ["flag"]}}]).stages
    with pytest.raises(InputError, match=rf"^{path}:2: row has a 'prompt', which stage 's1' \(stage1_align\)"):
        check_row_prompts(stage1, formats, load, TEMPLATE)
    assert not check_row_prompts(stage2, {"flag": "pairs"}, load, None)  # other formats carry no row prompts


BAD_ROWS = [
    ("{not json", "invalid JSON"),
    ({"pos": ["a"], "neg": []}, "missing field 'query'"),
    ({"query": "q", "pos": "a", "neg": []}, "'pos' must be a list of strings, got str"),
    ({"query": "q", "pos": [], "neg": []}, "row has no positive"),
    ({"query": "q", "pos": ["a"], "neg": ["b", 3]}, "'neg' holds a int, expected strings"),
    ({"query": "q", "pos": ["a"], "neg": [" "]}, "empty text in 'neg'"),
    ({"query": "q", "pos": ["a"], "neg": ["b"], "neg_scores": [1, 2]}, "'neg_scores' has 2 scores for 1 texts"),
    ({"query": "q", "pos": ["a"], "neg": [], "prompt": ""}, "empty 'prompt'"),
    ({"query": "q", "pos": ["a"], "neg": [], "batch_size": 8}, "'batch_size'"),
    ({"query": "q", "pos": ["a"], "neg": ["b"], "type": "only_1neg"}, "type 'only_1neg' is not supported"),
    ({"query": "q", "pos": ["a"], "neg": ["b"], "type": "symmetric_class"}, "type 'symmetric_class' is not supported"),
    ({"query": "q", "pos": ["a"], "neg": [], "type": "symetric_sts"}, "type 'symetric_sts' unknown"),
    ({"query": "q", "pos": ["a"], "neg": [], "type": "symmetric_sts"}, "differs from the file's first row (None)"),
]


@pytest.mark.parametrize(("row", "expected"), BAD_ROWS, ids=[e for _, e in BAD_ROWS])
def test_a_bad_row_is_one_line_naming_file_and_line(tmp_path: Path, row: object, expected: str) -> None:
    path = write(tmp_path / "bad.jsonl", [{"query": "好的", "pos": ["行"], "neg": []}, row])
    with pytest.raises(InputError) as error:
        read_flag(path)
    message = str(error.value)
    assert message.startswith(f"{path}:2: ") and expected in message and "\n" not in message


def test_flag_is_a_recipe_format_and_use_prompt_a_data_set_key() -> None:
    parsed = parse_recipe(
        {
            "model": {"path": "m"},
            "datasets": {"d": {"path": "d.jsonl", "format": "flag", "use_prompt": False}},
            "stages": [{"name": "s", "type": "stage2_joint", "datasets": ["d"]}],
        }
    )
    assert parsed.datasets["d"].format == "flag" and parsed.datasets["d"].use_prompt is False
    assert build_stage({"name": "s1", "type": "stage1_align", "datasets": ["d"]}, "w").mse_target == "renormalised"
    with pytest.raises(InputError, match="mse_target must be one of"):
        build_stage({"name": "s1", "type": "stage1_align", "datasets": ["d"], "mse_target": "full"}, "w")


@pytest.mark.shared_data
def test_the_shared_kuake_qtr_rows_read_the_same_as_flag_rows(shared_data: Path, tmp_path: Path) -> None:
    """The shared KUAKE-QTR training file rewritten as FlagEmbedding rows (positives label >= 2, negatives
    label 0, one row per query) reads into the examples the ``qtr`` reader gives, negatives as sets."""
    source = shared_data / "train" / "kuake-qtr-train.jsonl"
    expected = read_pairs(source, min_label=2, max_negative_label=0)
    rows: dict[str, dict[str, list[str]]] = {}
    for line in source.read_text("utf-8").splitlines():
        row = json.loads(line)
        label = row["label"]
        side = "pos" if label >= 2 else "neg" if label == 0 else None
        if side:
            rows.setdefault(row["query"], {"pos": [], "neg": []})[side].append(row["text"])
    flag = write(tmp_path / "qtr.jsonl", [{"query": q, **texts} for q, texts in rows.items() if texts["pos"]])
    examples, symmetric = read_flag(flag)
    assert not symmetric and len(examples) == len(expected) > 9_000
    key = sorted((e.query, e.positive, tuple(sorted(e.negatives))) for e in examples)
    assert key == sorted((e.query, e.positive, tuple(sorted(e.negatives))) for e in expected)
