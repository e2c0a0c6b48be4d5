"""The bundled recipes parse, and the miniature recipes dry-run end to end on the shared data (tiny preset)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from care_retriever.cli.main import main

BUNDLED = ("quickstart", "miniature", "miniature-ablations", "paper")  # CARE recipes (foundation: its own test)


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_recipes_parse(name: str) -> None:
    from care_retriever.training.recipe import load_recipe

    recipe = load_recipe(name)
    assert recipe.name == name
    types = [s.type for s in recipe.stages]
    assert {"stage0_query", "stage0_document", "stage1_align", "stage2_joint"} <= set(types)


def test_paper_recipe_has_the_papers_hyper_parameters() -> None:
    from care_retriever.training.recipe import load_recipe

    recipe = load_recipe("paper")
    # gte-multilingual-base as transformers 5 reads it natively: no model code from the hub is run
    assert recipe.model.query_model == "alibaba-nlp-community/gte-multilingual-base"
    assert recipe.model.trust_remote_code is False
    assert recipe.model.document_model.startswith("Qwen/Qwen3-")
    # Qwen3 is pretrained in bf16: the recipe trains in bf16, never fp16
    assert recipe.defaults.get("bf16") is True and not recipe.defaults.get("fp16")
    assert recipe.defaults["learning_rate"] == 1e-4 and recipe.defaults["warmup_steps"] == 0.05
    assert recipe.defaults["lr_scheduler_type"] == "linear" and recipe.defaults["num_train_epochs"] == 1
    stages = {s.type: s for s in recipe.stages}
    for kind in ("stage0_document", "stage2_joint"):
        assert stages[kind].options["lora"] == {"r": 32, "alpha": 64, "dropout": 0.05}
    # global batches 640 / 2,560 / 640 on the 8 GPUs the recipe is written for
    assert [
        stages[k].args["per_device_train_batch_size"] * 8 for k in ("stage0_query", "stage1_align", "stage2_joint")
    ] == [
        640,
        2560,
        640,
    ]


def test_ablation_recipe_exports_the_tables_models() -> None:
    from care_retriever.training.recipe import load_recipe

    recipe = load_recipe("miniature-ablations")
    exports = {name for s in recipe.stages for name in s.export}
    assert exports == {
        "small-symmetric",
        "large-symmetric",
        "asymmetric-two-stage",
        "without-stage-i",
        "without-stage-ii",
        "score-distillation",  # the paper's Table 7 baseline
        "stage1-without-mse",  # Table 5's Stage I variants
        "stage1-without-contrastive",
        "stage1-on-finetuning-data",
    }
    assert recipe.stage("stage2-without-stage1").source == "stage0-document"
    assert recipe.stage("score-distillation").source == "stage0-document"


@pytest.mark.slow
@pytest.mark.shared_data
def test_miniature_ablations_dry_run_on_shared_data(shared_data: Path, tmp_path: Path, capsys) -> None:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = tmp_path / "ablations"
        code = main(
            [
                "train",
                "--recipe",
                "miniature-ablations",
                "--out",
                str(out),
                "--data-dir",
                str(shared_data),
                "--preset",
                "tiny",
                "--dry-run-steps",
                "1",
                "--no-progress",
            ]
        )
        captured = capsys.readouterr()
    finally:
        torch.set_num_threads(threads)
    assert code == 0, captured.err
    state = json.loads((out / "run.json").read_text())
    assert state["done"] == [
        "init",
        "stage0-query",
        "stage0-document",
        "stage1",
        "stage2",
        "stage2-without-stage1",
        "score-distillation",
        "stage1-without-mse",
        "stage1-without-contrastive",
        "stage1-on-finetuning-data",
    ]
    assert all(r["steps"] == 1 for r in state["reports"])
    models = ("small-symmetric", "large-symmetric", "asymmetric-two-stage", "without-stage-i", "without-stage-ii")
    for name in (*models, "score-distillation"):
        assert (out / "models" / name / "care_config.json").is_file(), name
    small = json.loads((out / "models" / "small-symmetric" / "care_config.json").read_text())
    assert small["mode"] == "symmetric"
    assert (out / "final" / "care_config.json").is_file()


def test_document_pooling_replaces_the_decoder_pooling_and_is_saved(tiny_model_dir: Path, tmp_path: Path) -> None:
    import numpy as np

    from care_retriever.model.embedder import AsymmetricEmbedder
    from care_retriever.model.towers.modules import tower_pooling
    from care_retriever.training.models import set_pooling

    embedder = AsymmetricEmbedder.from_pretrained(tiny_model_dir)
    assert tower_pooling(embedder.document_modules) == "last_token"
    query_pooling = tower_pooling(embedder.query_modules)
    texts = ["高血压患者应低盐饮食。", "糖尿病患者要控制主食的量，多吃蔬菜，按时监测血糖，遵医嘱用药。"]
    before = embedder.embed_documents(texts)

    pooled = set_pooling(embedder, "document", "mean")
    assert tower_pooling(pooled.document_modules) == "mean"
    assert tower_pooling(pooled.query_modules) == query_pooling
    after = pooled.embed_documents(texts)
    assert not np.allclose(before, after, atol=1e-4)  # another pooling, other vectors

    reloaded = AsymmetricEmbedder.from_pretrained(pooled.save_pretrained(tmp_path / "m"))
    assert reloaded.config.document.pooling == "mean"
    np.testing.assert_allclose(reloaded.embed_documents(texts), after, atol=1e-5)
