"""The encoding loop's batches: a padded-token budget, input order kept, and the out-of-memory back-off.

The towers are real (the tiny saved model's document tower). Running out of GPU memory is played by a
real module placed after the tower's transformer that raises torch.OutOfMemoryError, as the CUDA
allocator does, when a batch holds more padded tokens than it allows: the loop under test is unchanged.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.modules import Module

from care_retriever.errors import InputError, ModelError
from care_retriever.model.batch_limits import BatchLimits
from care_retriever.model.batch_sizing import Batches
from care_retriever.model.embedder import AsymmetricEmbedder
from care_retriever.model.encoding import encode_texts
from care_retriever.model.features import sequence_lengths
from care_retriever.model.runtime import auto_dtype, gpu_dtype, resolve_attn_implementation, resolve_dtype

# Texts of many lengths (1 to 60 characters), in no length order.
CHARS = "高血压患者应低盐饮食规律服用降压药定期监测感冒多由病毒引起休息喝水糖尿病控制运动"
TEXTS = [CHARS[(7 * i) % 20 :][: 1 + (37 * i) % 60] or CHARS[:3] for i in range(40)]


@pytest.fixture(scope="module")
def tower(tiny_model_dir: Path) -> SentenceTransformer:
    return AsymmetricEmbedder.from_pretrained(tiny_model_dir, load="document", device="cpu").document_model


def _shapes(model: SentenceTransformer) -> tuple[list[tuple[int, int]], torch.utils.hooks.RemovableHandle]:
    """Record (texts, padded tokens) of every forward pass the tower's transformer runs."""
    shapes: list[tuple[int, int]] = []
    handle = model[0].register_forward_pre_hook(lambda _m, args: shapes.append(tuple(args[0]["input_ids"].shape)))
    return shapes, handle


def test_batches_follow_the_token_budget_and_the_text_cap() -> None:
    lengths = np.array([5, 10, 1, 5, 9, 5, 2])
    order = np.argsort(-lengths, kind="stable")  # 10, 9, 5, 5, 5, 2, 1
    got = [lengths[b].tolist() for b in Batches(order, lengths, BatchLimits(texts=3, tokens=20))]
    # 2 x 10 = 20 fits; 3 x 5 = 15 (a 4th would pass the cap of 3); 2 and 1 together
    assert got == [[10, 9], [5, 5, 5], [2, 1]]
    # a text longer than the whole budget goes alone instead of never
    assert [lengths[b].tolist() for b in Batches(order, lengths, BatchLimits(texts=8, tokens=4))][:2] == [[10], [9]]


def test_token_budget_batches_keep_input_order_and_the_budget(tower: SentenceTransformer) -> None:
    reference = encode_texts(tower, TEXTS, batch_size=1)
    budget = 120
    shapes, handle = _shapes(tower)
    try:
        vectors = encode_texts(tower, TEXTS, batch_size=16, max_batch_tokens=budget)
    finally:
        handle.remove()
    np.testing.assert_allclose(vectors, reference, atol=1e-5)  # row i is text i's vector
    assert sum(n for n, _ in shapes) == len(TEXTS)
    assert all(n * tokens <= budget or n == 1 for n, tokens in shapes), shapes
    assert max(n for n, _ in shapes) <= 16
    # The budget packs short texts many to a batch and long ones few: fewer passes than texts, more than a
    # fixed batch of 16 would take, and the batch size grows as the texts get shorter.
    assert len(TEXTS) // 16 < len(shapes) < len(TEXTS)
    sizes = [n for n, _ in shapes]
    assert sizes[0] < sizes[-2]


def test_bad_batch_limits_are_input_errors(tower: SentenceTransformer) -> None:
    with pytest.raises(InputError, match="max_batch_tokens must be >= 1"):
        encode_texts(tower, TEXTS, max_batch_tokens=0)
    with pytest.raises(InputError, match="batch_size must be >= 1"):
        encode_texts(tower, TEXTS, batch_size=0)


class OutOfMemoryAbove(Module):
    """Passes features through; raises torch.OutOfMemoryError for a batch of more than ``tokens`` padded tokens."""

    config_keys: ClassVar[list[str]] = []

    def __init__(self, tokens: int) -> None:
        super().__init__()
        self.tokens = tokens

    def forward(self, features: dict[str, torch.Tensor], **kwargs) -> dict[str, torch.Tensor]:
        n, length = features["input_ids"].shape
        if n * length > self.tokens:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {n * length} tokens' activations")
        return features

    def save(self, *args, **kwargs) -> None:  # never saved
        raise NotImplementedError


def _limited(tower: SentenceTransformer, tokens: int) -> SentenceTransformer:
    modules = list(tower)
    return SentenceTransformer(modules=[modules[0], OutOfMemoryAbove(tokens), *modules[1:]], device="cpu")


def test_out_of_memory_halves_the_batch_retries_and_says_so(
    tower: SentenceTransformer, caplog: pytest.LogCaptureFixture
) -> None:
    texts = [CHARS[i : i + 30] for i in range(12)]  # one length: every batch pads to the same tokens
    reference = encode_texts(tower, texts, batch_size=1)
    padded = len(tower.tokenize(texts[:1])["input_ids"][0])
    limited = _limited(tower, tokens=3 * padded)  # 3 texts fit, 4 do not
    limits = BatchLimits(texts=16)
    with caplog.at_level(logging.WARNING, logger="care_retriever"):
        vectors = encode_texts(limited, texts, limits=limits)
    np.testing.assert_allclose(vectors, reference, atol=1e-5)
    messages = [r.getMessage() for r in caplog.records if "out of memory" in r.getMessage()]
    assert messages == [
        f"Encoding: out of memory at 12 texts x {padded} tokens; retrying with 6",
        f"Encoding: out of memory at 6 texts x {padded} tokens; retrying with 3",
    ]
    assert limits.texts == 3  # kept: the caller's next call starts where this one ended
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="care_retriever"):
        encode_texts(limited, texts, limits=limits)
    assert not [r for r in caplog.records if "out of memory" in r.getMessage()]


def test_out_of_memory_lowers_the_token_budget_too(tower: SentenceTransformer) -> None:
    limits = BatchLimits(texts=64, tokens=10_000)
    reference = encode_texts(tower, TEXTS, batch_size=1)
    vectors = encode_texts(_limited(tower, tokens=150), TEXTS, limits=limits)
    np.testing.assert_allclose(vectors, reference, atol=1e-5)
    assert limits.tokens is not None and limits.tokens <= 150


def test_one_text_that_does_not_fit_is_one_line(tower: SentenceTransformer) -> None:
    with pytest.raises(ModelError, match=r"out of memory on cpu encoding one text of \d+ tokens") as info:
        encode_texts(_limited(tower, tokens=2), TEXTS[:4], batch_size=4)
    assert "\n" not in str(info.value)


# ------------------------------------------------------------------ precision and attention choices
def test_auto_dtype_is_fp32_on_cpu_and_names_resolve() -> None:
    assert auto_dtype("cpu") == torch.float32 == resolve_dtype("auto", torch.device("cpu"))
    assert resolve_dtype(None, "cpu") == torch.float32
    assert [resolve_dtype(n, "cpu") for n in ("fp32", "bf16", "fp16")] == [torch.float32, torch.bfloat16, torch.float16]
    assert resolve_dtype("bfloat16", "cpu") == torch.bfloat16
    with pytest.raises(ModelError, match=r"Unknown dtype 'half'. Available dtypes: \['auto', 'saved', 'fp32'"):
        resolve_dtype("half", "cpu")


def test_a_gpu_without_bf16_runs_fp16_only_for_towers_that_allow_it() -> None:
    # native bf16 (Ampere on): bf16 whatever the tower
    assert gpu_dtype(True, "bfloat16") == gpu_dtype(True, "float32") == gpu_dtype(True, None) == torch.bfloat16
    # an older GPU (V100, T4): fp16 for a tower saved in fp32 or fp16, fp32 for one pretrained in bf16 (Qwen3),
    # whose activations would overflow fp16 to inf
    assert gpu_dtype(False, "float32") == gpu_dtype(False, None) == gpu_dtype(False, "float16") == torch.float16
    assert gpu_dtype(False, "bfloat16") == torch.float32
    # asked for explicitly, fp16 for a bf16-pretrained tower is one line, on any device
    with pytest.raises(ModelError, match="pretrained in bf16 and overflows fp16") as info:
        resolve_dtype("fp16", "cpu", "bfloat16")
    assert "\n" not in str(info.value)
    assert resolve_dtype("fp16", "cpu", "float32") == torch.float16


def test_saved_dtype_is_the_towers_own_whatever_the_device() -> None:
    for device in ("cpu", "cuda"):  # "saved" never asks the device
        assert resolve_dtype("saved", device, "bfloat16") == torch.bfloat16
        assert resolve_dtype("saved", device, "float32") == torch.float32
        assert resolve_dtype("saved", device, None) == torch.float32


def test_attention_choice_on_cpu() -> None:
    # auto leaves transformers' default (sdpa where the architecture has it); flash-attention needs CUDA
    assert resolve_attn_implementation("auto", "cpu", torch.float32) is None
    assert resolve_attn_implementation("eager", "cpu", torch.float32) == "eager"
    assert resolve_attn_implementation("sdpa", "cpu", torch.float32) == "sdpa"
    with pytest.raises(ModelError, match=r"flash_attention_2"):
        resolve_attn_implementation("flash_attention_2", "cpu", torch.float32)
    with pytest.raises(ModelError, match=r"Unknown attn_implementation 'flash'. Available: \['auto', 'sdpa'"):
        resolve_attn_implementation("flash", "cpu", torch.float32)


def test_the_attention_implementation_reaches_the_loaded_tower(tiny_model_dir: Path) -> None:
    for name in ("eager", "sdpa"):
        tower = AsymmetricEmbedder.from_pretrained(tiny_model_dir, load="document", attn_implementation=name)
        assert tower.document_model[0].auto_model.config._attn_implementation == name


def test_auto_takes_flash_attention_only_on_cuda_in_half_precision(monkeypatch: pytest.MonkeyPatch) -> None:
    import care_retriever.model.runtime as runtime_module

    # the flash_attn package is not installed on CI machines: its presence is what is stood in for here
    monkeypatch.setattr(runtime_module, "flash_attn_installed", lambda: True)
    assert resolve_attn_implementation("auto", "cuda", torch.bfloat16) == "flash_attention_2"
    assert resolve_attn_implementation(None, "cuda:1", torch.float16) == "flash_attention_2"
    assert resolve_attn_implementation("auto", "cuda", torch.float32) is None
    assert resolve_attn_implementation("auto", "cpu", torch.bfloat16) is None
    assert resolve_attn_implementation("sdpa", "cuda", torch.bfloat16) == "sdpa"
    with pytest.raises(ModelError, match=r"runs on CUDA in fp16/bf16 only, not on cpu in float32; use 'sdpa'"):
        resolve_attn_implementation("flash_attention_2", "cpu", torch.float32)


def test_embed_documents_takes_a_token_budget(tiny_model_dir: Path) -> None:
    embedder = AsymmetricEmbedder.from_pretrained(tiny_model_dir, load="document")
    shapes, handle = _shapes(embedder.document_model)
    try:
        budgeted = embedder.embed_documents(TEXTS, max_batch_tokens=100)
    finally:
        handle.remove()
    np.testing.assert_allclose(budgeted, embedder.embed_documents(TEXTS), atol=1e-5)
    assert all(n * tokens <= 100 or n == 1 for n, tokens in shapes) and len(shapes) > len(TEXTS) // 16 + 1


def test_lengths_of_padded_and_of_flattened_batches(tower: SentenceTransformer) -> None:
    """With flash-attention, sentence-transformers lays a batch's texts end to end without padding
    (transformers' DataCollatorWithFlattening): the budget and the truncation count read the same lengths."""
    from transformers import DataCollatorWithFlattening

    texts = TEXTS[:6]
    ids = tower.tokenizer(texts)["input_ids"]
    flat = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_position_ids=True)(
        [{"input_ids": row} for row in ids]
    )
    assert flat["input_ids"].shape[0] == 1 and "attention_mask" not in flat
    expected = [len(row) for row in ids]
    assert sequence_lengths(tower.preprocess(texts)).tolist() == expected
    assert sequence_lengths(flat).tolist() == expected


def test_the_dtypes_the_index_options_take_are_the_ones_the_embedder_resolves() -> None:
    """``index --dtype`` is checked (torch-free) by EncodeConfig against the names the embedder resolves: every
    one of them, ``saved`` included, and nothing else."""
    from care_retriever.indexing.config import EncodeConfig
    from care_retriever.model.loading import DTYPE_NAMES
    from care_retriever.model.runtime import DTYPES

    assert set(DTYPE_NAMES) - {"auto", "saved"} == set(DTYPES)
    for name in DTYPE_NAMES:
        assert EncodeConfig(dtype=name).dtype == name
        resolve_dtype(name, "cpu")  # every name the config takes resolves
    with pytest.raises(InputError, match=r"Unknown --dtype 'half'. Available: \['auto', 'saved'"):
        EncodeConfig(dtype="half")
