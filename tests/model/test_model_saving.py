"""One writer of a saved model folder (``care_retriever.model.saving``), for ``save_pretrained`` and for
training's stage saves: a fault of the file system in one line with what was there intact, each tower written in
the dtype asked for and held as written, a known fingerprint kept only when asked, ``write=False`` writing nothing."""

from __future__ import annotations

import errno
import json
import re
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from care_retriever.errors import DiskFullError, WriteError
from care_retriever.model import saving
from care_retriever.model.embedder import AsymmetricEmbedder


def failing(code: int, real=saving.write_model):
    def write(st, folder: Path) -> None:
        real(st, folder)
        (folder / "half-written.bin").write_bytes(b"\0" * 1024)
        raise OSError(code, "injected")

    return write


def assert_intact(parent: Path, target: Path, fingerprint: str) -> None:
    assert sorted(p.name for p in parent.iterdir()) == [target.name]  # no temporary folder left
    assert json.loads((target / "care_config.json").read_text())["space_fingerprint"] == fingerprint
    AsymmetricEmbedder.from_pretrained(target, device="cpu")


def test_save_pretrained_on_a_full_disk_says_what_the_model_needs_and_keeps_the_saved_one(
    embedder: AsymmetricEmbedder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = embedder.save_pretrained(tmp_path / "models" / "m")
    fingerprint = json.loads((target / "care_config.json").read_text())["space_fingerprint"]
    monkeypatch.setattr(saving, "write_model", failing(errno.ENOSPC))
    with pytest.raises(DiskFullError) as caught:
        embedder.save_pretrained(target)
    message = str(caught.value)
    assert isinstance(caught.value, WriteError) and len(message.splitlines()) == 1
    assert "no space left" in message and "needs about" in message and "free now" in message, message
    assert f"any model at {target} is as it was" in message
    assert_intact(target.parent, target, fingerprint)


def test_save_pretrained_on_an_io_error_is_one_line_and_keeps_the_saved_one(
    embedder: AsymmetricEmbedder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = embedder.save_pretrained(tmp_path / "models" / "m")
    fingerprint = json.loads((target / "care_config.json").read_text())["space_fingerprint"]
    monkeypatch.setattr(saving, "write_model", failing(errno.EIO))
    with pytest.raises(WriteError) as caught:
        embedder.save_pretrained(target)
    assert not isinstance(caught.value, DiskFullError)
    assert "an I/O error" in str(caught.value) and "is as it was" in str(caught.value)
    assert_intact(target.parent, target, fingerprint)


def dtypes_of(file: Path) -> set[str]:
    with safe_open(str(file), "pt") as fh:
        return {fh.get_slice(k).get_dtype() for k in fh.keys()}  # noqa: SIM118


def test_each_tower_is_written_in_its_dtype_and_held_as_written(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = AsymmetricEmbedder.from_pretrained(tiny_model_dir, device="cpu", dtype="fp32")
    document = model.tower("document").transformer.auto_model
    before = {k: v.clone() for k, v in document.state_dict().items()}
    before_hash = model.hash_document_weights()
    target = saving.save_model(model, tmp_path / "m", dtypes={"query": torch.float32, "document": torch.bfloat16})
    assert dtypes_of(target / "document_0_Transformer" / "model.safetensors") == {"BF16"}
    assert dtypes_of(target / "query_0_Transformer" / "model.safetensors") == {"F32"}
    # cast back to the dtype it is held in, holding the rounded weights that were written (and hashed)
    assert {p.dtype for p in document.parameters()} == {torch.float32}
    assert all(torch.equal(v, before[k].to(torch.bfloat16).float()) for k, v in document.state_dict().items())
    # the fingerprint hashed from the weights as written (in bf16), and kept: the model says what was saved
    saved = json.loads((target / "care_config.json").read_text())["space_fingerprint"]
    assert saved == model.document_weights() != before_hash


def test_a_known_fingerprint_is_kept_only_when_asked_and_write_false_writes_nothing(
    embedder: AsymmetricEmbedder, tmp_path: Path
) -> None:
    known = embedder.with_config(space_fingerprint="known")
    assert saving.save_model(known, tmp_path / "none", rehash=False, write=False) == tmp_path / "none"
    assert not (tmp_path / "none").exists()
    kept = saving.save_model(known, tmp_path / "kept", rehash=False)
    assert json.loads((kept / "care_config.json").read_text())["space_fingerprint"] == "known"
    hashed = known.save_pretrained(tmp_path / "hashed")
    real = embedder.hash_document_weights()
    assert json.loads((hashed / "care_config.json").read_text())["space_fingerprint"] == real
    assert known.document_weights() == real  # what was saved is what it now says


REPO = Path(__file__).resolve().parents[2]
# a model folder's writes: its care_config.json, and sentence-transformers' save of the towers
WRITES_A_MODEL = re.compile(r"(CONFIG_NAME|[\"']care_config\.json[\"'])\)\.write_(text|bytes)\(|\.save\(str\(")


def test_one_module_writes_a_model_folder() -> None:
    """save_pretrained, training's stages and exports and ``init`` all write through model/saving.py."""
    writers = sorted(
        str(file.relative_to(REPO))
        for folder in ("care_retriever", "integrations", "training")
        for file in (REPO / folder).rglob("*.py")
        if WRITES_A_MODEL.search(file.read_text("utf-8"))
    )
    assert writers == ["care_retriever/model/saving.py"]
