"""``care-retriever train`` killed for real (SIGKILL) inside Stage 0 (the document tower's LoRA stage)
and inside Stage I, then re-run
with the same command: it resumes, and ends with the model an uninterrupted run of the same seed ends
with, step for step.

The kills land while the trainer writes a checkpoint (the test kills as soon as the checkpoint's
folder appears): the resumed run must skip that half-written checkpoint and continue from the
previous one, restoring weights, optimizer, schedule, data order and the dropout RNG. Tolerance:
resumed and uninterrupted runs do the same float operations in the same order on one thread, so
the weights must agree to 1e-6 and the per-step losses to 1e-6 (measured: equal to the bit).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.support.data import condition_pairs, write_jsonl

pytestmark = pytest.mark.slow

# 48 pairs, batches of 8, 2 epochs: each Stage 0 tower trains 12 steps, Stage I 24 (queries and
# documents), a checkpoint every 2 steps.
RECIPE = """
name: kill-resume
seed: 0
model: {{path: {model}, max_length: 32}}
datasets:
  pairs: {{path: pairs.jsonl, format: pairs}}
defaults:
  per_device_train_batch_size: 8
  learning_rate: 1.0e-3
  num_train_epochs: 2
  logging_steps: 1
  save_steps: 2
  save_total_limit: 2
stages:
  - {{name: stage0-query, type: stage0_query, datasets: [pairs]}}
  - {{name: stage0-document, type: stage0_document, datasets: [pairs], lora: {{r: 4, alpha: 8}}}}
  - {{name: stage1, type: stage1_align, alignment: {{queries: [pairs], documents: [pairs]}}}}
"""
STEPS = {"stage0-query": 12, "stage0-document": 12, "stage1": 24}
TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def recipe_dir(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    folder = tmp_path_factory.mktemp("kill-data")
    write_jsonl(folder / "pairs.jsonl", condition_pairs())
    (folder / "recipe.yaml").write_text(RECIPE.format(model=tiny_model_dir), encoding="utf-8")
    return folder


def train_command(recipe_dir: Path, out: Path, *extra: str) -> list[str]:
    # Always with --resume: on a missing or empty --out it is a fresh run, so one command serves
    # the first start and every restart.
    return [
        sys.executable,
        "-m",
        "care_retriever.cli.main",
        "train",
        "--recipe",
        str(recipe_dir / "recipe.yaml"),
        "--data-dir",
        str(recipe_dir),
        "--out",
        str(out),
        "--resume",
        "--no-progress",
        *extra,
    ]


ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def run_to_end(recipe_dir: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    done = subprocess.run(train_command(recipe_dir, out, *extra), env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def kill_when(recipe_dir: Path, out: Path, appears: Path) -> None:
    """Start the command, SIGKILL it the moment ``appears`` exists."""
    process = subprocess.Popen(
        train_command(recipe_dir, out), env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 240
        while not appears.exists():
            assert process.poll() is None, f"train ended (exit {process.returncode}) before {appears} appeared"
            assert time.monotonic() < deadline, f"{appears} did not appear"
            time.sleep(0.002)
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.kill()
        process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL


def done_stages(out: Path) -> list[str]:
    return json.loads((out / "run.json").read_text("utf-8"))["done"]


def logged_losses(out: Path, stage: str) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (out / "logs" / f"{stage}.jsonl").read_text("utf-8").splitlines()]
    return [(row["step"], row["loss"]) for row in rows if "loss" in row]


def weights(model_dir: Path) -> dict[str, np.ndarray]:
    """Every tensor of every safetensors file of a saved model (both towers), keyed by file and name."""
    from safetensors.numpy import load_file

    found = {
        f"{path.relative_to(model_dir)}:{name}": array
        for path in sorted(model_dir.rglob("*.safetensors"))
        for name, array in load_file(path).items()
    }
    assert any(key.startswith("query_") for key in found) and any(key.startswith("document_") for key in found)
    return found


def test_sigkill_in_stage0_and_stage1_then_resume_equals_an_uninterrupted_run(recipe_dir: Path, tmp_path: Path):
    reference = tmp_path / "reference"  # missing: `train --resume` starts a fresh run there
    run_to_end(recipe_dir, reference, "--keep-stages")  # its init is compared below; the killed run prunes

    killed = tmp_path / "killed"
    killed.mkdir()  # empty: also a fresh run under --resume
    stage0_checkpoints = killed / "checkpoints" / "stage0-document"
    kill_when(recipe_dir, killed, stage0_checkpoints / "checkpoint-4")
    assert done_stages(killed) == ["init", "stage0-query"]  # killed inside Stage 0's LoRA stage

    stage1_checkpoints = killed / "checkpoints" / "stage1"
    kill_when(recipe_dir, killed, stage1_checkpoints / "checkpoint-6")
    assert done_stages(killed) == ["init", "stage0-query", "stage0-document"]  # killed inside Stage I
    assert not (killed / "final").exists()

    finished = run_to_end(recipe_dir, killed)
    assert done_stages(killed) == ["init", "stage0-query", "stage0-document", "stage1"]
    # Stage I continued from a checkpoint, it did not start over
    assert f"stage stage1: resuming from {stage1_checkpoints / 'checkpoint-'}" in finished.stderr

    for stage, steps in STEPS.items():
        got, want = logged_losses(killed, stage), logged_losses(reference, stage)
        assert [s for s, _ in got] == list(range(1, steps + 1)), stage  # each step logged once
        assert [s for s, _ in want] == list(range(1, steps + 1)), stage
        np.testing.assert_allclose([v for _, v in got], [v for _, v in want], rtol=0, atol=TOLERANCE, err_msg=stage)

    got, want = weights(killed / "final"), weights(reference / "final")
    assert got.keys() == want.keys()
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=0, atol=TOLERANCE, err_msg=key)
    assert not (killed / "stages" / "init").exists()  # nothing left to start from it
    init = weights(reference / "stages" / "init")
    for tower in ("query_", "document_"):  # both towers trained: the comparison is not of untouched weights
        assert any(not np.array_equal(init[key], want[key]) for key in want if key.startswith(tower)), tower


def test_last_checkpoint_skips_a_half_written_one(tmp_path: Path) -> None:
    from care_retriever.training.engine import last_checkpoint

    assert last_checkpoint(tmp_path / "missing") is None
    (tmp_path / "checkpoint-2").mkdir()
    (tmp_path / "checkpoint-2" / "trainer_state.json").write_text('{"global_step": 2}')
    (tmp_path / "checkpoint-10").mkdir()  # newer, killed before its trainer state was written
    (tmp_path / "checkpoint-10" / "care_state.safetensors").write_bytes(b"\0" * 8)
    (tmp_path / "checkpoint-12").mkdir()  # newer still, killed while writing its trainer state
    (tmp_path / "checkpoint-12" / "trainer_state.json").write_text('{"global_st')
    assert last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-2")
