"""benchmarks/foundation_scaling.py: its one-stage recipes are the ablation recipe's Stage 0, and its table's gains."""

from __future__ import annotations

from pathlib import Path

import pytest

from care_retriever.training.recipe import load_recipe, parse_recipe
from tests.conftest import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "foundation_scaling.py"


@pytest.fixture(scope="module")
def scaling():
    return load_script(SCRIPT)


@pytest.mark.parametrize("tower", ["query", "document"])
def test_one_stage_recipe_is_the_ablation_stage(scaling, tower: str, tmp_path: Path) -> None:
    ablations = load_recipe("miniature-ablations")
    stage_name = scaling.TOWERS[tower][0]
    (expected,) = [s for s in ablations.stages if s.name == stage_name]

    random_start = parse_recipe(scaling.one_stage_recipe(tower, None))
    assert [s.name for s in random_start.stages] == [stage_name]
    assert random_start.stages[0] == expected
    assert random_start.seed == ablations.seed and random_start.datasets == ablations.datasets
    assert random_start.model.preset == "mini" and random_start.model.foundation is None
    assert random_start.model.vocab_from == load_recipe("miniature-foundation").model.vocab_from
    assert random_start.model.max_length == ablations.model.max_length

    pretrained = parse_recipe(scaling.one_stage_recipe(tower, tmp_path))
    assert pretrained.model.foundation == str(tmp_path.resolve())
    assert pretrained.stages[0] == expected


def test_table_states_the_pretraining_gain(scaling) -> None:
    rows = [
        {"tower": "document", "start": "random", "parameters": 10e6, "tokens": 0,
         "scores": {"kuake-qtr-retrieval": 0.40, "kuake-qtr-rerank": 0.80}},
        {"tower": "document", "start": "foundation", "parameters": 10e6, "tokens": 2e6,
         "scores": {"kuake-qtr-retrieval": 0.50, "kuake-qtr-rerank": 0.84}},
    ]  # fmt: skip
    text = scaling.render(rows)
    assert "| document | foundation | 10.00M | 2.00M | 2.00e+13 | 0.5000 | 0.8400 | 0.6700 |" in text
    assert "- document tower: retrieval +0.1000, rerank +0.0400, Avg +0.0700" in text
