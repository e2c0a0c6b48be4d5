"""What a training run writes, and what it costs: checkpoints saved as a real run saves them (gte's fused
projections included), stages saved in each tower's own dtype and kept only while a resume needs them, a
full disk reported in one line with the previous stage intact, the process group's timeout recorded, and
no warnings from the BM25 side's jieba or from transformers' renamed activation-checkpointing calls."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from tests.support.hub_towers import write_gte_sentence_transformer, write_qwen3_causal_lm

REPO = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def towers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("saves-towers")
    write_gte_sentence_transformer(root / "gte", hidden_size=48)
    write_qwen3_causal_lm(root / "qwen3", dtype=torch.bfloat16)
    return root


def recipe(*stages: dict, model: dict | None = None, **defaults) -> dict:
    return {
        "name": "saves",
        "model": model or {"preset": "tiny", "vocab_from": ["pairs.jsonl"], "max_length": 32},
        "datasets": {"pairs": {"path": "pairs.jsonl"}},
        "defaults": {"per_device_train_batch_size": 8, "logging_steps": 1, **defaults},
        "stages": list(stages) or [{"name": "s0", "type": "stage0_query", "datasets": ["pairs"]}],
    }


TWO_STAGES = (
    {"name": "s0", "type": "stage0_query", "datasets": ["pairs"]},
    {"name": "s1", "type": "stage2_joint", "datasets": ["pairs"], "hard_negatives": {"num": 1, "mine": False}},
)


def run(raw: dict, out: Path, condition_pairs_dir: Path, **kwargs):
    from care_retriever.training.recipe import parse_recipe
    from care_retriever.training.runner import run_recipe

    return run_recipe(parse_recipe(raw), out, condition_pairs_dir, show_progress=False, **kwargs)


# ----------------------------------------------------------------------------- checkpoints
def gte_model(towers: Path):
    from care_retriever.model.embedder import AsymmetricEmbedder

    embedder = AsymmetricEmbedder.from_towers(str(towers / "gte"), str(towers / "qwen3"), dtype="fp32")
    return embedder, embedder.to_sentence_transformer()


def test_a_checkpoint_of_a_gte_query_tower_saves_and_loads_on_cpu(towers: Path, tmp_path: Path) -> None:
    """transformers reads gte natively with q/k/v as views of one fused storage; safetensors refused to
    save them ("found no suitable name to keep for saving") where no move to CUDA had copied them."""
    from datasets import Dataset
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    from care_retriever.training.engine import CareTrainer, build_arguments

    _embedder, model = gte_model(towers)
    for param in model.parameters():
        param.requires_grad_(True)
    trainer = CareTrainer(
        model=model,
        args=build_arguments(tmp_path / "ckpt", {"report_to": "none"}, seed=0, router_mapping={"anchor": "query"}),
        train_dataset=Dataset.from_dict({"anchor": ["血压高"], "positive": ["高血压"]}),
        loss=MultipleNegativesRankingLoss(model),
        care_fingerprint="f",
    )
    # transformers' Trainer saves and loads checkpoints through these hooks, which CareTrainer overrides: the test
    # calls them as the training loop does
    trainer._save(str(tmp_path / "ckpt" / "checkpoint-1"))
    expected = {k: v.detach().clone() for k, v in model.state_dict().items()}
    _, fresh = gte_model(towers)
    with torch.no_grad():
        for param in fresh.parameters():
            param.zero_()
    trainer._load_from_checkpoint(str(tmp_path / "ckpt" / "checkpoint-1"), fresh)
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in expected.items())


def test_a_dry_run_saves_its_checkpoint_as_a_real_run_does(
    condition_pairs_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from care_retriever.training.engine import CareTrainer

    saved: list[str] = []
    original = CareTrainer._save  # the trainer's checkpoint hook (see above): every checkpoint passes through it

    def recording(self, output_dir=None, state_dict=None):
        saved.append(str(output_dir))
        original(self, output_dir, state_dict)

    monkeypatch.setattr(CareTrainer, "_save", recording)
    run(recipe(), tmp_path / "run", condition_pairs_dir, dry_run_steps=1)
    assert [Path(p).name for p in saved] == ["checkpoint-1"]


@pytest.mark.slow
# ----------------------------------------------------------------------------- what stays on disk
def test_a_run_keeps_only_what_resume_and_the_final_model_need(condition_pairs_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = run(recipe(*TWO_STAGES), out, condition_pairs_dir, dry_run_steps=1)
    assert result.final == out / "final" and (out / "final" / "care_config.json").is_file()
    assert not (out / "stages").exists() or not any((out / "stages").iterdir())
    assert not (out / "checkpoints").exists() or not any((out / "checkpoints").iterdir())
    # a finished run resumes to the same final model without loading anything
    again = run(recipe(*TWO_STAGES), out, condition_pairs_dir, dry_run_steps=1, resume=True)
    assert again.final == out / "final"
    kept = run(recipe(*TWO_STAGES), tmp_path / "kept", condition_pairs_dir, dry_run_steps=1, keep_stages=True)
    assert sorted(p.name for p in (kept.out / "stages").iterdir()) == ["init", "s0", "s1"]


def test_stages_save_each_tower_in_its_own_dtype_and_hash_the_document_tower_once_per_state(
    towers: Path, condition_pairs_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import care_retriever.model.embedder as embedder_module

    hashed: list[int] = []
    original = embedder_module.weights_fingerprint

    def counting(modules, dim):
        hashed.append(dim)
        return original(modules, dim)

    monkeypatch.setattr(embedder_module, "weights_fingerprint", counting)
    model = {"query_model": str(towers / "gte"), "document_model": str(towers / "qwen3"), "max_length": 32}
    stages = (
        {"name": "q", "type": "stage0_query", "datasets": ["pairs"]},
        {"name": "align", "type": "stage1_align", "alignment": {"queries": ["pairs"], "documents": ["pairs"]}},
    )
    result = run(recipe(*stages, model=model), tmp_path / "run", condition_pairs_dir, dry_run_steps=1, keep_stages=True)
    for name in ("init", "q", "align"):
        folder = result.out / "stages" / name
        with safe_open(str(folder / "document_0_Transformer" / "model.safetensors"), "pt") as fh:
            assert {fh.get_slice(k).get_dtype() for k in fh.keys()} == {"BF16"}  # noqa: SIM118
        with safe_open(str(folder / "query_0_Transformer" / "model.safetensors"), "pt") as fh:
            assert {fh.get_slice(k).get_dtype() for k in fh.keys()} == {"F32"}  # noqa: SIM118
    # neither stage changes the document tower: it is hashed once (init), not at each save and cache lookup
    assert len(hashed) == 1
    fingerprints = {
        json.loads((result.out / "stages" / n / "care_config.json").read_text())["space_fingerprint"]
        for n in ("init", "q", "align")
    }
    assert len(fingerprints) == 1


def test_a_full_disk_while_saving_a_stage_is_one_line_and_the_previous_stage_is_intact(
    condition_pairs_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml

    from care_retriever.cli.main import main
    from care_retriever.model import saving
    from care_retriever.model.embedder import AsymmetricEmbedder

    original = saving.write_model

    def fills_the_disk(st, folder: Path) -> None:
        if folder.name.startswith(".s1."):
            (folder / "half-written.bin").write_bytes(b"\0" * 1024)
            raise OSError(errno.ENOSPC, "No space left on device")
        original(st, folder)

    monkeypatch.setattr(saving, "write_model", fills_the_disk)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe(*TWO_STAGES)), "utf-8")
    out = tmp_path / "run"
    args = ["train", "--recipe", str(path), "--out", str(out), "--data-dir", str(condition_pairs_dir), "--no-progress"]
    code = main([*args, "--dry-run-steps", "1"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "no space left" in err and "needs about" in err and "free" in err, err
    assert json.loads((out / "run.json").read_text())["done"] == ["init", "s0"]
    assert sorted(p.name for p in (out / "stages").iterdir()) == ["s0"]  # no half-written folder left
    AsymmetricEmbedder.from_pretrained(out / "stages" / "s0")
    monkeypatch.setattr(saving, "write_model", original)
    assert main([*args, "--dry-run-steps", "1", "--resume"]) == 0
    assert (out / "final" / "care_config.json").is_file()


# ----------------------------------------------------------------------------- process group
def test_run_json_records_the_process_group_timeout_of_one_process(condition_pairs_dir: Path, tmp_path: Path) -> None:
    run(recipe(ddp_timeout=77), tmp_path / "run", condition_pairs_dir, dry_run_steps=1)
    processes = json.loads((tmp_path / "run" / "run.json").read_text())["processes"]
    assert processes["world_size"] == 1 and processes["timeout_seconds"] == 77


@pytest.mark.slow
def test_a_single_process_launched_by_torchrun_gets_the_recipes_timeout(
    condition_pairs_dir: Path, tmp_path: Path
) -> None:
    """torchrun --nproc-per-node 1 sets LOCAL_RANK: the trainer would create a gloo group with 1800 s."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    (tmp_path / "recipe.json").write_text(json.dumps(recipe(ddp_timeout=77)))
    script = f"""
import json, torch
torch.set_num_threads(1)
from care_retriever.training.recipe import parse_recipe
from care_retriever.training.runner import run_recipe
from care_retriever.training.distributed import process_group_timeout
raw = json.load(open({str(tmp_path / "recipe.json")!r}))
run_recipe(
    parse_recipe(raw), {str(tmp_path / "run")!r}, {str(condition_pairs_dir)!r}, dry_run_steps=1, show_progress=False
)
print("TIMEOUT", process_group_timeout())
"""
    env = {
        **os.environ,
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "TIMEOUT 77.0" in done.stdout
    processes = json.loads((tmp_path / "run" / "run.json").read_text())["processes"]
    assert processes["timeout_seconds"] == 77 and processes["process_group"] is True


# ----------------------------------------------------------------------------- warnings
def test_the_bm25_side_imports_jieba_without_warnings(tmp_path: Path) -> None:
    """A fresh bytecode cache: jieba's invalid escapes warn when its sources are compiled."""
    env = {**os.environ, "PYTHONPYCACHEPREFIX": str(tmp_path / "pycache"), "PYTHONWARNINGS": "always"}
    code = "from care_retriever.sparse.tokenizer import tokenize; print(tokenize(['高血压怎么办']))"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr, done.stderr


def test_activation_checkpointing_is_enabled_without_deprecation_warnings(
    condition_pairs_dir: Path, tmp_path: Path
) -> None:
    from transformers import PreTrainedModel

    from care_retriever.training.engine import enable_activation_checkpointing

    raw = recipe(*TWO_STAGES, activation_checkpointing=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(raw, tmp_path / "run", condition_pairs_dir, dry_run_steps=1)
    messages = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
    assert not [m for m in messages if "checkpointing" in m], messages

    from care_retriever.model.embedder import AsymmetricEmbedder

    model = AsymmetricEmbedder.from_pretrained(tmp_path / "run" / "final").to_sentence_transformer()
    enable_activation_checkpointing(model)
    model.activation_checkpointing_enable()
    towers = [m for m in model.modules() if isinstance(m, PreTrainedModel)]
    assert towers and all(m.is_activation_checkpointing for m in towers)


# ----------------------------------------------------------------------------- precision the towers are held in
def test_a_bf16_document_tower_is_held_in_bf16_only_on_a_gpu_run_in_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    from care_retriever.training import precision

    qwen3 = {"query": "float32", "document": "bfloat16"}
    fp32 = {"query": "fp32", "document": "fp32"}
    assert precision.held_dtypes({"bf16": True}, qwen3, "cpu") == fp32  # CPU trains in fp32
    monkeypatch.setattr(precision, "current_capability", lambda device=None: (9, 0))
    assert precision.held_dtypes({"bf16": True}, qwen3) == {"query": "fp32", "document": "bf16"}
    assert precision.held_dtypes({}, qwen3) == fp32  # an fp32 run
    assert precision.held_dtypes({"bf16": True}, {"query": "float32", "document": "float32"}) == fp32
    monkeypatch.setattr(precision, "current_capability", lambda device=None: (7, 0))
    assert precision.held_dtypes({"bf16": True}, qwen3) == fp32  # no native bf16: refused at the stage


def test_a_saved_model_loads_each_tower_in_the_dtype_it_is_held_in(
    towers: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The query tower is read in fp32 from its own files, not through a bf16 round trip."""
    from care_retriever.training import models, precision
    from care_retriever.training.recipe_spec import ModelSpec

    embedder, _ = gte_model(towers)
    models.save_model(embedder, tmp_path / "model")
    saved = {k: v.clone() for k, v in models.tower_transformer(embedder, "query").state_dict().items()}
    monkeypatch.setattr(precision, "held_dtypes", lambda *a, **k: {"query": "fp32", "document": "bf16"})
    loaded = models.load_model(tmp_path / "model", ModelSpec(), None)
    query, document = models.tower_transformer(loaded, "query"), models.tower_transformer(loaded, "document")
    assert {p.dtype for p in document.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in query.parameters()} == {torch.float32}
    assert all(torch.equal(query.state_dict()[k], v) for k, v in saved.items())
