"""The document tower's RMSNorm layers through torch's fused kernel: the same vectors as the model's own norms (on
the tiny Qwen3 tower, a Qwen3-Embedding-format tower and the release layout), the model's own code wherever the
fused kernel is not what runs (gradients, autocast, another dtype), a copy of a fused tower reading its own
weights, the choice ``auto`` makes and its report, and the refusal on a tower without a fusable norm."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from care_retriever.errors import InputError, ModelError
from care_retriever.indexing.config import EncodeConfig
from care_retriever.model.embedder import AsymmetricEmbedder
from care_retriever.model.encoding import encode_texts
from care_retriever.model.forward import document_forward, forward_state, prepare_document_forward
from care_retriever.model.fused_norms import fusable_norms, fuse_norms, norms_fused, unfuse_norms
from tests.fixtures.release import make_release_fixtures as release
from tests.support.cli import run_cli
from tests.support.data import MIXED_LENGTH_TEXTS
from tests.support.hub_towers import write_qwen3_embedding


def _document_model(folder: Path) -> torch.nn.Module:
    return AsymmetricEmbedder.from_pretrained(str(folder), load="document", device="cpu").document_model


def _fused_matches_own(model: torch.nn.Module) -> None:
    norms = fusable_norms(model)
    layers = model[0].auto_model.config.num_hidden_layers
    assert len(norms) == 4 * layers + 1  # before attention and the MLP, the query and key heads; the final norm
    own = encode_texts(model, MIXED_LENGTH_TEXTS, batch_size=3, prefetch=False)
    state = prepare_document_forward(model, forward="padded", compile="off", norms="fused")
    assert state.norms == "fused" and forward_state(model).norms == "fused"
    assert all("forward" in vars(norm) for norm in norms)
    fused = encode_texts(model, MIXED_LENGTH_TEXTS, batch_size=3, prefetch=False)
    cosine = (own * fused).sum(axis=1) / (np.linalg.norm(own, axis=1) * np.linalg.norm(fused, axis=1))
    assert cosine.min() >= 0.99999, cosine


def test_fused_norms_give_the_tiny_towers_vectors(tiny_model_dir: Path) -> None:
    _fused_matches_own(_document_model(tiny_model_dir))


def test_fused_norms_give_a_qwen3_embedding_towers_vectors(tmp_path: Path) -> None:
    folder = write_qwen3_embedding(tmp_path / "qwen3-embedding")  # left padding, grouped-query heads (4 / 2)
    _fused_matches_own(AsymmetricEmbedder.from_towers(str(folder), str(folder), device="cpu").document_model)


def test_fused_norms_give_the_release_layouts_vectors(tmp_path: Path) -> None:
    root = release.build_release_fixture("bert", tmp_path / "release")
    _fused_matches_own(AsymmetricEmbedder.from_release(str(root), load="document", device="cpu").document_model)


def test_the_fused_norm_is_torchs_rms_norm_in_inference_and_the_models_own_code_elsewhere(
    tiny_model_dir: Path,
) -> None:
    """In bf16 the two differ by one rounding (the weight applied before the cast back, not after), which tells
    which code ran: the fused call in inference in the weights' dtype; the model's own with gradients, under
    autocast, or with an input of another dtype."""
    model = _document_model(tiny_model_dir).to(torch.bfloat16)
    norm = fusable_norms(model)[0]
    torch.manual_seed(0)
    norm.weight.data.normal_()
    x = torch.randn(256, norm.weight.shape[-1]).to(torch.bfloat16)
    with torch.no_grad():
        own = type(norm).forward(norm, x)
        kernel = torch.nn.functional.rms_norm(x, (x.shape[-1],), norm.weight, norm.variance_epsilon)
    assert not torch.equal(own, kernel), "the check needs the two roundings to differ"
    fuse_norms(model)
    with torch.inference_mode():
        assert torch.equal(norm(x), kernel)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(norm(x), own)
    with torch.no_grad():
        assert torch.equal(norm(x.float()), type(norm).forward(norm, x.float()))
    x.requires_grad_(True)
    found = norm(x)
    assert torch.equal(found.detach(), own)
    found.float().sum().backward()  # the model's own code has its gradients
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_a_copy_of_a_fused_tower_reads_its_own_weights(tiny_model_dir: Path) -> None:
    model = _document_model(tiny_model_dir)
    fuse_norms(model)
    twin = copy.deepcopy(model)
    assert norms_fused(twin)
    before = encode_texts(model, MIXED_LENGTH_TEXTS, batch_size=4, prefetch=False)
    with torch.no_grad():
        for norm in fusable_norms(twin):
            norm.weight.mul_(torch.linspace(0.1, 3.0, norm.weight.shape[-1]))
    changed = encode_texts(twin, MIXED_LENGTH_TEXTS, batch_size=4, prefetch=False)
    assert not np.allclose(before, changed, atol=1e-3)  # the copy's norms read the copy's weights
    np.testing.assert_array_equal(encode_texts(model, MIXED_LENGTH_TEXTS, batch_size=4, prefetch=False), before)
    unfuse_norms(model)
    assert not norms_fused(model) and not any("forward" in vars(norm) for norm in fusable_norms(model))


def test_auto_keeps_the_models_own_norms_on_the_cpu_and_a_training_block_gives_them_back(tiny_model_dir: Path) -> None:
    model = _document_model(tiny_model_dir)
    assert prepare_document_forward(model, forward="padded", compile="off").norms == "eager"
    assert not norms_fused(model)
    other = _document_model(tiny_model_dir)
    with document_forward(other, "padded", "off", norms="fused") as state:
        assert state.norms == "fused" and norms_fused(other)
    assert not norms_fused(other) and not any("forward" in vars(norm) for norm in fusable_norms(other))
    assert forward_state(other).norms == "eager"


def test_norms_fused_is_refused_in_one_line_on_a_tower_without_a_fusable_norm(tiny_model_dir: Path) -> None:
    embedder = AsymmetricEmbedder.from_pretrained(str(tiny_model_dir), load="query", device="cpu")
    with pytest.raises(ModelError, match=r"^--norms fused: the tower's norm layers \(.*LayerNorm.*\) have no fused"):
        prepare_document_forward(embedder.query_model, forward="padded", norms="fused")
    with pytest.raises(InputError, match=r"Unknown --norms 'fast'. Available: \['auto', 'fused', 'eager'\]"):
        EncodeConfig(norms="fast")


def test_index_json_names_the_norms(capsys, tmp_path: Path, tiny_model_dir: Path, small_corpus_path: Path) -> None:
    args = ["--model", tiny_model_dir, "--corpus", small_corpus_path, "--no-progress", "--json", "--no-sparse"]
    code, out, err = run_cli(capsys, "index", *args, "--store", f"faiss:{tmp_path / 'a'}")
    assert code == 0, err
    assert json.loads(out)["norms"] == "eager"  # auto on the CPU
    code, out, err = run_cli(capsys, "index", *args, "--store", f"faiss:{tmp_path / 'b'}", "--norms", "fused")
    assert code == 0, err
    assert json.loads(out)["norms"] == "fused"
    code, _, err = run_cli(capsys, "index", *args, "--store", f"faiss:{tmp_path / 'c'}", "--norms", "fast")
    assert code != 0 and "Unknown --norms 'fast'" in err and "Traceback" not in err
