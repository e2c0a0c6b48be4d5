"""The ``paper`` recipe trained from towers in the formats users download, then indexed and searched.

The recipe is ``training/recipes/paper.yaml`` itself with only its towers pointed at folders written
offline by ``tests/support/hub_towers.py``: a Qwen3 causal-LM checkpoint laid out like Qwen/Qwen3-4B (sharded
safetensors, bf16 as shipped) for the document tower, and the native GTE sentence-transformers folder
(or a remote-code encoder) for the query tower, at the widths the recipe's ``dim: 768`` names. No
``--preset``: every stage (Stage 0 on both towers, LoRA on the causal LM, Stage I with the teacher
cache, Stage II with mined hard negatives) runs one dry-run step on the recipe's own data sets.
The precision policy is tested as a function of the GPU's capability and the towers' dtypes.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file

from care_retriever.cli.main import main
from care_retriever.errors import InputError
from tests.support.cli import torchrun
from tests.support.hub_towers import write_gte_sentence_transformer, write_qwen3_causal_lm, write_remote_code_encoder

REPO = Path(__file__).resolve().parents[2]
PAPER = REPO / "training" / "recipes" / "paper.yaml"
SAMPLE_CORPUS = REPO / "care_retriever" / "data" / "sample" / "corpus.jsonl"
STAGES = ["init", "stage0-query", "stage0-document", "stage1", "stage2"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="module")
def towers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The recipe's towers at its widths: gte-multilingual-base is 768 wide (``dim: 768``); the Qwen3
    document tower is wider (Qwen3-4B: 2560), so the Matryoshka truncation to 768 is exercised."""
    root = tmp_path_factory.mktemp("paper-towers")
    write_qwen3_causal_lm(root / "qwen3", hidden_size=1024, dtype=torch.bfloat16)
    write_gte_sentence_transformer(root / "gte", hidden_size=768)
    write_remote_code_encoder(root / "remote", hidden_size=768)
    return root


def paper_recipe(target: Path, query: Path, document: Path, **model: object) -> Path:
    """paper.yaml with its towers (and ``model`` keys, if given) replaced; nothing else restated."""
    recipe = yaml.safe_load(PAPER.read_text("utf-8"))
    recipe["model"].update(query_model=str(query), document_model=str(document), **model)
    target.write_text(yaml.safe_dump(recipe, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return target


def small_corpus(target: Path, rows: int = 40) -> Path:
    lines = SAMPLE_CORPUS.read_text("utf-8").splitlines()[:rows]
    target.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return target


def tower_weights(folder: Path, side: str) -> dict[str, torch.Tensor]:
    return load_file(str(folder / f"{side}_0_Transformer" / "model.safetensors"))


def changed(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> int:
    return sum(not torch.equal(a[k], b[k]) for k in a)


def train(recipe: Path, out: Path, data: Path, *extra: str) -> int:
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        return main(
            [
                *("train", "--recipe", str(recipe), "--out", str(out), "--data-dir", str(data), "--no-progress"),
                *("--dry-run-steps", "1", *extra),
            ]
        )
    finally:
        torch.set_num_threads(threads)


@pytest.mark.shared_data
def test_paper_recipe_trains_every_stage_from_hub_format_towers_then_indexes_and_searches(
    towers: Path, shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog
) -> None:
    recipe = paper_recipe(tmp_path / "paper.yaml", towers / "gte", towers / "qwen3")
    out = tmp_path / "run"
    with caplog.at_level("INFO", logger="care_retriever"):
        code = train(recipe, out, shared_data, "--keep-stages")
    captured = capsys.readouterr()
    assert code == 0, captured.err
    state = json.loads((out / "run.json").read_text("utf-8"))
    assert state["done"] == STAGES
    reports = {r["name"]: r for r in state["reports"]}
    assert all(r["steps"] == 1 for r in reports.values())
    assert reports["stage1"]["teacher"] == "cached" and reports["stage1"]["teacher_texts"] > 0
    assert reports["stage2"]["hard_negatives"] == 3
    # CPU: fp32, said once (the recipe's bf16 is for GPUs)
    notes = [r.getMessage() for r in caplog.records if r.getMessage().startswith("precision:")]
    assert notes == ["precision: no CUDA GPU: training in fp32 (the recipe's bf16 is for GPUs)"]

    stages = {name: out / "stages" / name for name in STAGES}
    # the causal-LM checkpoint's weights are the document tower's (loaded, not freshly initialised)
    shards = {}
    for shard in (towers / "qwen3").glob("model-*.safetensors"):
        shards.update(load_file(str(shard)))
    init_doc = tower_weights(stages["init"], "document")
    assert torch.equal(init_doc["embed_tokens.weight"], shards["model.embed_tokens.weight"])  # saved in its bf16
    # the checkpoint's bf16 is recorded for the precision decision of every later stage and resume
    config = json.loads((out / "final" / "care_config.json").read_text("utf-8"))
    assert config["dim"] == 768 and config["document"]["native_dim"] == 1024
    assert config["extra"]["pretrained_dtype"] == {"query": "float32", "document": "bfloat16"}
    # every stage's one step trained what it trains: the query tower, then LoRA merged into the document tower
    query = {name: tower_weights(folder, "query") for name, folder in stages.items()}
    document = {name: tower_weights(folder, "document") for name, folder in stages.items()}
    assert changed(query["init"], query["stage0-query"])
    assert changed(document["stage0-query"], document["stage0-document"])
    assert changed(query["stage0-document"], query["stage1"])
    assert not changed(document["stage0-document"], document["stage1"])  # Stage I: the teacher is frozen
    assert changed(document["stage1"], document["stage2"])

    corpus = small_corpus(tmp_path / "corpus.jsonl")
    store = f"faiss:{tmp_path / 'store'}"
    assert main(["index", "--model", str(out / "final"), "--store", store, "--corpus", str(corpus)]) == 0
    capsys.readouterr()
    assert main(["search", "--model", str(out / "final"), "--store", store, "--json", "高血压怎么办"]) == 0
    hits = json.loads(capsys.readouterr().out.splitlines()[-1])["hits"]
    ids = {json.loads(line)["_id"] for line in corpus.read_text("utf-8").splitlines()}
    assert len(hits) == 10 and {h["id"] for h in hits} <= ids


@pytest.mark.shared_data
def test_remote_code_query_tower_trains_and_resumes_with_the_recipes_trust_remote_code(
    towers: Path, shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A query tower whose model code ships in its folder: the recipe's ``trust_remote_code: true`` is
    carried to every load of the run, including a resume that loads the saved stages (the saved
    folders record that the tower runs code, so a load without the flag is refused)."""
    recipe = paper_recipe(tmp_path / "paper.yaml", towers / "remote", towers / "qwen3", trust_remote_code=True)
    out = tmp_path / "run"
    assert train(recipe, out, shared_data, "--stage", "stage0-query") == 0, capsys.readouterr().err
    code = train(recipe, out, shared_data, "--resume")
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert json.loads((out / "run.json").read_text("utf-8"))["done"] == STAGES
    assert "final model:" in captured.out


@pytest.mark.shared_data
def test_remote_code_query_tower_without_trust_remote_code_is_one_line(
    towers: Path, shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = paper_recipe(tmp_path / "paper.yaml", towers / "remote", towers / "qwen3")
    code = train(recipe, tmp_path / "run", shared_data)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "trust_remote_code" in err, err
    assert not (tmp_path / "run").exists()
    # The command line's switch is the recipe's: the same recipe trains with --trust-remote-code.
    assert train(recipe, tmp_path / "run", shared_data, "--trust-remote-code", "--stage", "stage0-query") == 0


# ----------------------------------------------------------------------------- precision policy
AMPERE, VOLTA = (8, 0), (7, 0)
QWEN3 = {"query": "float32", "document": "bfloat16"}
ENCODERS = {"query": "float32", "document": "float32"}


def test_precision_is_fp32_on_cpu_and_says_so() -> None:
    from care_retriever.training.precision import training_precision

    for flags in ({"bf16": True}, {"fp16": True}):
        precision = training_precision(flags, None, QWEN3)
        assert precision.name == "fp32" and "no CUDA GPU" in precision.note
    assert training_precision({}, None, QWEN3).note is None


def test_bf16_on_a_gpu_with_native_bf16() -> None:
    from care_retriever.training.precision import training_precision

    assert training_precision({"bf16": True}, AMPERE, QWEN3).name == "bf16"
    assert training_precision({"bf16": True}, (9, 0), ENCODERS).trainer_flags == {"bf16": True, "fp16": False}


def test_fp16_is_never_used_for_a_tower_pretrained_in_bf16() -> None:
    from care_retriever.training.precision import training_precision

    switched = training_precision({"fp16": True}, AMPERE, QWEN3)
    assert switched.name == "bf16" and "document tower was pretrained in bf16" in switched.note
    with pytest.raises(InputError, match="no native bf16; set fp16: false") as refused:
        training_precision({"fp16": True}, VOLTA, QWEN3)
    assert "\n" not in str(refused.value)
    # towers pretrained in fp32 keep the fp16 they ask for
    assert training_precision({"fp16": True}, VOLTA, ENCODERS).name == "fp16"


def test_bf16_on_a_gpu_that_only_emulates_it_is_refused() -> None:
    from care_retriever.training.precision import training_precision

    with pytest.raises(InputError, match=r"compute capability 7\.0\) has no native bf16.*set bf16: false \(fp32\)"):
        training_precision({"bf16": True}, VOLTA, QWEN3)
    with pytest.raises(InputError, match="bf16 and fp16 are both true"):
        training_precision({"bf16": True, "fp16": True}, AMPERE, ENCODERS)


def test_a_towers_pretraining_dtype_is_read_from_its_checkpoint(towers: Path) -> None:
    from care_retriever.model.towers.modules import tower_pretrained_dtype

    assert tower_pretrained_dtype(str(towers / "qwen3")) == "bfloat16"  # as Qwen3-4B's config.json says
    assert tower_pretrained_dtype(str(towers / "gte")) == "float32"  # a sentence-transformers folder
    assert tower_pretrained_dtype(str(towers / "missing")) is None


# ----------------------------------------------------------------------------- two processes
@pytest.mark.slow
@pytest.mark.shared_data
def test_paper_recipe_in_two_processes_shares_the_work_under_the_recipes_timeout(
    towers: Path, shared_data: Path, tmp_path: Path
) -> None:
    """``torchrun --nproc-per-node 2`` (gloo): the process group runs under the recipe's
    ``ddp_timeout``, read back from torch; every rank loads the towers and encodes its share of the
    teacher cache and of the mining pool (the assembled cache has no row left unwritten)."""
    recipe = yaml.safe_load(paper_recipe(tmp_path / "paper.yaml", towers / "gte", towers / "qwen3").read_text())
    recipe["defaults"]["ddp_timeout"] = 90
    (tmp_path / "paper.yaml").write_text(yaml.safe_dump(recipe, allow_unicode=True, sort_keys=False), "utf-8")
    out = tmp_path / "run"
    command = [
        *torchrun(),
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "care_retriever.cli.main",
        "train",
        "--recipe",
        str(tmp_path / "paper.yaml"),
        "--data-dir",
        str(shared_data),
        "--out",
        str(out),
        "--dry-run-steps",
        "1",
        "--no-progress",
    ]
    done = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.count("final model:") == 1, done.stdout
    state = json.loads((out / "run.json").read_text("utf-8"))
    assert state["processes"] == {"world_size": 2, "timeout_seconds": 90.0, "process_group": True}
    assert state["done"] == STAGES
    stage1 = next(r for r in state["reports"] if r["name"] == "stage1")
    cache = np.fromfile(stage1["teacher_cache"], dtype=np.float32).reshape(stage1["teacher_texts"], 768)
    np.testing.assert_allclose(np.linalg.norm(cache, axis=1), 1.0, rtol=1e-4)  # both ranks' rows are there
    assert not list((out / "teacher_cache").glob(".*")) and not list(out.glob(".exchange*"))  # parts removed


def test_every_frozen_tower_encoding_in_training_runs_under_the_stage_autocast() -> None:
    """A frozen tower's encodings (teacher scores, mined negatives, the teacher cache) run as the tower runs in
    training: under the stage's autocast. An ``embed_documents`` / ``embed_queries`` call outside ``with
    autocast(...)`` ran a bf16 recipe's frozen tower in fp32 on a GPU, several times slower."""
    import ast

    exempt = {"quickstart.py"}  # scores the trained model as a user would load it, after training
    found = []
    for path in sorted((REPO / "training").rglob("*.py")):
        if path.name in exempt:
            continue
        tree = ast.parse(path.read_text("utf-8"))
        guarded: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.With) and any(
                isinstance(item.context_expr, ast.Call)
                and getattr(item.context_expr.func, "id", getattr(item.context_expr.func, "attr", "")) == "autocast"
                for item in node.items
            ):
                guarded.update(id(inner) for inner in ast.walk(node))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("embed_documents", "embed_queries")
                and id(node) not in guarded
            ):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not found, f"frozen-tower encodings outside the stage's autocast: {found}"
