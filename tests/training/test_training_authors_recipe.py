"""The ``authors`` recipe (the CARE authors' Stage I / Stage II script settings) dry-runs on CPU.

``training/recipes/authors.yaml`` itself, with only its towers pointed at the offline hub-format towers of
the ``paper`` recipe's test (``tests/support/hub_towers.py``: the GTE sentence-transformers folder, 768 wide, and a
Qwen3 causal-LM checkpoint, 1024 wide, so the document tower is sliced), trains two steps per stage on
small FlagEmbedding files this test writes in the authors' data layout (``stage1/``, ``stage2/``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file

from care_retriever.cli.main import main
from tests.support.authors_data import AUTHORS, RETRIEVAL, STS, authors_data
from tests.support.hub_towers import write_gte_sentence_transformer, write_qwen3_causal_lm

pytestmark = pytest.mark.slow  # end-to-end runs: scheduled first (tests/conftest.py)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def towers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("authors-towers")
    write_qwen3_causal_lm(root / "qwen3", hidden_size=1024, dtype=torch.bfloat16)
    write_gte_sentence_transformer(root / "gte", hidden_size=768)
    return root


def authors_recipe(target: Path, towers: Path, **model: object) -> Path:
    recipe = yaml.safe_load(AUTHORS.read_text("utf-8"))
    recipe["model"].update(query_model=str(towers / "gte"), document_model=str(towers / "qwen3"), **model)
    recipe["model"] = {k: v for k, v in recipe["model"].items() if v is not None}
    target.write_text(yaml.safe_dump(recipe, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return target


def train(recipe: Path, out: Path, data: Path, steps: int = 2) -> int:
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        args = ["train", "--recipe", str(recipe), "--out", str(out), "--data-dir", str(data), "--no-progress"]
        return main([*args, "--dry-run-steps", str(steps)])
    finally:
        torch.set_num_threads(threads)


def weights(folder: Path, side: str) -> dict[str, torch.Tensor]:
    return load_file(str(folder / f"{side}_0_Transformer" / "model.safetensors"))


def changed(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> int:
    assert a.keys() <= b.keys()
    return sum(not torch.equal(a[k].float(), b[k].float()) for k in a)


def test_authors_recipe_dry_runs_both_stages_on_flag_data(towers: Path, tmp_path: Path, capsys) -> None:
    from care_retriever.model.embedder import AsymmetricEmbedder

    data = authors_data(tmp_path / "data")
    out = tmp_path / "run"
    code = train(authors_recipe(tmp_path / "authors.yaml", towers), out, data)
    assert code == 0, capsys.readouterr().err
    state = json.loads((out / "run.json").read_text("utf-8"))
    assert state["done"] == ["init", "stage1", "stage2"]
    reports = {r["name"]: r for r in state["reports"]}
    assert reports["stage1"]["steps"] == 2 and reports["stage2"]["steps"] == 2
    assert reports["stage2"]["hard_negatives"] == 7  # train_group_size 8
    # Stage I trained the query tower, Stage II merged LoRA into the document tower: both differ from the
    # checkpoints they started from (the paper recipe's test follows each stage's saved model)
    final = out / "final"
    assert changed(load_file(str(towers / "gte" / "model.safetensors")), weights(final, "query"))
    shards: dict[str, torch.Tensor] = {}
    for shard in (towers / "qwen3").glob("model-*.safetensors"):
        shards.update({k.removeprefix("model."): v.float() for k, v in load_file(str(shard)).items()})
    assert changed({k: v for k, v in shards.items() if "proj" in k}, weights(final, "document"))
    config = json.loads((out / "final" / "care_config.json").read_text("utf-8"))
    assert config["query_prompt_template"] == "<instruct>{instruction}\n<query>"
    assert config["default_instruction"] == RETRIEVAL

    # Stage I's MSE target (mse_target: sliced): the teacher normalised at its 1024 dims, then cut to 768,
    # so each row points where the model's (renormalised) document vector points and is shorter than 1.
    (meta,) = (out / "teacher_cache").glob("*.json")
    shape = tuple(json.loads(meta.read_text("utf-8"))["shape"])
    rows = np.array(np.memmap(meta.with_suffix(".f32"), dtype=np.float32, mode="r", shape=shape))
    norms = np.linalg.norm(rows, axis=1)
    assert shape[1] == 768 and np.all(norms < 0.99) and np.all(norms > 0.1)
    init = AsymmetricEmbedder.from_towers(str(towers / "gte"), str(towers / "qwen3"), dtype="fp32")
    init.document_model.max_seq_length = 64  # the dry run's cap (the cache was built under it)
    lines = (data / "stage1" / "stage1-query-align-q.jsonl").read_text("utf-8").splitlines()
    first = json.loads(lines[0])["query"]
    vector = init.embed_documents([first])[0]
    cosines = (rows / norms[:, None]) @ vector
    assert cosines.max() > 0.9999


def test_authors_recipe_with_a_tower_that_takes_no_instruction_is_refused_before_writing(
    towers: Path, tmp_path: Path, capsys
) -> None:
    """Without the recipe's template the BERT query tower takes no instruction, so the rows' prompts
    cannot be honoured: one line naming the first such row, and nothing written."""
    data = authors_data(tmp_path / "data")
    out = tmp_path / "run"
    code = train(authors_recipe(tmp_path / "authors.yaml", towers, query_prompt_template=None), out, data)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"{data / 'stage2' / 'stage2-medteb-retrieval.jsonl'}:1: row has a 'prompt'" in err
    assert "use_prompt: false" in err
    assert not out.exists()


def test_the_sliced_mse_target_is_taken_as_given_and_the_default_renormalises() -> None:
    from care_retriever.training.losses import QueryAlignmentLoss, alignment_mse

    student = torch.tensor([[3.0, 4.0], [1.0, 0.0]])
    teacher = torch.tensor([[0.3, 0.4], [0.0, 0.5]])  # norms 0.5: rows cut from unit vectors of a wider space
    assert float(alignment_mse(student, teacher)) == pytest.approx((0.0 + 2.0) / 2)
    # as given: |(0.6, 0.8) - (0.3, 0.4)|^2 = 0.25 and |(1, 0) - (0, 0.5)|^2 = 1.25
    assert float(alignment_mse(student, teacher, normalise_teacher=False)) == pytest.approx((0.25 + 1.25) / 2)

    class Rows(torch.nn.Module):
        def forward(self, features):
            return {"sentence_embedding": features["rows"]}

    cache = teacher.numpy()
    labels = torch.tensor([0, 1])
    for target, mse in (("renormalised", 1.0), ("sliced", 0.75)):
        loss = QueryAlignmentLoss(Rows(), cache, lambda1=0.0, lambda2=1.0, mse_target=target)
        assert float(loss([{"rows": student}], labels)) == pytest.approx(mse)
        assert loss.get_config_dict()["mse_target"] == target


# ----------------------------------------------------------------------------- from a released model
KEPT = {"normalize": "before_truncation", "similarity": "dot", "convention": "authors-release"}


def spy_on_training_scores(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The score each contrastive loss of the run is built with (``cos_sim`` / ``dot_score`` / ``dot``)."""
    import care_retriever.training.losses as losses
    from care_retriever.training import joint_stages, stage_common, stages

    seen: list[str] = []
    contrastive, alignment = stage_common.contrastive_loss, losses.QueryAlignmentLoss

    def built(ctx, stage, model):
        loss = contrastive(ctx, stage, model)
        seen.append(loss.similarity_fct.__name__)
        return loss

    def aligned(*args, **kwargs):
        seen.append(kwargs.get("similarity", "cosine"))
        return alignment(*args, **kwargs)

    for module in (stages, joint_stages):  # the stages' modules, each with the name it imported
        monkeypatch.setattr(module, "contrastive_loss", built)
    monkeypatch.setattr(losses, "QueryAlignmentLoss", aligned)
    return seen


def continue_recipe(target: Path, model: dict[str, object], stages: list[dict[str, object]]) -> Path:
    recipe = {
        "name": "continue",
        "model": model,
        "datasets": {
            "mine": {"path": "stage2/stage2-medteb-retrieval.jsonl", "format": "flag"},
            "align": {"path": "stage1/stage1-query-align-q.jsonl", "format": "flag"},
        },
        "defaults": {"learning_rate": 1.0e-4, "per_device_train_batch_size": 4},
        "stages": stages,
    }
    target.write_text(yaml.safe_dump(recipe, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return target


STAGE2 = {
    "name": "stage2",
    "type": "stage2_joint",
    "datasets": ["mine"],
    "temperature": 0.02,
    "lora": {"r": 8, "alpha": 16},
    "hard_negatives": {"num": 2, "mine": False},
}


def test_stage2_continues_a_released_model_on_its_dot_scores_and_keeps_its_conventions(
    released: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    from care_retriever.model.embedder import AsymmetricEmbedder

    seen = spy_on_training_scores(monkeypatch)
    data = authors_data(tmp_path / "data")  # the retrieval rows' prompts fill the release's instruction slot
    recipe = continue_recipe(tmp_path / "continue.yaml", {"path": str(released)}, [STAGE2])
    code = train(recipe, tmp_path / "run", data)
    assert code == 0, capsys.readouterr().err
    assert seen == ["dot_score"]
    config = json.loads((tmp_path / "run" / "final" / "care_config.json").read_text("utf-8"))
    assert {k: config[k] for k in KEPT} == KEPT
    assert (
        config["query_prompt_template"] == "<instruct>{instruction}\n<query>" and config["instructions"]["sts"] == STS
    )
    model = AsymmetricEmbedder.from_pretrained(tmp_path / "run" / "final", load="both", dtype="fp32")
    norms = np.linalg.norm(model.embed_documents(["高血压患者应低盐饮食。", "感冒多休息"]), axis=1)
    assert np.all(norms < 0.99)  # still normalised at full width, then cut


def test_a_new_query_tower_aligns_to_a_released_document_tower(
    released: Path, towers: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    seen = spy_on_training_scores(monkeypatch)
    data = authors_data(tmp_path / "data")
    model = {
        "query_model": str(towers / "gte"),
        "document_model": str(released / "doc_encoder"),
        "convention": "authors-release",
    }
    stage1 = {
        "name": "stage1",
        "type": "stage1_align",
        "alignment": {"queries": ["align"], "documents": ["align"]},
        "mse_target": "sliced",
    }
    code = train(continue_recipe(tmp_path / "new.yaml", model, [stage1]), tmp_path / "run", data)
    assert code == 0, capsys.readouterr().err
    assert seen == ["dot"]
    config = json.loads((tmp_path / "run" / "final" / "care_config.json").read_text("utf-8"))
    assert {k: config[k] for k in KEPT} == KEPT
    assert config["query"]["base_model"] == str(towers / "gte")
