"""The document tower's forward pass: packed passes give the padded passes' vectors, the packing itself (offsets,
positions restarting per text, pooled rows), the choice of path and its report, the FP8 refusal and its CPU
emulation, and the fallback of a compile that fails. All on tiny towers, on the CPU: the packed pass here runs the
reference attention (SDPA text by text), the same packing the CUDA kernels compute."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from care_retriever.errors import InputError, ModelError
from care_retriever.indexing.config import EncodeConfig
from care_retriever.model.batch_limits import BatchLimits
from care_retriever.model.embedder import AsymmetricEmbedder
from care_retriever.model.encoding import encode_texts
from care_retriever.model.forward import forward_state, prepare_document_forward
from care_retriever.model.fp8 import emulate_fp8, fp8_refusal, quantize_fp8, round_rowwise, scaled_mm_linear
from care_retriever.model.runtime import resolve_dtype
from care_retriever.model.towers.packed import (
    can_pack,
    disable_packed,
    is_packed,
    pack_features,
    torch_varlen_kwargs,
    varlen_backend,
    varlen_scale_kwargs,
)
from tests.fixtures.release import make_release_fixtures as release
from tests.support.cli import run_cli
from tests.support.data import MIXED_LENGTH_TEXTS
from tests.support.hub_towers import write_qwen3_embedding

TEXTS = MIXED_LENGTH_TEXTS


def _tokens(model, texts: list[str]) -> np.ndarray:
    return model.preprocess(texts)["attention_mask"].sum(dim=1).numpy()


def _packed_matches_padded(model) -> None:
    """Vectors of every text, padded passes vs packed ones, with a token budget one text fills exactly."""
    assert can_pack(model) is None, can_pack(model)
    lengths = _tokens(model, TEXTS)
    assert lengths.min() <= 2, "a text of one or two tokens is part of the check"
    budget = int(lengths.max())  # the longest text fills a packed pass exactly
    limits = BatchLimits(4, budget)
    padded = encode_texts(model, TEXTS, limits=limits, prefetch=False)
    stats: dict[str, int] = {}
    prepare_document_forward(model, forward="packed", compile="off")
    seen: list[tuple[tuple[int, ...], bool, bool]] = []  # what each pass handed the tower's Transformer module

    def look(_module, args) -> None:
        features = args[0]
        seen.append((tuple(features["input_ids"].shape), "cu_seq_lens_q" in features, "attention_mask" in features))

    hook = model[0].register_forward_pre_hook(look)
    try:
        assert is_packed(model) and forward_state(model).forward == "packed"
        assert forward_state(model).attention == "reference"  # the CPU: SDPA text by text
        packed = encode_texts(model, TEXTS, limits=BatchLimits(4, budget), stats=stats, prefetch=False)
    finally:
        hook.remove()
        disable_packed(model)
    assert seen and all(shape[0] == 1 and cu and not mask for shape, cu, mask in seen), seen
    assert max(shape[1] for shape, _, _ in seen) == budget  # the longest text fills a pass exactly
    norms = np.linalg.norm(padded, axis=1) * np.linalg.norm(packed, axis=1)  # the release layout cuts unnormalised
    cosine = (padded * packed).sum(axis=1) / norms
    assert cosine.min() >= 0.9999, cosine
    # nothing padded in a packed pass, and no pass over the budget (the longest alone, exactly at it)
    assert stats["padded_tokens"] == stats["tokens"] == int(lengths.sum())
    assert stats["batches"] >= int(np.ceil(lengths.sum() / budget))


def test_packed_equals_padded_on_the_tiny_tower(tiny_model_dir: Path) -> None:
    embedder = AsymmetricEmbedder.from_pretrained(str(tiny_model_dir), load="document", device="cpu")
    _packed_matches_padded(embedder.document_model)


def test_packed_equals_padded_on_a_qwen3_embedding_tower(tmp_path: Path) -> None:
    folder = write_qwen3_embedding(tmp_path / "qwen3-embedding")  # left padding, grouped-query heads (4 / 2)
    embedder = AsymmetricEmbedder.from_towers(str(folder), str(folder), device="cpu")
    config = embedder.document_model[0].auto_model.config
    assert config.num_attention_heads != config.num_key_value_heads
    _packed_matches_padded(embedder.document_model)


def test_packed_equals_padded_on_the_release_layout(tmp_path: Path) -> None:
    root = release.build_release_fixture("bert", tmp_path / "release")
    embedder = AsymmetricEmbedder.from_release(str(root), load="document", device="cpu")
    _packed_matches_padded(embedder.document_model)


@pytest.mark.parametrize("side", ["left", "right"])
def test_pack_features_lays_texts_end_to_end(side: str) -> None:
    lengths = [3, 1, 5]
    width = max(lengths)
    ids = torch.zeros(3, width, dtype=torch.long)
    mask = torch.zeros(3, width, dtype=torch.long)
    for row, n in enumerate(lengths):
        cols = slice(width - n, width) if side == "left" else slice(0, n)
        ids[row, cols] = torch.arange(1, n + 1) + 10 * (row + 1)
        mask[row, cols] = 1
    packed = pack_features({"input_ids": ids, "attention_mask": mask, "prompt_length": 0})
    assert packed["input_ids"].tolist() == [[11, 12, 13, 21, 31, 32, 33, 34, 35]]
    assert packed["position_ids"].tolist() == [[0, 1, 2, 0, 0, 1, 2, 3, 4]]
    assert packed["cu_seq_lens_q"].tolist() == packed["cu_seq_lens_k"].tolist() == [0, 3, 4, 9]
    assert packed["cu_seq_lens_q"].dtype == torch.int32
    assert packed["max_length_q"] == packed["max_length_k"] == 5
    assert "attention_mask" not in packed and packed["prompt_length"] == 0
    # the last token of each text, where last-token pooling reads it
    last = packed["input_ids"][0, packed["cu_seq_lens_q"][1:].long() - 1]
    assert last.tolist() == [13, 21, 35]


def test_torch_varlen_is_asked_for_causal_grouped_query_attention_as_its_version_takes_it() -> None:
    # torch 2.10: is_causal, no enable_gqa (the key/value heads are repeated); later: window_size (-1, 0), enable_gqa
    assert torch_varlen_kwargs({"is_causal", "scale"}, 32, 8) == ({"is_causal": True}, True)
    assert torch_varlen_kwargs({"window_size", "scale"}, 32, 8) == ({"window_size": (-1, 0)}, True)
    assert torch_varlen_kwargs({"window_size", "enable_gqa"}, 32, 8) == (
        {"window_size": (-1, 0), "enable_gqa": True},
        False,
    )
    assert torch_varlen_kwargs({"window_size", "enable_gqa"}, 8, 8) == ({"window_size": (-1, 0)}, False)


def test_the_varlen_kernel_is_looked_up_once_and_compiled_attention_reads_it_without_a_graph_break(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Found on an H100: the lookup (importlib's find_spec) ran inside each compiled layer's attention and broke the
    # graph there. Once looked up, reading it is plain data that torch.compile traces.
    import importlib.util

    first = varlen_backend(torch.device("cuda"))
    looked_up: list[str] = []
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: looked_up.append(name) or real_find_spec(name, *a)
    )
    assert [varlen_backend(torch.device("cuda")) for _ in range(3)] == [first] * 3
    assert looked_up == []

    @torch.compile(fullgraph=True, backend="eager")  # fullgraph: a graph break is an error
    def reads_the_backend(x: torch.Tensor) -> torch.Tensor:
        return x + 1 if varlen_backend(torch.device("cuda")) is None else x - 1

    x = torch.ones(3)
    torch.testing.assert_close(reads_the_backend(x), x + 1 if first is None else x - 1)


def test_torch_varlen_gets_the_towers_softmax_scale_with_or_without_a_scale_parameter() -> None:
    # torch 2.11 on: scale=; torch 2.10 scales by head_dim ** -0.5 itself, so the queries are multiplied first
    assert varlen_scale_kwargs({"scale", "window_size"}, 0.3, 64) == ({"scale": 0.3}, 1.0)
    kwargs, factor = varlen_scale_kwargs({"is_causal"}, 64**-0.5, 64)
    assert kwargs == {} and factor == pytest.approx(1.0)
    q, k, v = (torch.randn(1, 4, 7, 64) for _ in range(3))
    _, factor = varlen_scale_kwargs({"is_causal"}, 0.3, 64)
    wanted = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)
    by_default_scale = torch.nn.functional.scaled_dot_product_attention(q * factor, k, v, is_causal=True)
    torch.testing.assert_close(by_default_scale, wanted, rtol=1e-5, atol=1e-5)


def test_auto_pads_where_no_varlen_kernel_runs_and_says_why(tiny_model_dir: Path) -> None:
    assert varlen_backend("cpu") is None
    embedder = AsymmetricEmbedder.from_pretrained(str(tiny_model_dir), load="document", device="cpu")
    state = prepare_document_forward(embedder.document_model)
    assert (state.forward, state.compile, state.dtype) == ("padded", "off", "float32")
    assert state.padded_because == "no variable-length attention kernel on cpu"
    assert not is_packed(embedder.document_model)
    assert prepare_document_forward(embedder.document_model, forward="packed") is state  # decided once per tower


def test_a_query_tower_cannot_pack(tiny_model_dir: Path) -> None:
    embedder = AsymmetricEmbedder.from_pretrained(str(tiny_model_dir), load="query", device="cpu")
    assert can_pack(embedder.query_model) == "the tower is not a decoder"
    with pytest.raises(ModelError, match=r"^--forward packed: the tower is not a decoder"):
        prepare_document_forward(embedder.query_model, forward="packed")


def test_index_json_names_the_forward_path_dtype_and_compile_state(
    capsys, tmp_path: Path, tiny_model_dir: Path, small_corpus_path: Path
) -> None:
    args = ["--model", tiny_model_dir, "--corpus", small_corpus_path, "--no-progress", "--json", "--no-sparse"]
    code, out, err = run_cli(capsys, "index", *args, "--store", f"faiss:{tmp_path / 'a'}")
    assert code == 0, err
    report = json.loads(out)
    assert (report["forward"], report["dtype"], report["compile"]) == ("padded", "float32", "off")
    assert report["compile_seconds"] == 0.0
    code, out, err = run_cli(capsys, "index", *args, "--store", f"faiss:{tmp_path / 'b'}", "--forward", "packed")
    assert code == 0, err
    report = json.loads(out)
    assert (report["forward"], report["attention"]) == ("packed", "reference")
    assert report["padding_ratio"] == 1.0
    code, _, err = run_cli(capsys, "index", *args, "--store", f"faiss:{tmp_path / 'c'}", "--dtype", "fp8")
    assert code != 0 and "--dtype fp8 runs on CUDA GPUs of compute capability >= 8.9" in err
    assert "Traceback" not in err and not (tmp_path / "c").exists()


def test_encode_config_checks_the_forward_options() -> None:
    assert EncodeConfig(dtype="fp8", forward="packed", compile="on").compile == "on"
    with pytest.raises(InputError, match="Unknown --forward 'flat'"):
        EncodeConfig(forward="flat")
    with pytest.raises(InputError, match="Unknown --compile 'yes'"):
        EncodeConfig(compile="yes")


def test_fp8_is_refused_in_one_line_where_it_does_not_run() -> None:
    assert "not on cpu" in str(fp8_refusal("cpu"))
    assert "this one is 8.0" in str(fp8_refusal("cuda", capability=(8, 0)))  # A100
    assert "this one is 8.6" in str(fp8_refusal("cuda", capability=(8, 6)))
    assert fp8_refusal("cuda", capability=(8, 9)) is None  # Ada
    assert fp8_refusal("cuda", capability=(9, 0)) is None  # Hopper
    with pytest.raises(ModelError, match=r"^--dtype fp8 runs on CUDA GPUs") as caught:
        resolve_dtype("fp8", "cpu")
    assert "\n" not in str(caught.value)


def test_fp8_rounding_is_rowwise_e4m3() -> None:
    x = torch.tensor([[1.0, -3.0, 448.0 * 2], [1e-3, 2e-3, -4e-3]])
    q, scale = round_rowwise(x)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (2, 1)
    assert scale[:, 0].tolist() == pytest.approx([2.0, 4e-3 / 448])  # each row's largest maps to e4m3's 448
    back = q.float() * scale
    assert torch.allclose(back, x, rtol=0.07)  # e4m3 keeps 3 mantissa bits
    assert back[0, 2] == x[0, 2]


def test_fp8_emulation_moves_the_vectors_a_little(tiny_model_dir: Path) -> None:
    embedder = AsymmetricEmbedder.from_pretrained(str(tiny_model_dir), load="document", device="cpu")
    model = embedder.document_model
    fingerprint = embedder.space_fingerprint
    exact = encode_texts(model, TEXTS, prefetch=False)
    assert emulate_fp8(model) == 2 * 7  # two layers: q, k, v, o, gate, up, down
    rounded = encode_texts(model, TEXTS, prefetch=False)
    cosine = (exact * rounded).sum(axis=1)
    assert 0.95 < cosine.min() < 1 - 1e-6  # rounded, not untouched (a random tower: wide weights)
    assert embedder.space_fingerprint == fingerprint


def test_the_fp8_emulation_rounds_as_the_fp8_matmul_does_in_bf16(tiny_model_dir: Path) -> None:
    """In bf16, as an FP8 run computes: an emulated Linear gives what torch's scaled matmul (the FP8 path's own
    function, which also runs on the CPU) gives for the same rounded rows, one rounding to bf16 at the end."""
    embedder = AsymmetricEmbedder.from_pretrained(str(tiny_model_dir), load="document", device="cpu")
    model = embedder.document_model.to(torch.bfloat16)
    weights = {m: m.weight.detach().clone() for m in model.modules() if isinstance(m, torch.nn.Linear)}
    assert emulate_fp8(model) == 2 * 7
    linears = [m for m in weights if hasattr(m, "care_fp8_weight")]  # the decoder layers' (not a projection head)
    weights = {m: weights[m] for m in linears}
    generator = torch.Generator().manual_seed(0)
    assert len(linears) == 2 * 7
    for linear, weight in weights.items():
        x = torch.randn(3, 7, linear.in_features, generator=generator).to(torch.bfloat16)
        w_q, w_scale = round_rowwise(weight)
        torch.testing.assert_close(linear(x), scaled_mm_linear(x, w_q, w_scale, linear.bias), rtol=0, atol=0)
        assert torch.equal(linear.weight, weight)  # the weights stay as loaded


def test_a_compile_that_fails_falls_back_to_eager_in_one_line(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    embedder = AsymmetricEmbedder.from_pretrained(str(tiny_model_dir), load="document", device="cpu")
    model = embedder.document_model
    before = encode_texts(model, TEXTS, prefetch=False)

    def no_compiler(fn, **kwargs):
        def broken(*args, **kw):
            raise RuntimeError("no C++ compiler found\nsecond line")

        return broken

    monkeypatch.setattr(torch, "compile", no_compiler)
    state = prepare_document_forward(model, compile="on")
    assert state.compile == "off (failed: no C++ compiler found)"
    assert "torch.compile of the document tower failed (no C++ compiler found); running eager" in caplog.text
    np.testing.assert_allclose(encode_texts(model, TEXTS, prefetch=False), before, atol=1e-6)


def test_the_fp8_matmul_computes_the_rounded_product() -> None:
    """torch's scaled matmul (which also runs on the CPU) with the rowwise scales as the FP8 tower lays them out:
    the product of the rounded operands, close to the exact one."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(32, 64, generator=generator)
    bias = torch.randn(32, generator=generator)
    x = torch.randn(3, 5, 64, generator=generator)
    w_q, w_scale = round_rowwise(weight)
    out = scaled_mm_linear(x, w_q, w_scale, bias)
    x_q, x_scale = round_rowwise(x)
    rounded = (x_q.float() * x_scale) @ (w_q.float() * w_scale).T + bias
    assert out.shape == (3, 5, 32)
    torch.testing.assert_close(out, rounded, rtol=1e-4, atol=1e-3)
    cosine = torch.nn.functional.cosine_similarity(out.flatten(), (x @ weight.T + bias).flatten(), dim=0)
    assert 0.998 < cosine < 1


def test_quantizing_a_tower_to_fp8_is_refused_on_the_cpu(tiny_model_dir: Path) -> None:
    embedder = AsymmetricEmbedder.from_pretrained(str(tiny_model_dir), load="document", device="cpu")
    with pytest.raises(ModelError, match=r"^--dtype fp8 runs on CUDA GPUs"):
        quantize_fp8(embedder.document_model)


def test_the_writer_hashes_the_document_weights_before_their_forward_pass_is_set_up(
    tmp_path: Path, sample_corpus_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found on an H100: `--dtype fp8` replaced the Linear weights by torchao's float8 tensors before the space
    # fingerprint hashed them, and the hash could not read them (the run stopped). The weights are hashed as loaded.
    from care_retriever.indexing.writer import DocumentStoreWriter
    from care_retriever.model import forward as forward_module
    from care_retriever.model.towers.scratch import init_from_scratch

    embedder = init_from_scratch("tiny", [sample_corpus_path])  # no fingerprint recorded: the weights are hashed
    events: list[str] = []
    hash_weights = AsymmetricEmbedder.hash_document_weights
    prepare = forward_module.prepare_document_forward

    def hashing(self: AsymmetricEmbedder) -> str:
        events.append("hash")
        return hash_weights(self)

    def preparing(*args: object, **kwargs: object) -> object:
        events.append("prepare")
        return prepare(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(AsymmetricEmbedder, "hash_document_weights", hashing)
    monkeypatch.setattr(forward_module, "prepare_document_forward", preparing)
    writer = DocumentStoreWriter(embedder, f"faiss:{tmp_path / 's'}", show_progress=False, sparse=False)
    assert events == ["hash", "prepare"]
    writer.store.close()
