"""How the document tower's forward pass runs, decided once per tower (:func:`prepare_document_forward`) and
reported by ``index --json`` (:func:`forward_state`); training takes the same decision for one stage's passes
(:func:`document_forward`).

* **Packed** (:mod:`~care_retriever.runtime.packed`): ``auto`` packs where a variable-length kernel runs (CUDA);
  on the CPU the packed path is a reference that proves packed = padded, not a faster path.
* **Compiled** (:mod:`~care_retriever.runtime.compiled`): ``auto`` compiles for ``fp8`` only, where the rowwise
  scaling must fuse with the matmuls; a compile that fails falls back to eager, said in one line.
* **FP8** (:mod:`~care_retriever.runtime.fp8`): ``dtype="fp8"``, refused in one line off GPUs that compute it.
* **Fused norms** (:mod:`~care_retriever.runtime.fused_norms`): ``auto`` runs RMSNorm through torch's fused kernel
  where layers run eager on CUDA.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import torch

from care_retriever.runtime.compiled import (
    compile_layers,
    decoder_layers,
    is_compiled,
    transformers_model,
    uncompile_layers,
    warm_up,
)
from care_retriever.runtime.fp8 import FP8, quantize_fp8
from care_retriever.runtime.fused_norms import FUSABLE_NORMS, fuse_norms, norm_classes, norms_fused, unfuse_norms
from care_retriever.runtime.packed import (
    can_pack,
    disable_packed,
    enable_packed,
    is_packed,
    pack_features,
    torch_varlen_parameters,
    varlen_backend,
    varlen_dtype_refusal,
)

__all__ = [
    "WARM_UP_TEXTS",
    "ForwardState",
    "document_forward",
    "forward_state",
    "prepare_document_forward",
    "prepare_encoder_forward",
    "warm_up_passes",
]

logger = logging.getLogger("care_retriever")

_STATE = "care_forward_state"
# Texts of the warm-up passes that compile the layers before the first timed pass: every graph a run meets, so that
# a run compiles nothing after them (tests/test_forward_compiled.py). Padded passes take three graphs (texts of one
# length, with no mask; mixed lengths, with the padding mask; a single text, whose batch dimension of 1 is
# specialised), each met twice at other shapes (a size that happens to equal another dimension at the first
# compile is specialised, and the second shape drops that); packed passes are one row of varying length.
_SHORT, _LONG = "医学检查报告", "高血压患者应低盐饮食，规律服用降压药，定期监测血压。"
WARM_UP_TEXTS: tuple[list[str], ...] = (
    [_SHORT] * 4,
    [_LONG] * 3,
    [_SHORT, _LONG * 2, _LONG, "感冒"],
    [_LONG * 4, _SHORT, _LONG],
    [_SHORT],
    [_LONG * 3],
)


@dataclass
class ForwardState:
    """What the document tower's forward pass runs: ``forward`` (``packed`` / ``padded``), ``attention`` (the
    kernel of a packed pass: ``varlen_attn``, ``flash_attn``, ``reference``; ``sdpa`` / ... padded), ``dtype`` (its
    weights', or ``fp8 (torchao)`` / ``fp8 (scaled_mm)``), ``compile`` (``on`` / ``off`` / ``off (failed: ...)``),
    ``compile_seconds`` (the warm-up passes that compiled it), why it is not packed (``padded_because``), and its
    RMSNorm layers (``norms``: ``fused`` through torch's fused kernel, or ``eager``, the model's own code)."""

    forward: str
    attention: str | None
    dtype: str
    compile: str
    compile_seconds: float = 0.0
    padded_because: str | None = None
    norms: str = "eager"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "compile_seconds": round(self.compile_seconds, 3)}


def forward_state(model: Any) -> ForwardState:
    """What :func:`prepare_document_forward` decided for ``model``; for a tower it never saw, what it runs as
    loaded (padded, eager)."""
    state = getattr(model, _STATE, None)
    if isinstance(state, ForwardState):
        return state
    attn = getattr(getattr(transformers_model(model), "config", None), "_attn_implementation", None)
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    norms = "fused" if norms_fused(model) else "eager"
    return ForwardState("packed" if is_packed(model) else "padded", attn, dtype, "off", norms=norms)


def _choose_packed(model: Any, forward: str, compute_dtype: torch.dtype | None) -> tuple[bool, str | None]:
    if forward == "padded":
        return False, "asked for (--forward padded)"
    reason = can_pack(model)
    device = torch.device(str(model.device))
    backend = varlen_backend(device) if reason is None else None
    if backend is not None:
        reason = varlen_dtype_refusal(compute_dtype or next(model.parameters()).dtype)
    if forward == "packed":
        if reason is not None:
            from care_retriever.errors import ModelError

            raise ModelError(f"--forward packed: {reason}; use --forward padded or auto")
        return True, None
    if reason is None and backend is None:
        reason = f"no variable-length attention kernel on {device.type}"
    return reason is None, reason


def _refuse_unfusable(model: Any) -> None:
    """``norms="fused"`` on a tower with no norm of a known fused form: refused in one line."""
    from care_retriever.errors import ModelError

    found = ", ".join(norm_classes(model)) or "none"
    raise ModelError(
        f"--norms fused: the tower's norm layers ({found}) have no fused form (fused: {sorted(FUSABLE_NORMS)}); "
        "use --norms eager or auto"
    )


@torch.inference_mode()
def warm_up_passes(model: Any) -> list[dict[str, Any]]:
    """The features of the warm-up passes (:data:`WARM_UP_TEXTS`) as ``model`` runs them (packed or padded), on its
    device, made in inference mode as the encoding loop's passes are (a compiled graph guards on whether its input
    tensors are inference tensors: a packed pass's positions and offsets made otherwise would compile anew)."""
    passes = []
    for texts in WARM_UP_TEXTS:
        features = model.preprocess(list(texts))
        if is_packed(model):
            features = pack_features(features)
        passes.append({k: v.to(model.device) if isinstance(v, torch.Tensor) else v for k, v in features.items()})
    return passes


def prepare_document_forward(
    model: Any,
    forward: str = "auto",
    compile: str = "auto",
    dtype: str | None = None,
    compute_dtype: torch.dtype | None = None,
    norms: str = "auto",
) -> ForwardState:
    """Set ``model``'s forward pass up once (a second call returns the first's state): ``forward`` auto | packed |
    padded, ``compile`` auto | on | off, ``dtype`` the precision asked for (``fp8`` quantizes the Linear layers;
    others were applied at loading), ``norms`` auto | fused | eager (auto: fused where the layers run eager on
    CUDA). ``compute_dtype``: what the passes compute in where autocast sets it
    (training's bf16 / fp16 over fp32 weights), else the weights' dtype counts: the CUDA varlen kernels compute
    fp16 / bf16 only, so an fp32 pass on CUDA pads."""
    state = getattr(model, _STATE, None)
    if isinstance(state, ForwardState):
        return state
    if not isinstance(model, torch.nn.Sequential) or not len(model):  # not a sentence-transformers tower
        return ForwardState("padded", None, dtype or "unknown", "off", 0.0, "not a sentence-transformers tower")
    if norms == "fused" and not fuse_norms(model):
        _refuse_unfusable(model)
    packed, because = _choose_packed(model, forward, compute_dtype)
    if packed:
        enable_packed(model)
    backend = varlen_backend(torch.device(str(model.device)))
    if packed and backend == "torch":
        torch_varlen_parameters()  # read here, outside the compiled layers that use it
    kernels = {"torch": "varlen_attn", "flash_attn": "flash_attn", None: "reference"}
    attention = kernels[backend] if packed else None
    weights = str(next(model.parameters()).dtype).removeprefix("torch.")
    if dtype == FP8:
        weights = f"fp8 ({quantize_fp8(model)})"
    compiling = compile == "on" or (compile == "auto" and dtype == FP8)
    state = ForwardState("packed" if packed else "padded", attention, weights, "off", 0.0, because)
    if not packed:
        state.attention = getattr(getattr(transformers_model(model), "config", None), "_attn_implementation", None)
    if compiling and decoder_layers(model):
        try:
            compile_layers(model)
            state.compile_seconds = warm_up(model, warm_up_passes(model))
            state.compile = "on"
        except Exception as exc:  # any failure of the compiler stack: the tower runs eager, said once
            uncompile_layers(model)
            first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
            state.compile = f"off (failed: {first})"
            logger.warning("torch.compile of the document tower failed (%s); running eager", first)
    on_cuda = torch.device(str(model.device)).type == "cuda"
    if norms == "auto" and on_cuda and state.compile != "on":
        fuse_norms(model)
    state.norms = "fused" if norms_fused(model) else "eager"
    setattr(model, _STATE, state)
    return state


def prepare_encoder_forward(
    embedder: Any, forward: str = "auto", compile: str = "auto", dtype: str | None = None, norms: str = "auto"
) -> ForwardState:
    """:func:`prepare_document_forward` for an embedder's document tower, its space fingerprint read first: the
    fingerprint hashes the tower's weights as loaded, and FP8 then replaces its Linear weights by float8 tensors
    (torchao's, which no hash reads as bytes). The space is the tower's, whatever precision computes it, so an
    ``--dtype fp8`` run writes into the store a bf16 run wrote."""
    fingerprint = embedder.space_fingerprint
    logger.debug("document space %s", fingerprint)
    return prepare_document_forward(embedder.document_model, forward, compile, dtype, norms=norms)


def _release_document_forward(model: Any, attention: str | None) -> None:
    """Undo :func:`prepare_document_forward` (not FP8, which :func:`document_forward` never asks for): eager
    layers, padded passes on ``attention`` (the implementation the tower had), and no decision recorded."""
    if is_compiled(model):
        uncompile_layers(model)
    unfuse_norms(model)
    disable_packed(model, attention or "sdpa")
    if hasattr(model, _STATE):
        delattr(model, _STATE)


@contextmanager
def document_forward(
    model: Any,
    forward: str = "auto",
    compile: str = "auto",
    compute_dtype: torch.dtype | None = None,
    norms: str = "auto",
) -> Iterator[ForwardState]:
    """The forward pass :func:`prepare_document_forward` decides, for the passes of one block; after it the tower
    runs as it did before (its attention implementation, eager layers, its own norms). Training uses it: the frozen
    tower's encodings of Stage I and the document side of Stage II take the index path's decision, and the next
    stage (LoRA wrapped around the layers, a save of the folder) gets the tower as loaded. A tower already prepared
    (by ``index``) keeps its state and is left as it is."""
    prepared_before = isinstance(getattr(model, _STATE, None), ForwardState)
    attention = getattr(getattr(transformers_model(model), "config", None), "_attn_implementation", None)
    state = prepare_document_forward(model, forward, compile, compute_dtype=compute_dtype, norms=norms)
    try:
        yield state
    finally:
        if not prepared_before:
            _release_document_forward(model, attention)
