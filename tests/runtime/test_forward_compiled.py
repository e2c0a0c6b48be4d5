"""Compiled document towers compile a bounded number of times: the warm-up passes of ``prepare_document_forward``
compile every graph a run meets, and a run of many different batch shapes (padded: texts x longest text; packed:
the total tokens of a pass) compiles nothing after them.

The graphs are counted by a ``torch.compile`` backend that records each graph dynamo hands it and runs it as
captured (no inductor code generation, which takes tens of seconds a graph on the CPU): which graphs exist and when
a new one is needed is decided by dynamo's guards, the same whatever the backend (the inductor backend gave the
same bound, docs/gpu.md)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from care_retriever.model.embedder import AsymmetricEmbedder
from care_retriever.model.encoding import encode_texts
from care_retriever.model.forward import WARM_UP_TEXTS, prepare_document_forward

TEXT = "高血压患者应低盐饮食，规律服用降压药，定期监测血压。糖尿病患者需要控制饮食、适量运动，并遵医嘱使用降糖药物。"


def _batches(count: int) -> list[list[str]]:
    """``count`` passes of different shapes: random sizes and lengths, and the kinds a sorted run ends up with
    (a single text, texts of one length, one-token-ish texts)."""
    rng = random.Random(0)
    batches = [[TEXT], ["咳"], [TEXT[:9]] * 3, ["a", "b"], [TEXT[:30]] * 7]
    while len(batches) < count:
        batches.append([TEXT[: rng.randint(1, len(TEXT))] for _ in range(rng.randint(1, 16))])
    return batches


@pytest.mark.parametrize("forward", ["padded", "packed"])
def test_after_the_warm_up_a_run_of_twenty_batch_shapes_compiles_nothing_more(
    tiny_model_dir: Path, compiled_graphs: list[int], forward: str
) -> None:
    model = AsymmetricEmbedder.from_pretrained(str(tiny_model_dir), load="document", device="cpu").document_model
    state = prepare_document_forward(model, forward=forward, compile="on")
    assert (state.forward, state.compile) == (forward, "on")
    after_warm_up = len(compiled_graphs)
    assert after_warm_up > 0  # the warm-up compiled (through the counting backend)

    shapes: list[tuple[int, ...]] = []
    hook = model[0].register_forward_pre_hook(lambda _m, args: shapes.append(tuple(args[0]["input_ids"].shape)))
    try:
        for texts in _batches(20):
            encode_texts(model, texts, batch_size=64, prefetch=False)  # one pass each
    finally:
        hook.remove()
    assert len(shapes) == 20 and len(set(shapes)) >= 18, shapes
    assert len(compiled_graphs) == after_warm_up, (
        f"{len(compiled_graphs) - after_warm_up} graph(s) compiled after the warm-up, at shapes {shapes}"
    )


def test_the_warm_up_passes_cover_the_padded_graphs() -> None:
    """Texts of one length (no mask), mixed lengths (the padding mask), a single text, each at two shapes."""
    kinds = [
        "single" if len(texts) == 1 else "one length" if len(set(texts)) == 1 else "mixed" for texts in WARM_UP_TEXTS
    ]
    assert sorted(kinds) == sorted(["one length", "mixed", "single"] * 2)
