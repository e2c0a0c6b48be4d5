"""Training on data smaller than one batch: the batch is capped to the data with one warning, so the authors'
recipe started from a release folder on a 20-row sample trains to the end (transformers' trainer otherwise
stops, once ``stages/init`` and the teacher cache are written, on a data loader with no batch); the same holds
for a ``--dry-run-steps`` run, which meets what the real run meets."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
import yaml

from care_retriever.cli.main import main
from care_retriever.errors import InputError
from care_retriever.training.data_fit import fit_batch_to_data
from tests.support.authors_data import AUTHORS, authors_data


def test_a_batch_larger_than_the_data_is_capped_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    from datasets import Dataset, DatasetDict

    data = DatasetDict({"a": Dataset.from_dict({"x": ["1"] * 16}), "b": Dataset.from_dict({"x": ["1"] * 20})})
    with caplog.at_level(logging.WARNING, logger="care_retriever"):
        fitted = fit_batch_to_data({"per_device_train_batch_size": 40, "dataloader_drop_last": True}, data, "s1")
        kept = fit_batch_to_data(
            {"per_device_train_batch_size": 40, "dataloader_drop_last": True}, data, "s1", distributed=True
        )
    assert fitted["per_device_train_batch_size"] == 20 and fitted["dataloader_drop_last"] is False
    assert kept["per_device_train_batch_size"] == 20 and kept["dataloader_drop_last"] is True
    assert len([r for r in caplog.records if "larger than its data" in r.getMessage()]) == 2
    same = {"per_device_train_batch_size": 8}
    assert fit_batch_to_data(same, data, "s1") is same
    with pytest.raises(InputError, match="no rows"):
        fit_batch_to_data(same, Dataset.from_dict({"x": []}), "s1")


@pytest.mark.slow
def test_the_authors_recipe_from_a_release_folder_trains_to_the_end_on_its_small_sample(
    released: Path,
    tmp_path: Path,
    capsys,
) -> None:
    recipe = yaml.safe_load(AUTHORS.read_text("utf-8"))
    recipe["model"] = {"path": str(released), "max_length": 64}
    for stage in recipe["stages"]:  # one epoch each: the test is about the batches, not the training
        stage["args"]["num_train_epochs"] = 1
    path = tmp_path / "authors.yaml"
    path.write_text(yaml.safe_dump(recipe, allow_unicode=True, sort_keys=False), encoding="utf-8")
    data = authors_data(tmp_path / "data")  # 16 queries, 32 documents: fewer than Stage I's batch of 40
    out = tmp_path / "run"
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        code = main(["train", "--recipe", str(path), "--out", str(out), "--data-dir", str(data), "--no-progress"])
    finally:
        torch.set_num_threads(threads)
    err = capsys.readouterr().err
    assert code == 0, err
    state = json.loads((out / "run.json").read_text("utf-8"))
    assert state["done"] == ["init", "stage1", "stage2"]
    assert all(r["steps"] >= 1 for r in state["reports"])
    assert (out / "final").is_dir()
