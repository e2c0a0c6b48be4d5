"""experiments/foundation_scaling.py: its one-stage recipes are the ablation recipe's Stage 0, and its table's gains."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from care_retriever.training.recipe import load_recipe, parse_recipe
from experiments import document_scaling, foundation_scaling


@pytest.fixture(scope="module")
def scaling() -> ModuleType:
    return foundation_scaling


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


@pytest.fixture(scope="module")
def curve() -> ModuleType:
    return document_scaling


def test_a_curve_point_is_the_foundations_causal_lm_stage_at_its_depth_and_epochs(curve) -> None:
    foundation = load_recipe("miniature-foundation")
    (expected,) = [s for s in foundation.stages if s.name == curve.CLM_STAGE]
    point = parse_recipe(curve.pretraining_recipe(2, 0.5))
    (stage,) = point.stages
    assert stage.args == {**expected.args, "num_train_epochs": 0.5}
    assert (stage.name, stage.type, stage.datasets) == (expected.name, expected.type, expected.datasets)
    assert point.model.document_config == {"num_hidden_layers": 2}
    assert point.model.query_config is None
    assert (point.model.preset, point.model.vocab_from) == (foundation.model.preset, foundation.model.vocab_from)
    assert point.datasets == foundation.datasets and point.seed == foundation.seed


def test_the_curve_fits_avg_on_log_compute_and_extrapolates_the_target(curve) -> None:
    def row(layers: int, tokens: float, avg: float, seconds: float | None = None) -> dict:
        scores = {"kuake-qtr-retrieval": avg, "kuake-qtr-rerank": avg}
        return {"layers": layers, "epochs": 1.0, "parameters": 1e6, "tokens": tokens, "pretraining_seconds": seconds,
                "model": "m", "source": "s", "scores": scores}  # fmt: skip

    # Avg = 0.1 + 0.05 log10(compute) exactly: compute 1e12 -> 0.70, 1e13 -> 0.75, 1e14 -> 0.80
    rows = [row(1, 0, 0.6), row(1, 1e6, 0.70, 100.0), row(2, 1e7, 0.75, 1000.0), row(2, 1e8, 0.80)]
    a, b = curve.log_fit(rows)
    assert a == pytest.approx(0.1) and b == pytest.approx(0.05)
    small = {"scores": {"kuake-qtr-retrieval": 0.82, "kuake-qtr-rerank": 0.82}}
    text = curve.render(rows, {curve.SMALL_SYMMETRIC: small}, "curve.png")
    assert "= 0.8500." in text  # the target: small-symmetric + 0.03
    assert "Avg = 0.1000 + 0.0500 x log10(compute), i.e. +0.0500 Avg per 10x compute" in text
    # target 0.85 -> compute 10^15, 10x the largest point; 1e-10 s per unit of compute -> ~28 hours
    assert "the target needs ~1.0e+15 compute, 10x the largest point, ~28 hours" in text
    assert "| 2 | 1.00M | 1 | 100.00M | 1.00e+14 |  | 0.8000 | 0.8000 | 0.8000 | s |" in text
    assert curve.log_fit(rows[:3]) is None  # two pretrained points: no fit


@pytest.mark.parametrize("bad", ["2", "x:1", "0:1", "2:0"])
def test_a_bad_curve_point_is_a_one_line_error(curve, bad: str) -> None:
    import argparse

    with pytest.raises(argparse.ArgumentTypeError, match="point"):
        curve.parse_point(bad)


def test_the_curves_foundation_point_is_seed_0s_large_symmetric_with_the_foundations_figures(curve) -> None:
    point = curve.foundation_point(curve.FOUNDATION_JSON, curve.MINIATURE_JSON)
    assert point is not None, "benchmarks/results/foundation_scaling.json and miniature.json are published files"
    assert point["scores"] == curve.seed0_scores(curve.MINIATURE_JSON, "large-symmetric")
    assert (point["layers"], point["epochs"]) == (6, 2.5)
    assert point["tokens"] > 0 and point["parameters"] > 10e6


def test_a_random_towers_shape_reaches_its_stage0_recipe(scaling) -> None:
    recipe = parse_recipe(scaling.one_stage_recipe("query", None, {"num_hidden_layers": 6}))
    assert recipe.model.query_config == {"num_hidden_layers": 6} and recipe.model.document_config is None
    assert parse_recipe(scaling.one_stage_recipe("query", None)).model.query_config is None


def test_the_stage0_data_table_states_each_towers_gain_over_the_recipes_size(curve) -> None:
    def scores(value: float) -> dict:
        return {"kuake-qtr-retrieval": value, "kuake-qtr-rerank": value}

    data_rows = [{"label": "decoder, 6 layers, 0.75 epochs", "examples": 18000, "scores": scores(0.72),
                  "baseline": scores(0.70)}]  # fmt: skip
    text = curve.render([], {}, None, data_rows)
    assert "more examples than the recipe's 6,000" in text
    assert "| decoder, 6 layers, 0.75 epochs | 18,000 | 0.7200 | 0.7200 | 0.7200 | 0.7000 | +0.0200 |" in text


def test_a_flat_curve_says_compute_does_not_measurably_raise_avg(curve) -> None:
    def row(tokens: float, avg: float) -> dict:
        scores = {"kuake-qtr-retrieval": avg, "kuake-qtr-rerank": avg}
        return {"layers": 6, "epochs": 1.0, "parameters": 1e6, "tokens": tokens, "pretraining_seconds": 10.0,
                "model": "m", "source": "s", "scores": scores}  # fmt: skip

    rows = [row(1e6, 0.700), row(1e7, 0.702), row(1e8, 0.704)]  # +0.002 per 10x
    text = curve.render(rows, {curve.SMALL_SYMMETRIC: {"scores": rows[0]["scores"]}}, None)
    assert "The slope (+0.0020 per 10x compute) is below the seed-to-seed spread" in text
    assert "the target needs ~1.0e+27 compute, 1.0e+13x the largest point" in text


def test_the_random_weight_rows_are_read_as_size_and_architecture_statements(curve) -> None:
    def scored(avg: float, **row) -> dict:
        return {**row, "scores": {"kuake-qtr-retrieval": avg, "kuake-qtr-rerank": avg}}

    references = {curve.SMALL_BERT: scored(0.73), f"{curve.LARGE_BERT_LABEL} (11.7M), random weights": scored(0.71)}
    rows = [scored(0.66, tokens=0), scored(0.70, tokens=1e6)]
    lines = curve.size_statements(rows, references)
    assert lines[0].startswith("- Size alone, no pretraining: a BERT at the decoder's size scores 0.7100 against")
    assert "0.7300 (-0.0200)" in lines[0]
    assert "Decoder against BERT at the same size, no pretraining: 0.6600 against 0.7100 (-0.0500)" in lines[1]
