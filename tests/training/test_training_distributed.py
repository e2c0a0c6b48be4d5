"""Two-process training: ``torchrun --nproc-per-node 2`` (gloo, CPU) runs ``care-retriever train``'s
Stage I and Stage II with in-batch negatives gathered across ranks, and its losses equal one
process's on the same global batch.

Two ranks of 8 rows see the global batch of 16 one process with batches of 16 sees (the samplers
shard batch by batch; with 16 rows step 1 holds all of them). The logged loss is the mean over the
ranks of each rank's loss, each rank's queries scored against all 16 candidates: the one-process loss
of the batch, if and only if the candidates were gathered. The query tower's dropout is off (two
processes cannot draw one process's dropout masks), and so is LoRA's; what remains is float
summation order, so the tolerance is 1e-5 relative for losses (measured: 6e-8), 1e-4 for gradient
norms. A data set that does not split into full batches on
every rank (44 rows, 2 x 8 per step) trains: the last partial batch is dropped.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support.cli import torchrun
from tests.support.data import condition_pairs, write_jsonl

pytestmark = pytest.mark.slow

RECIPE = """
name: two-processes
seed: 0
model: {{path: {model}, max_length: 32}}
datasets:
  pairs: {{path: pairs16.jsonl, format: pairs}}
  uneven: {{path: pairs44.jsonl, format: pairs}}
defaults:
  per_device_train_batch_size: {batch}
  learning_rate: 1.0e-3
  num_train_epochs: 1
  logging_steps: 1
  save_strategy: "no"
  gather_across_devices: true
  batch_sampler: batch_sampler
stages:
  - {{name: stage1, type: stage1_align, alignment: {{queries: [pairs]}}}}
  - name: stage2
    type: stage2_joint
    from: init
    datasets: [pairs]
    hard_negatives: {{num: 1, range_min: 0}}
    lora: {{r: 4, alpha: 8, dropout: 0.0}}
  - {{name: uneven, type: stage1_align, from: init, alignment: {{queries: [uneven]}}}}
"""
RTOL = 1e-5
WORKER = Path(__file__).resolve().parents[1] / "support" / "alignment_gather_worker.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """Data (16 and 44 pairs), the tiny model without dropout, a recipe per batch size."""
    folder = tmp_path_factory.mktemp("two-processes")
    for name, count in (("pairs16.jsonl", 16), ("pairs44.jsonl", 44)):
        write_jsonl(folder / name, condition_pairs()[:count])
    model = folder / "model"
    shutil.copytree(tiny_model_dir, model)
    config_path = model / "query_0_Transformer" / "config.json"
    config = json.loads(config_path.read_text("utf-8"))
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    config_path.write_text(json.dumps(config), encoding="utf-8")
    for batch in (8, 16):
        (folder / f"recipe-{batch}.yaml").write_text(RECIPE.format(model=model, batch=batch), encoding="utf-8")
    return folder


def logged(out: Path, stage: str) -> list[dict]:
    rows = [json.loads(line) for line in (out / "logs" / f"{stage}.jsonl").read_text("utf-8").splitlines()]
    return [row for row in rows if "loss" in row]


def test_two_processes_train_stage1_and_stage2_with_one_process_losses(folder: Path, tmp_path: Path) -> None:
    from care_retriever.training.recipe import load_recipe
    from care_retriever.training.runner import run_recipe

    two = tmp_path / "two"
    command = [
        *torchrun(),
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "care_retriever.cli.main",
        "train",
        "--recipe",
        str(folder / "recipe-8.yaml"),
        "--data-dir",
        str(folder),
        "--out",
        str(two),
        "--no-progress",
    ]
    done = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.count("final model:") == 1, done.stdout  # rank 0 reports, once
    one = run_recipe(load_recipe(str(folder / "recipe-16.yaml")), tmp_path / "one", folder, show_progress=False)

    for stage in ("stage1", "stage2"):
        two_rows, one_rows = logged(two, stage), logged(one.out, stage)
        assert [r["step"] for r in two_rows] == [r["step"] for r in one_rows] == [1], stage
        np.testing.assert_allclose(two_rows[0]["loss"], one_rows[0]["loss"], rtol=RTOL, err_msg=stage)
    # DDP averages the ranks' gradients: the gradient of the mean loss, one process's gradient
    # (Stage II's gathered documents carry their gradient back to their rank)
    for stage in ("stage1", "stage2"):
        grad_norms = [logged(out, stage)[0]["grad_norm"] for out in (two, one.out)]
        np.testing.assert_allclose(grad_norms[0], grad_norms[1], rtol=1e-4, err_msg=stage)

    # 44 rows: 5 full batches of 8; two ranks train 2 steps (the 5th batch is dropped), one process
    # trains 3 batches of 16, 16 and 12 over the same row order
    two_rows, one_rows = logged(two, "uneven"), logged(one.out, "uneven")
    assert [r["step"] for r in two_rows] == [1, 2] and [r["step"] for r in one_rows] == [1, 2, 3]
    np.testing.assert_allclose([r["loss"] for r in two_rows], [r["loss"] for r in one_rows[:2]], rtol=RTOL)

    # rank 0 wrote the run: every stage is recorded once and the final model loads
    state = json.loads((two / "run.json").read_text("utf-8"))
    assert state["done"] == ["init", "stage1", "stage2", "uneven"]
    assert (two / "final" / "care_config.json").is_file()


@pytest.mark.parametrize("counts", [(5, 3), (4, 4)])
def test_alignment_loss_gathers_batches_of_unequal_size(counts: tuple[int, int], tmp_path: Path) -> None:
    """Ranks holding 5 and 3 rows: each rank's Stage I loss scores its queries against all 8 teacher
    rows, and the row-weighted mean of the two is the one-process loss of the 8 rows."""
    import torch

    from care_retriever.training.losses import alignment_mse

    sys.path.insert(0, str(WORKER.parent))
    from tests.support.alignment_gather_worker import TEMPERATURE, global_batch

    command = [*torchrun(), "--standalone", "--nproc-per-node", "2", str(WORKER), str(tmp_path), *map(str, counts)]
    done = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2)]

    student, teacher = global_batch(sum(counts))
    s = torch.nn.functional.normalize(student, dim=-1).numpy().astype(np.float64)
    t = torch.nn.functional.normalize(teacher, dim=-1).numpy().astype(np.float64)
    logits = s @ t.T / TEMPERATURE  # every query against every teacher row of the global batch
    row_loss = np.log(np.exp(logits).sum(axis=1)) - np.diag(logits)
    for rank in ranks:
        rows = rank["rows"]
        expected = row_loss[rows].mean() + float(alignment_mse(student[rows], teacher[rows]))
        np.testing.assert_allclose(rank["loss"], expected, rtol=1e-5)
    weighted = sum(len(r["rows"]) * r["loss"] for r in ranks) / sum(counts)
    expected_all = row_loss.mean() + float(alignment_mse(student, teacher))
    np.testing.assert_allclose(weighted, expected_all, rtol=1e-5)
