"""Training reads the document tower's forward pass as ``index`` decides it: Stage I's teacher cache encodes through
the packed path where asked (the same rows as padded), records and reports the path, and leaves the tower as
loaded; Stage II's document side runs packed with gradients (the same loss and gradients as padded); the recipe's
``forward`` / ``compile`` keys are checked. On tiny towers, on the CPU, where the packed pass is the reference
attention (SDPA text by text) that the CUDA kernels compute the same way."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from care_retriever.errors import InputError
from care_retriever.model.embedder import AsymmetricEmbedder
from care_retriever.model.forward import forward_state
from care_retriever.model.towers.packed import is_packed
from care_retriever.training.lora import LoraSpec
from care_retriever.training.recipe import build_stage, parse_recipe
from care_retriever.training.stage_common import lora_on
from care_retriever.training.teacher_cache import build_teacher_cache
from care_retriever.training.tower_forward import stage_document_forward
from tests.support.data import MIXED_LENGTH_TEXTS

TEXTS = MIXED_LENGTH_TEXTS


def _row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def _attention(embedder: AsymmetricEmbedder) -> str:
    return embedder.document_model[0].auto_model.config._attn_implementation


@pytest.mark.parametrize("full_width", [False, True])
def test_teacher_cache_rows_packed_equal_padded_and_the_path_is_recorded(
    tmp_path: Path, tiny_model_dir: Path, full_width: bool
) -> None:
    embedder = AsymmetricEmbedder.from_pretrained(str(tiny_model_dir), device="cpu")
    loaded_attention = _attention(embedder)
    caches = {}
    for forward in ("padded", "packed"):
        caches[forward] = build_teacher_cache(
            embedder,
            TEXTS,
            tmp_path / forward,
            batch_size=4,  # several texts of mixed lengths to a pass
            show_progress=False,
            full_width=full_width,
            forward=forward,
            compile="off",
        )
        # the tower runs as loaded after the cache: padded passes on its own attention, no decision kept
        assert not is_packed(embedder.document_model) and _attention(embedder) == loaded_attention
        assert forward_state(embedder.document_model).forward == "padded"
    padded, packed = caches["padded"], caches["packed"]
    assert padded.forward is not None and packed.forward is not None
    assert (padded.forward["forward"], padded.forward["padded_because"]) == ("padded", "asked for (--forward padded)")
    assert (packed.forward["forward"], packed.forward["attention"]) == ("packed", "reference")
    cosine = _row_cosines(np.asarray(padded.vectors), np.asarray(packed.vectors))
    assert cosine.min() >= 0.9999, cosine
    # the cache's record names the path that wrote its rows
    recorded = json.loads(packed.path.with_suffix(".json").read_text("utf-8"))["forward"]
    assert recorded == packed.forward


def test_a_teacher_cache_is_reused_whatever_path_reads_it_and_says_which_wrote_it(
    tmp_path: Path, tiny_model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    embedder = AsymmetricEmbedder.from_pretrained(str(tiny_model_dir), device="cpu")
    first = build_teacher_cache(embedder, TEXTS, tmp_path, show_progress=False)  # auto: padded on the CPU
    assert first.forward is not None and first.forward["forward"] == "padded"
    assert first.forward["padded_because"] == "no variable-length attention kernel on cpu"
    with caplog.at_level("INFO", logger="care_retriever"):
        again = build_teacher_cache(embedder, TEXTS, tmp_path, show_progress=False, forward="packed")
    assert again.reused and again.path == first.path and again.forward == first.forward
    assert np.array_equal(np.asarray(again.vectors), np.asarray(first.vectors))
    assert any("reusing the teacher cache" in r.message and "padded (sdpa" in r.message for r in caplog.records)


def test_a_teacher_cache_in_another_precision_is_encoded_again_not_reused(tmp_path: Path, tiny_model_dir: Path) -> None:
    embedder = AsymmetricEmbedder.from_pretrained(str(tiny_model_dir), device="cpu")
    fp32 = build_teacher_cache(embedder, TEXTS, tmp_path, show_progress=False)
    bf16 = build_teacher_cache(embedder, TEXTS, tmp_path, show_progress=False, dtype=torch.bfloat16)
    assert not bf16.reused and bf16.path != fp32.path
    # the bf16 rows really differ from the fp32 ones: reusing either for the other would train on other targets
    assert not np.allclose(np.asarray(bf16.vectors), np.asarray(fp32.vectors), atol=1e-4)
    assert build_teacher_cache(embedder, TEXTS, tmp_path, show_progress=False, dtype=torch.bfloat16).reused


def _stage2_loss_and_document_grads(embedder: AsymmetricEmbedder, forward: str) -> tuple[float, dict, list]:
    """One Stage II loss (Asym-InfoNCE: queries on the query tower, positives and hard negatives on the document
    tower) and the document tower's gradients, with its passes as ``forward`` decides."""
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    model = embedder.to_sentence_transformer()
    model.train()
    loss = MultipleNegativesRankingLoss(model, scale=20.0)
    queries = ["高血压吃什么", "感冒怎么办", "失眠", "宝宝发烧"]
    positives, negatives = TEXTS[:4], TEXTS[4:8]
    seen: list[tuple[bool, bool]] = []  # (packed, with an attention mask) of each pass the document tower got
    with stage_document_forward(embedder, forward, "test") as state:
        look = embedder.document_model[0].register_forward_pre_hook(
            lambda _m, args: seen.append(("cu_seq_lens_q" in args[0], "attention_mask" in args[0]))
        )
        features = [
            model.preprocess(queries, task="query"),
            model.preprocess(positives, task="document"),
            model.preprocess(negatives, task="document"),
        ]
        torch.manual_seed(0)  # the query tower's dropout draws the same masks in both runs
        value = loss(features, labels=None)
        value.backward()
        look.remove()
    grads = {
        name: p.grad.detach().clone()
        for name, p in embedder.document_model.named_parameters()
        if p.requires_grad and p.grad is not None
    }
    embedder.document_model.zero_grad(set_to_none=True)
    embedder.query_model.zero_grad(set_to_none=True)
    assert state["forward"] == forward
    return value.item(), grads, seen


@pytest.mark.parametrize("lora", [False, True])
def test_stage2_document_side_packed_gives_the_padded_loss_and_gradients(tiny_model_dir: Path, lora: bool) -> None:
    embedder = AsymmetricEmbedder.from_pretrained(str(tiny_model_dir), device="cpu")
    if lora:  # as Stage II runs it: LoRA on the document tower (no adapter dropout: the two runs draw alike)
        lora_on(embedder, LoraSpec(r=4, alpha=8, dropout=0.0), seed=0)
    padded_loss, padded_grads, padded_seen = _stage2_loss_and_document_grads(embedder, "padded")
    packed_loss, packed_grads, packed_seen = _stage2_loss_and_document_grads(embedder, "packed")
    assert padded_seen and all(not cu and mask for cu, mask in padded_seen), padded_seen
    assert packed_seen and all(cu and not mask for cu, mask in packed_seen), packed_seen
    assert abs(packed_loss - padded_loss) <= 1e-5 * abs(padded_loss), (packed_loss, padded_loss)
    assert padded_grads.keys() == packed_grads.keys() and padded_grads
    flat_padded = torch.cat([g.flatten() for g in padded_grads.values()])
    flat_packed = torch.cat([packed_grads[n].flatten() for n in padded_grads])
    assert flat_padded.norm() > 0
    assert torch.nn.functional.cosine_similarity(flat_padded, flat_packed, dim=0) >= 0.999
    for name, grad in padded_grads.items():
        if grad.norm() > 1e-6 * flat_padded.norm():  # LoRA's A matrices get no gradient while B is zero
            cosine = torch.nn.functional.cosine_similarity(grad.flatten(), packed_grads[name].flatten(), dim=0)
            assert cosine >= 0.999, (name, float(cosine))
    # after the block the tower pads again, on the attention it was loaded with
    assert not is_packed(embedder.document_model)
    assert _attention(embedder) == "sdpa"


def test_stage2_pads_a_tower_with_attention_dropout_which_the_packed_attention_lacks(tiny_model_dir: Path) -> None:
    embedder = AsymmetricEmbedder.from_pretrained(str(tiny_model_dir), device="cpu")
    embedder.document_model[0].auto_model.config.attention_dropout = 0.1
    with stage_document_forward(embedder, "auto", "stage 'joint'") as state:
        assert state["forward"] == "padded" and "attention dropout (0.1)" in state["padded_because"]
    refused = r"^stage 'joint': forward: packed computes no attention dropout"
    with pytest.raises(InputError, match=refused), stage_document_forward(embedder, "packed", "stage 'joint'"):
        pass
    assert not is_packed(embedder.document_model)


def test_recipe_forward_and_compile_keys_are_checked() -> None:
    where = "recipe.yaml: stage 's1'"
    stage = build_stage(
        {"name": "s1", "type": "stage1_align", "alignment": {"queries": ["a"]}, "forward": "packed", "compile": False},
        where,
    )
    assert (stage.forward, stage.compile) == ("packed", "off")  # YAML's bare `off` is a boolean
    with pytest.raises(InputError, match=r"forward must be one of \['auto', 'packed', 'padded'\], got 'pack'"):
        build_stage({"name": "s1", "type": "stage1_align", "alignment": {"queries": ["a"]}, "forward": "pack"}, where)
    with pytest.raises(InputError, match=r"compile must be one of \['auto', 'on', 'off'\], got 'yes'"):
        build_stage({"name": "s1", "type": "stage1_align", "alignment": {"queries": ["a"]}, "compile": "yes"}, where)
    joint = build_stage({"name": "s2", "type": "stage2_joint", "datasets": ["a"], "forward": "padded"}, where)
    assert joint.forward == "padded"
    with pytest.raises(InputError, match=r"does not take 'compile'; valid keys: .*forward"):
        build_stage({"name": "s2", "type": "stage2_joint", "datasets": ["a"], "compile": "on"}, where)
    raw = {
        "model": {"path": "m"},
        "datasets": {"a": "a.jsonl"},
        "defaults": {"forward": "sideways"},
        "stages": [{"name": "s2", "type": "stage2_joint", "datasets": ["a"]}],
    }
    with pytest.raises(InputError, match=r"defaults: forward must be one of"):
        parse_recipe(raw, "r.yaml")


def test_a_recipe_trains_stage1_and_stage2_on_the_packed_forward_and_reports_it(tmp_path: Path) -> None:
    """Through the trainer (its collator pads; the document tower's passes arrive packed): Stage I's cache and a
    recomputed teacher, Stage II with LoRA, each reports the path it ran; the saved towers run as loaded."""
    from care_retriever.training.runner import run_recipe
    from tests.support.data import condition_pairs, write_jsonl

    write_jsonl(tmp_path / "pairs.jsonl", condition_pairs())
    raw = {
        "name": "packed",
        "model": {"preset": "tiny", "vocab_from": ["pairs.jsonl"], "max_length": 32, "query_pooling": "mean"},
        "datasets": {"pairs": {"path": "pairs.jsonl"}},
        "defaults": {"per_device_train_batch_size": 8, "learning_rate": 2e-3, "forward": "packed"},
        "stages": [
            {"name": "stage1", "type": "stage1_align", "alignment": {"queries": ["pairs"], "documents": ["pairs"]}},
            {"name": "recompute", "type": "stage1_align", "datasets": ["pairs"], "teacher": "recompute"},
            # GradCache: the loss cuts a batch into mini-batches, each packed on its way into the tower
            {
                "name": "stage2",
                "type": "stage2_joint",
                "datasets": ["pairs"],
                "lora": {"r": 4, "alpha": 8},
                "mini_batch_size": 2,
            },
            # score distillation: its mined negatives and its teacher scores from the frozen tower, packed too
            {"name": "distill", "type": "distill", "datasets": ["pairs"], "hard_negatives": {"num": 1}},
        ],
    }
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny towers train faster on one thread, and the CI machine is shared
    try:
        result = run_recipe(parse_recipe(raw), tmp_path / "out", tmp_path, dry_run_steps=1, show_progress=False)
    finally:
        torch.set_num_threads(threads)
    reports = {r["name"]: r for r in result.reports}
    assert reports["stage1"]["teacher_forward"]["forward"] == "packed"
    assert reports["recompute"]["teacher_forward"]["forward"] == "packed"
    assert reports["stage2"]["document_forward"]["forward"] == "packed"
    assert reports["stage2"]["mining_forward"]["forward"] == "packed"  # its hard negatives mined packed
    assert reports["distill"]["mining_forward"]["forward"] == "packed"
    assert reports["distill"]["teacher_forward"]["forward"] == "packed"
    assert all(reports[name]["steps"] == 1 for name in reports)
    run = json.loads((tmp_path / "out" / "run.json").read_text("utf-8"))
    assert next(r for r in run["reports"] if r["name"] == "stage2")["document_forward"]["attention"] == "reference"
    final = AsymmetricEmbedder.from_pretrained(str(result.final), device="cpu")
    assert _attention(final) == "sdpa" and not is_packed(final.document_model)


def test_an_fp32_pass_cannot_run_the_cuda_varlen_kernels() -> None:
    # flash attention's varlen kernels compute fp16 / bf16 only: on CUDA an fp32 pass pads instead
    from care_retriever.model.towers.packed import varlen_dtype_refusal

    assert varlen_dtype_refusal(torch.bfloat16) is None and varlen_dtype_refusal(torch.float16) is None
    assert varlen_dtype_refusal(torch.float32) == (
        "the variable-length kernels compute fp16 / bf16 only, the tower computes float32"
    )


def test_a_teacher_cache_compiled_for_its_encoding_leaves_the_layers_eager(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the compiler stands in as one that returns the layer's own forward: what is checked is that the cache asks
    # for the compile and gives the layers back eager, not inductor (minutes on these CPUs)
    from care_retriever.model.compiled import decoder_layers

    compiled: list[object] = []

    def pass_through(fn, **kwargs):
        compiled.append(fn)
        return fn

    monkeypatch.setattr(torch, "compile", pass_through)
    embedder = AsymmetricEmbedder.from_pretrained(str(tiny_model_dir), device="cpu")
    cache = build_teacher_cache(embedder, TEXTS, tmp_path, show_progress=False, forward="padded", compile="on")
    layers = decoder_layers(embedder.document_model)
    assert cache.forward is not None and cache.forward["compile"] == "on" and len(compiled) == len(layers) > 0
    assert not any("forward" in vars(layer) for layer in layers)  # each layer runs its class's forward again
