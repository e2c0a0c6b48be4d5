"""Bad training input gives one-line errors (exit 2, no traceback) and leaves nothing behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from care_retriever.cli.main import main
from tests.support.data import write_jsonl

RECIPE = """
name: {name}
model: {{preset: tiny, vocab_from: [pairs.jsonl], max_length: 16{extra_model}}}
datasets:
  pairs: {{path: {data}, format: {fmt}}}
defaults: {{per_device_train_batch_size: 4, logging_steps: 1}}
stages:
  - {{name: s0, type: stage0_query, datasets: [pairs]}}
"""
PAIRS = [{"query": f"问题{i}", "text": f"回答{i}：多喝水，注意休息。"} for i in range(8)]


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "data"
    folder.mkdir()
    write_jsonl(folder / "pairs.jsonl", PAIRS)
    return folder


def recipe(
    folder: Path,
    *,
    name: str = "r",
    data: str = "pairs.jsonl",
    fmt: str = "pairs",
    extra_model: str = "",
    text: str | None = None,
) -> Path:
    path = folder / f"{name}.yaml"
    body = text if text is not None else RECIPE.format(name=name, data=data, fmt=fmt, extra_model=extra_model)
    path.write_text(body, encoding="utf-8")
    return path


def train(capsys: pytest.CaptureFixture[str], recipe_path: Path, out: Path, data_dir: Path, *extra: str):
    code = main(
        ["train", "--recipe", str(recipe_path), "--out", str(out), "--data-dir", str(data_dir), "--no-progress", *extra]
    )
    captured = capsys.readouterr()
    return code, captured.err.strip()


def assert_one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.mark.parametrize(
    ("rows", "needles"),
    [
        ([], ("bad.jsonl", "empty file")),
        ([{"query": "发烧怎么办"}], ("bad.jsonl:1", "no positive")),
        ([{"query": "  ", "text": "多喝水"}], ("bad.jsonl:1", "empty 'query'")),
        ([*PAIRS[:2], {"query": "咳嗽", "text": ""}], ("bad.jsonl:3", "empty 'text'")),
        ([{"query": "咳嗽", "positive": ["止咳", 3]}], ("bad.jsonl:1", "positive")),
    ],
    ids=["empty-file", "no-positive", "empty-query", "empty-text", "non-string-positive"],
)
def test_bad_training_rows(tmp_path, data_dir, capsys, rows, needles) -> None:
    write_jsonl(data_dir / "bad.jsonl", rows)
    out = tmp_path / "out"
    code, err = train(capsys, recipe(tmp_path, data="bad.jsonl"), out, data_dir)
    assert_one_line_error(code, err, *needles)
    assert not out.exists()  # validated before anything is written


def test_labelled_file_without_any_positive(tmp_path, data_dir, capsys) -> None:
    write_jsonl(data_dir / "qtr.jsonl", [{"query": "头痛", "text": "偏头痛的原因", "label": 1}])
    code, err = train(capsys, recipe(tmp_path, data="qtr.jsonl", fmt="qtr"), tmp_path / "out", data_dir)
    assert_one_line_error(code, err, "no positive pairs with label >= 2")


def test_missing_training_file(tmp_path, data_dir, capsys) -> None:
    code, err = train(capsys, recipe(tmp_path, data="nope.jsonl"), tmp_path / "out", data_dir)
    assert_one_line_error(code, err, "training file not found", "nope.jsonl")


def test_dim_mismatch_between_recipe_and_model(tmp_path, data_dir, capsys) -> None:
    out = tmp_path / "out"
    code, err = train(capsys, recipe(tmp_path, extra_model=", dim: 768"), out, data_dir)
    assert_one_line_error(code, err, "dimension mismatch", "768", "32")
    assert not out.exists()


def test_matryoshka_dims_must_include_the_query_dim(tmp_path, data_dir, capsys) -> None:
    text = RECIPE.format(name="m", data="pairs.jsonl", fmt="pairs", extra_model="").replace(
        "  - {name: s0, type: stage0_query, datasets: [pairs]}",
        "  - {name: s0, type: stage0_document, datasets: [pairs], matryoshka_dims: [48, 24]}",
    )
    out = tmp_path / "out"
    code, err = train(capsys, recipe(tmp_path, name="m", text=text), out, data_dir)
    assert_one_line_error(code, err, "dimension mismatch", "[48, 24]", "dim 32")
    assert not out.exists()


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("name: x\nmodel: {preset: tiny}\nstages: []\n", "'stages' must be a non-empty list"),
        ("name: x\nmodel: {preset: huge}\nstages: [{name: a, type: stage0_query, datasets: [d]}]\n", "huge"),
        (
            RECIPE.format(name="x", data="pairs.jsonl", fmt="pairs", extra_model="").replace("stage0_query", "stage9"),
            "type 'stage9' unknown",
        ),
        (
            RECIPE.format(name="x", data="pairs.jsonl", fmt="pairs", extra_model="").replace("[pairs]}", "[other]}"),
            "dataset 'other' is not defined",
        ),
        (
            RECIPE.format(name="x", data="pairs.jsonl", fmt="pairs", extra_model="").replace(
                "logging_steps: 1", "logging_stepz: 1"
            ),
            "unknown training argument(s) ['logging_stepz']",
        ),
        ("name: x\n  bad: [\n", "invalid YAML"),
        (
            RECIPE.format(name="x", data="pairs.jsonl", fmt="pairs", extra_model=", document_pooling: max"),
            "model.document_pooling 'max' unknown; available: ['cls', 'last_token', 'mean']",
        ),
        (
            # the process group is created once per run: a stage's own timeout would be silently ignored
            RECIPE.format(name="x", data="pairs.jsonl", fmt="pairs", extra_model="").replace(
                "datasets: [pairs]}", "datasets: [pairs], args: {ddp_timeout: 60}}"
            ),
            "ddp_timeout is set once per run; set it in defaults",
        ),
        (
            RECIPE.format(name="x", data="pairs.jsonl", fmt="pairs", extra_model="").replace(
                "logging_steps: 1", "logging_steps: 1, ddp_timeout: 0"
            ),
            "defaults.ddp_timeout must be a positive number of seconds, got 0",
        ),
    ],
    ids=[
        "no-stages",
        "unknown-preset",
        "unknown-stage-type",
        "undefined-dataset",
        "unknown-argument",
        "yaml",
        "unknown-pooling",
        "stage-ddp-timeout",
        "bad-ddp-timeout",
    ],
)
def test_bad_recipes(tmp_path, data_dir, capsys, text, needle) -> None:
    code, err = train(capsys, recipe(tmp_path, name="x", text=text), tmp_path / "out", data_dir)
    assert_one_line_error(code, err, needle)


def test_resume_from_another_recipe_is_refused_and_nothing_is_overwritten(tmp_path, data_dir, capsys) -> None:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = tmp_path / "out"
        first = recipe(tmp_path, name="first")
        code, err = train(capsys, first, out, data_dir, "--dry-run-steps", "1")
        assert code == 0, err
        snapshot = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
        other = recipe(tmp_path, name="second")
        code, err = train(capsys, other, out, data_dir, "--resume")
        assert_one_line_error(code, err, "holds a run of recipe 'first'", "use a new --out")
        # the same recipe without --resume is refused too
        code, err = train(capsys, first, out, data_dir, "--dry-run-steps", "1")
        assert_one_line_error(code, err, "--resume")
        # a folder that is not a training run is never used
        stranger = tmp_path / "stranger"
        stranger.mkdir()
        (stranger / "notes.txt").write_text("keep me")
        code, err = train(capsys, first, stranger, data_dir)
        assert_one_line_error(code, err, "holds no training run")
        assert (stranger / "notes.txt").read_text() == "keep me"
        assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == snapshot
    finally:
        torch.set_num_threads(threads)


def test_checkpoint_of_another_recipe_is_refused(tmp_path) -> None:
    """The trainer itself refuses a checkpoint whose fingerprint is not this run's."""
    from care_retriever.errors import InputError
    from care_retriever.training.engine import RUN_FILE, STATE_FILE, CareTrainer

    folder = tmp_path / "checkpoint-3"
    folder.mkdir()
    (folder / STATE_FILE).write_bytes(b"")
    (folder / RUN_FILE).write_text(json.dumps({"fingerprint": "aaaa"}))
    trainer = CareTrainer.__new__(CareTrainer)
    trainer.care_fingerprint = "bbbb"
    with pytest.raises(InputError, match="checkpoint of another recipe"):
        trainer._load_from_checkpoint(str(folder))  # transformers' resume hook, which CareTrainer overrides
