"""The document tower's forward pass in a training stage's own passes (Stage II's document side, with gradients;
Stage I's recomputed teacher), decided as ``index`` decides it
(:func:`care_retriever.runtime.forward.document_forward`).

sentence-transformers' collator pads a stage's texts; where the decision packs, each padded pass that reaches the
document tower is laid out packed on its way in (:func:`care_retriever.runtime.packed.pack_padded_passes`)
and runs the packed attention: torch's ``varlen_attn`` on CUDA, whose backward torch registers (flash attention's
backward kernel, grouped-query heads included), or on the CPU the reference (SDPA text by text, differentiable).
The layers are not compiled here: LoRA and activation checkpointing wrap the layers a compile would replace.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import TYPE_CHECKING, Any

from care_retriever.errors import InputError, ModelError

if TYPE_CHECKING:
    import torch

    from care_retriever.model.embedder import AsymmetricEmbedder
    from care_retriever.training.recipe_spec import StageSpec
    from care_retriever.training.stage_context import StageContext

logger = logging.getLogger("care_retriever")


@contextmanager
def stage_document_forward(
    embedder: AsymmetricEmbedder, forward: str, where: str, compute_dtype: torch.dtype | None = None
) -> Iterator[dict[str, Any]]:
    """For the block, the document tower's passes packed where ``forward`` (auto | packed | padded) decides so;
    yields the decided state (``ForwardState.to_dict()``, for the stage's report). After it the tower runs as
    loaded. ``compute_dtype``: the stage's autocast dtype (bf16 / fp16), None in fp32."""
    from care_retriever.runtime.forward import document_forward
    from care_retriever.runtime.packed import pack_padded_passes

    model = embedder.document_model
    config = getattr(getattr(model[0], "auto_model", None), "config", None)
    dropout = float(getattr(config, "attention_dropout", 0.0) or 0.0)
    padded_because = None
    if dropout > 0 and forward != "padded":  # the packed attention computes no dropout
        if forward == "packed":
            raise InputError(f"{where}: forward: packed computes no attention dropout; the tower's is {dropout}")
        forward, padded_because = "padded", f"the tower's attention dropout ({dropout}): the packed attention has none"
    with ExitStack() as stack:
        try:
            state = stack.enter_context(document_forward(model, forward, "off", compute_dtype=compute_dtype))
        except ModelError as exc:  # forward: packed on a tower that cannot pack
            raise InputError(f"{where}: {exc}") from exc
        if state.forward == "packed":
            stack.callback(pack_padded_passes(model).remove)
        info = state.to_dict()
        yield {**info, "padded_because": padded_because or info["padded_because"]}


def stage_forward(
    ctx: StageContext, stage: StageSpec, embedder: AsymmetricEmbedder
) -> AbstractContextManager[dict[str, Any]]:
    """:func:`stage_document_forward` as a stage's recipe asks for it: its ``forward`` key (else the defaults',
    else auto) and its training precision. For every pass of the stage's document tower: the training steps,
    a recomputed teacher, hard-negative mining, distillation's teacher scores."""
    from care_retriever.training.stage_context import option, stage_dtype

    forward = option(ctx, stage, "forward", "auto")
    return stage_document_forward(embedder, forward, f"stage {stage.name!r}", half_dtype(stage_dtype(ctx, stage)))


def describe(state: dict[str, Any]) -> str:
    """One line of a forward state: ``packed (varlen_attn), bfloat16, compile off``, ``padded (sdpa; why)``."""
    kernel = state.get("attention") or "?"
    because = f"; {state['padded_because']}" if state.get("padded_because") else ""
    compiled = state.get("compile", "off")
    seconds = f" in {float(state.get('compile_seconds') or 0):.1f} s" if compiled == "on" else ""
    return f"{state.get('forward')} ({kernel}{because}), {state.get('dtype')}, compile {compiled}{seconds}"


def half_dtype(dtype: Any) -> Any:
    """The half dtype autocast computes in for a training precision, or None (fp32: the weights' dtype counts)."""
    import torch

    return dtype if dtype in (torch.bfloat16, torch.float16) else None
