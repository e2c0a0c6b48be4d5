"""Typed training configuration: per-stage-type keys, recipes left untouched by a run, pretraining
checkpoints tagged with the recipe fingerprint, the ``foundation`` model key and ``--seeds``."""

from __future__ import annotations

import copy
import json
import re
import shutil
from pathlib import Path

import pytest

from care_retriever.errors import InputError
from tests.support.data import write_jsonl

pytestmark = pytest.mark.usefixtures("one_thread")


def pretraining_recipe(learning_rate: float = 5e-3) -> dict:
    return {
        "name": "lm",
        "model": {"preset": "tiny", "vocab_from": ["pairs.jsonl"], "max_length": 32},
        "datasets": {"pairs": {"path": "pairs.jsonl"}},
        "defaults": {
            "per_device_train_batch_size": 8,
            "learning_rate": learning_rate,
            "num_train_epochs": 2,
            "logging_steps": 1,
            "save_steps": 2,
            "save_total_limit": 5,
        },
        "stages": [
            {"name": "mlm", "type": "mlm", "datasets": ["pairs"]},
            {"name": "clm", "type": "clm", "datasets": ["pairs"]},
        ],
    }


def run(raw: dict, out: Path, condition_pairs_dir: Path, **kwargs):
    from care_retriever.training.recipe import parse_recipe
    from care_retriever.training.runner import run_recipe

    kwargs.setdefault("keep_stages", True)  # the tests read the stages' models and checkpoints
    return run_recipe(parse_recipe(raw), out, condition_pairs_dir, show_progress=False, **kwargs)


# ------------------------------------------------------------------ keys a stage type does not take
@pytest.mark.parametrize(
    ("stage", "needle"),
    [
        (
            {"name": "s0", "type": "stage0_query", "datasets": ["pairs"], "lora": False},
            "stage 's0': a stage0_query stage does not take 'lora'; valid keys: args, datasets, export, from, "
            "gather_across_devices, length_buckets, max_examples, mini_batch_size, name, temperature, type",
        ),
        (
            {"name": "m", "type": "mlm", "datasets": ["pairs"], "mlm_probabilty": 0.3},
            "a mlm stage does not take 'mlm_probabilty'; valid keys: args, datasets, export, from, max_examples, "
            "mlm_probability, name, type",
        ),
        (
            {"name": "d", "type": "distill", "datasets": ["pairs"], "lambda1": 2.0},
            "a distill stage does not take 'lambda1'",
        ),
    ],
)
def test_a_key_the_stage_type_does_not_take_is_a_one_line_error(stage: dict, needle: str) -> None:
    from care_retriever.training.recipe import parse_recipe

    raw = {"name": "r", "model": {"preset": "tiny"}, "datasets": {"pairs": "pairs.jsonl"}, "stages": [stage]}
    with pytest.raises(InputError) as info:
        parse_recipe(raw)
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


def test_each_stage_type_gets_its_typed_class() -> None:
    from care_retriever.training.recipe import load_recipe
    from care_retriever.training.recipe_spec import STAGE_CLASSES

    recipe = load_recipe("miniature-ablations")
    for stage in recipe.stages:
        assert type(stage) is STAGE_CLASSES[stage.type]
    stage1 = recipe.stage("stage1")
    assert stage1.alignment == {"queries": ["qtr", "qqr", "sts", "imqa", "pretrain"], "documents": ["qtr", "imqa"]}
    assert stage1.max_document_texts == 8000 and stage1.max_query_texts is None
    assert stage1.lambda1 == 1.0 and stage1.teacher == "cached"
    assert recipe.stage("stage2").hard_negatives["range_min"] == 5


def test_a_run_does_not_change_the_callers_recipe(condition_pairs_dir: Path, tmp_path: Path) -> None:
    from care_retriever.training.recipe import parse_recipe
    from care_retriever.training.runner import run_recipe

    raw = pretraining_recipe()
    raw["model"]["max_length"] = 100
    recipe = parse_recipe(raw)
    before = copy.deepcopy(recipe)
    run_recipe(recipe, tmp_path / "out", condition_pairs_dir, dry_run_steps=1, show_progress=False)
    assert recipe == before
    assert recipe.model.max_length == 100  # the dry run trained at 64 on a copy
    run_recipe(recipe, tmp_path / "preset", condition_pairs_dir, dry_run_steps=1, preset="mini", show_progress=False)
    assert recipe == before and recipe.model.preset == "tiny"


# ------------------------------------------------------------------ clm / mlm checkpoints and the fingerprint
@pytest.fixture(scope="module")
def pretrained(condition_pairs_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    return run(pretraining_recipe(), tmp_path_factory.mktemp("lm") / "out", condition_pairs_dir)


def interrupt(out: Path, stage: str) -> None:
    """Make ``out`` look like a run killed inside ``stage`` (after its checkpoints)."""
    state = json.loads((out / "run.json").read_text())
    order = state["done"]
    gone = order[order.index(stage) :]
    state["done"] = [s for s in order if s not in gone]
    state["reports"] = [r for r in state["reports"] if r["name"] not in gone]
    state.pop("final", None)
    (out / "run.json").write_text(json.dumps(state))
    for name in gone:
        shutil.rmtree(out / "stages" / name)
    shutil.rmtree(out / "final")


@pytest.mark.parametrize("stage", ["mlm", "clm"])
def test_pretraining_checkpoints_carry_the_fingerprint_and_another_recipe_is_refused(
    stage: str, pretrained, condition_pairs_dir: Path, tmp_path: Path
) -> None:
    from care_retriever.training.engine import RUN_FILE

    fingerprint = json.loads((pretrained.out / "run.json").read_text())["fingerprint"]
    checkpoints = sorted((pretrained.out / "checkpoints" / stage).glob("checkpoint-*"))
    assert checkpoints
    for folder in checkpoints:
        assert json.loads((folder / RUN_FILE).read_text())["fingerprint"] == fingerprint

    # The same recipe continues from its checkpoint ...
    own = tmp_path / "own"
    shutil.copytree(pretrained.out, own)
    interrupt(own, stage)
    resumed = run(pretraining_recipe(), own, condition_pairs_dir, resume=True)
    assert (own / "final" / "care_config.json").is_file()
    assert {r["name"] for r in resumed.reports} == {"mlm", "clm"}

    # ... another recipe's run, handed this recipe's checkpoint, refuses it.
    other = tmp_path / "other"
    run(pretraining_recipe(learning_rate=1e-3), other, condition_pairs_dir)
    interrupt(other, stage)
    shutil.rmtree(other / "checkpoints" / stage)
    shutil.copytree(pretrained.out / "checkpoints" / stage, other / "checkpoints" / stage)
    with pytest.raises(InputError, match="checkpoint of another recipe"):
        run(pretraining_recipe(learning_rate=1e-3), other, condition_pairs_dir, resume=True)


def test_pretraining_reports_each_towers_compute(pretrained, condition_pairs_dir: Path) -> None:
    from care_retriever.model.embedder import AsymmetricEmbedder
    from care_retriever.training.pretraining import compute_ratio

    reports = {r["name"]: r for r in pretrained.reports}
    assert reports["mlm"]["tower"] == "query" and reports["clm"]["tower"] == "document"
    rows = [json.loads(line) for line in (condition_pairs_dir / "pairs.jsonl").read_text("utf-8").splitlines()]
    texts = sorted({r["query"] for r in rows} | {r["text"] for r in rows})
    init = AsymmetricEmbedder.from_pretrained(pretrained.out / "stages" / "init")
    for name, modules in (("mlm", init.query_modules), ("clm", init.document_modules)):
        tower = modules[0]
        per_epoch = sum(len(ids) for ids in tower.tokenizer(texts, truncation=True, max_length=32)["input_ids"])
        assert reports[name]["tokens"] == 2 * per_epoch  # two epochs of every text
        assert reports[name]["tower_parameters"] == sum(p.numel() for p in tower.auto_model.parameters())
        assert reports[name]["compute"] == reports[name]["tower_parameters"] * reports[name]["tokens"]
    expected = reports["clm"]["compute"] / reports["mlm"]["compute"]
    assert compute_ratio(pretrained.reports) == pytest.approx(expected)


# ------------------------------------------------------------------ model: {foundation: DIR}
def test_a_recipe_starts_from_a_foundation_run(pretrained, condition_pairs_dir: Path, tmp_path: Path) -> None:
    import torch

    from care_retriever.model.embedder import AsymmetricEmbedder

    raw = {
        "name": "on-foundation",
        "model": {"foundation": str(pretrained.out), "max_length": 32},
        "datasets": {"pairs": {"path": "pairs.jsonl"}},
        "stages": [{"name": "s0", "type": "stage0_query", "datasets": ["pairs"]}],
    }
    result = run(raw, tmp_path / "out", condition_pairs_dir, dry_run_steps=1)
    init = AsymmetricEmbedder.from_pretrained(result.out / "stages" / "init")
    foundation = AsymmetricEmbedder.from_pretrained(pretrained.final)
    for side in ("query_modules", "document_modules"):
        a = getattr(init, side)[0].auto_model.state_dict()
        b = getattr(foundation, side)[0].auto_model.state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a)
    state = json.loads((result.out / "run.json").read_text())
    assert state["foundation"] == str(pretrained.final)


def test_an_unfinished_foundation_is_a_one_line_error(pretrained, condition_pairs_dir: Path, tmp_path: Path) -> None:
    unfinished = tmp_path / "foundation"
    shutil.copytree(pretrained.out, unfinished)
    shutil.rmtree(unfinished / "final")
    raw = {
        "name": "on-foundation",
        "model": {"foundation": str(unfinished)},
        "datasets": {"pairs": {"path": "pairs.jsonl"}},
        "stages": [{"name": "s0", "type": "stage0_query", "datasets": ["pairs"]}],
    }
    with pytest.raises(InputError, match=r"no finished foundation model there .*--resume"):
        run(raw, tmp_path / "out", condition_pairs_dir, dry_run_steps=1)
    assert not (tmp_path / "out").exists()


def test_seeds_train_one_run_per_seed(condition_pairs_dir: Path, tmp_path: Path, capsys) -> None:
    import yaml

    from care_retriever.cli.main import main

    raw = pretraining_recipe()
    raw["seed"] = 3
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")
    out = tmp_path / "runs"
    args = ["train", "--recipe", str(recipe), "--out", str(out), "--data-dir", str(condition_pairs_dir)]
    code = main([*args, "--dry-run-steps", "1", "--seeds", "2", "--no-progress"])
    printed = capsys.readouterr().out
    assert code == 0
    states = [json.loads((out / f"seed-{s}" / "run.json").read_text()) for s in (3, 4)]
    assert states[0]["fingerprint"] != states[1]["fingerprint"]
    assert [state["seed"] for state in states] == [3, 4]  # the report reads each run's own seed
    assert "pretraining compute, document / query tower:" in printed


def test_selected_stages_train_first_and_a_resume_trains_the_rest(
    condition_pairs_dir: Path, tmp_path: Path, capsys
) -> None:
    """``--stage X`` trains X and the stages it starts from, nothing else, and publishes no final model
    until the final stage is trained; a later ``--resume`` without a selection trains only the rest."""
    import yaml

    from care_retriever.cli.main import main

    raw = pretraining_recipe()
    raw["stages"].append({"name": "mlm-again", "from": "mlm", "type": "mlm", "datasets": ["pairs"]})
    raw["final"] = "clm"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")
    out = tmp_path / "run"
    args = [
        "train",
        "--recipe",
        str(recipe),
        "--out",
        str(out),
        "--data-dir",
        str(condition_pairs_dir),
        "--dry-run-steps",
        "1",
    ]

    assert main([*args, "--stage", "nope", "--no-progress"]) != 0
    assert "No stage 'nope' in recipe 'lm'. Available stages: ['mlm', 'clm', 'mlm-again']" in capsys.readouterr().err
    assert not out.exists()

    assert main([*args, "--stage", "mlm-again", "--no-progress"]) == 0
    assert "final model: not yet" in capsys.readouterr().out
    state = json.loads((out / "run.json").read_text())
    assert state["done"] == ["init", "mlm", "mlm-again"] and not (out / "final").exists()
    mlm_log = (out / "logs" / "mlm.jsonl").read_text()

    assert main([*args, "--resume", "--no-progress"]) == 0
    state = json.loads((out / "run.json").read_text())
    assert state["done"] == ["init", "mlm", "mlm-again", "clm"]
    assert (out / "logs" / "mlm.jsonl").read_text() == mlm_log  # trained once
    assert (out / "final" / "care_config.json").is_file()


@pytest.mark.parametrize("value", [[64, 32], [0], [], "64", [64, 64], [True]])
def test_length_buckets_must_be_increasing_positive_integers(value) -> None:
    from care_retriever.training.recipe import parse_recipe

    stage = {"name": "s0", "type": "stage0_query", "datasets": ["pairs"], "length_buckets": value}
    for raw in (
        {"name": "r", "model": {"preset": "tiny"}, "datasets": {"pairs": "pairs.jsonl"}, "stages": [stage]},
        {
            "name": "r",
            "model": {"preset": "tiny"},
            "datasets": {"pairs": "pairs.jsonl"},
            "defaults": {"length_buckets": value},
            "stages": [{k: v for k, v in stage.items() if k != "length_buckets"}],
        },
    ):
        with pytest.raises(InputError, match="length_buckets must be increasing positive integers"):
            parse_recipe(raw)


def test_length_buckets_split_each_data_set_by_its_rows_longest_text() -> None:
    """Every row lands in exactly one bucket, chosen by its longest text; per-data-set prompts follow the
    buckets of their data set; the non-text label column does not count."""
    from datasets import Dataset, DatasetDict

    from care_retriever.training.engine import bucket_by_length

    queries = Dataset.from_dict({"text": ["短", "a" * 10, "b" * 70], "label": [0, 1, 2]})
    documents = Dataset.from_dict({"anchor": ["q1", "q2", "q3"], "positive": ["x" * 5, "y" * 64, "z" * 63]})
    data, prompts, sizes = bucket_by_length(
        DatasetDict({"queries": queries, "documents": documents}), {"queries": {"text": "查询："}}, [8, 64]
    )
    assert sizes == {"queries@0-7": 1, "queries@8-63": 1, "queries@64+": 1, "documents@0-7": 1,
                     "documents@8-63": 1, "documents@64+": 1}  # fmt: skip
    assert data["queries@64+"]["label"] == [2] and data["documents@8-63"]["positive"] == ["z" * 63]
    assert prompts == {name: {"text": "查询："} for name in ("queries@0-7", "queries@8-63", "queries@64+")}
    # one data set, a prompt for every data set: the prompts stay as they are; empty buckets are left out
    single, same, sizes = bucket_by_length(documents, {"anchor": "查询："}, [1000])
    assert list(single) == ["train@0-999"] and same == {"anchor": "查询："} and sizes == {"train@0-999": 3}


@pytest.mark.parametrize("fmt", ["pairs", "text", "alignment"])
def test_max_rows_caps_every_data_set_format(fmt: str, tmp_path: Path) -> None:
    """``max_rows`` keeps a data set's first N rows whatever its format (pairs, unlabelled texts, and
    each side of an alignment file)."""
    from care_retriever.training.pairs import load_pairset
    from care_retriever.training.recipe_spec import DatasetSpec

    rows = [{"query": f"问题{i}", "text": f"回答{i}", "side": "query" if i % 2 else "document"} for i in range(10)]
    write_jsonl(tmp_path / "rows.jsonl", rows)
    spec = DatasetSpec(name="rows", path="rows.jsonl", format=fmt, max_rows=3)
    pairs = load_pairset(spec, tmp_path)
    if fmt == "pairs":
        assert [e.query for e in pairs.examples] == ["问题0", "问题1", "问题2"]
    elif fmt == "text":
        assert len(pairs.extra_queries) == 3 and pairs.extra_queries == pairs.extra_documents
    else:
        assert pairs.extra_queries == ["回答1", "回答3", "回答5"]
        assert pairs.extra_documents == ["回答0", "回答2", "回答4"]


def test_a_presets_architecture_is_overridden_per_tower(condition_pairs_dir: Path) -> None:
    from care_retriever.training.lora import transformer_of
    from care_retriever.training.models import initial_model
    from care_retriever.training.recipe import parse_recipe

    raw = pretraining_recipe()
    raw["model"] = {**raw["model"], "document_config": {"num_hidden_layers": 1}, "query_config": {"hidden_size": 16}}
    recipe = parse_recipe(raw)
    embedder = initial_model(recipe.model, recipe, condition_pairs_dir, seed=0, device="cpu")
    document = transformer_of(embedder.document_modules).auto_model.config
    query = transformer_of(embedder.query_modules).auto_model.config
    # tiny: a 2-layer decoder, a 32-wide BERT; the keys not overridden keep the preset's values
    assert (document.num_hidden_layers, document.hidden_size) == (1, 48)
    assert (query.hidden_size, query.num_hidden_layers) == (16, 2)
    assert embedder.config.document.base_model == 'random:tiny{"num_hidden_layers": 1}'
    assert embedder.config.query.base_model == 'random:tiny{"hidden_size": 16}'


@pytest.mark.parametrize(
    ("model", "needle"),
    [
        ({"preset": "tiny", "document_config": {"num_layers": 1}}, "Qwen3Config has no key(s) ['num_layers']"),
        ({"preset": "tiny", "query_config": {"layers": 1}}, "BertConfig has no key(s) ['layers']"),
        ({"path": "models/x", "document_config": {"num_hidden_layers": 1}}, "give model.preset"),
    ],
)
def test_an_architecture_override_that_would_be_ignored_is_an_error(model: dict, needle: str) -> None:
    from care_retriever.training.recipe import parse_recipe

    raw = {"name": "r", "model": model, "datasets": {"pairs": "pairs.jsonl"}, "stages": [{"name": "c", "type": "clm"}]}
    with pytest.raises(InputError, match=re.escape(needle)):
        parse_recipe(raw)
