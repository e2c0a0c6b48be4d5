"""Compiled document towers: ``torch.compile`` of the tower's decoder layers, with a one-line fallback to eager.

Eager Qwen3 runs RMSNorm (in fp32), the q/k norms, RoPE and SiLU x mul as separate memory-bound kernels; compiled,
inductor fuses them. Each decoder layer's ``forward`` is replaced by a compiled one on the instance (the module, its
parameters and its ``state_dict`` keys stay as they were, so saving and the space fingerprint see the same tower),
with dynamic shapes: the number of texts and tokens of a pass varies over a corpus, and a graph specialised to each
would compile once per batch. The layers share one compiled graph (same code, parameters as inputs), so a long run
compiles a bounded number of times: once per kind of pass, not per shape (padded: texts of one length with no mask,
mixed lengths with the padding mask, a single text, whose batch dimension of 1 is specialised; packed: one row of
any length). The compile time is paid in the first passes of each kind; :func:`warm_up` runs such passes up front
(``care_retriever.runtime.forward.WARM_UP_TEXTS``) so that it is measured on its own and a run compiles nothing after.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch

__all__ = [
    "QUERY_WARM_UP",
    "compile_layers",
    "compile_query_tower",
    "decoder_layers",
    "is_compiled",
    "query_compile_state",
    "transformer_layers",
    "transformers_model",
    "uncompile_layers",
    "warm_up",
]

logger = logging.getLogger("care_retriever")

_COMPILED_FLAG = "care_compiled_forward"
_QUERY_STATE = "care_query_compile"
# Queries of the query tower's warm-up: one at a time at several lengths (no padding), a batch of one length and
# a batch of mixed lengths (the padding mask), each kind at two shapes, so that a server compiles before its first
# request and not during one.
QUERY_WARM_UP: tuple[list[str], ...] = (
    ["感冒"],
    ["孩子发烧三十九度，精神还可以，需要马上去医院吗？"],
    ["高血压吃什么药"] * 3,
    ["糖尿病饮食"] * 2,
    ["感冒", "高血压患者可以喝咖啡吗", "孩子发烧三十九度，精神还可以，需要马上去医院吗？"],
    ["失眠怎么办", "拉肚子"],
)


def transformers_model(model: Any) -> Any:
    """A sentence-transformers tower's transformers model (its first module's ``auto_model``), or None."""
    return getattr(model[0], "auto_model", None) if isinstance(model, torch.nn.Sequential) and len(model) else None


def decoder_layers(model: Any) -> list[torch.nn.Module]:
    """The decoder layers of a sentence-transformers tower's transformers model (``model.layers`` or
    ``model.model.layers``); empty where it has none."""
    hf = transformers_model(model)
    for owner in (hf, getattr(hf, "model", None)):
        layers = getattr(owner, "layers", None)
        if isinstance(layers, torch.nn.ModuleList):
            return list(layers)
    return []


def transformer_layers(model: Any) -> list[torch.nn.Module]:
    """The layers of a sentence-transformers tower's transformers model: a decoder's (:func:`decoder_layers`) or
    a BERT-style encoder's (``encoder.layer``); empty where it has neither."""
    layers = decoder_layers(model)
    if layers:
        return layers
    hf = transformers_model(model)
    found = getattr(getattr(hf, "encoder", None), "layer", None)
    return list(found) if isinstance(found, torch.nn.ModuleList) else []


def is_compiled(model: Any) -> bool:
    return bool(getattr(model, _COMPILED_FLAG, False))


def compile_layers(model: Any, compiler: Callable[..., Any] | None = None) -> int:
    """Replace each decoder layer's ``forward`` by a compiled one (dynamic shapes); returns the layers compiled.
    Compiling itself happens at the first pass (:func:`warm_up`)."""
    compiler = compiler or torch.compile
    layers = transformer_layers(model)
    for layer in layers:
        layer.forward = compiler(layer.forward, dynamic=True)
    setattr(model, _COMPILED_FLAG, bool(layers))
    return len(layers)


def uncompile_layers(model: Any) -> None:
    """Back to eager: drop the instance ``forward`` each layer got (its class's own is used again)."""
    for layer in transformer_layers(model):
        if "forward" in vars(layer):
            del layer.forward
    setattr(model, _COMPILED_FLAG, False)


@torch.inference_mode()
def warm_up(model: Any, passes: list[dict[str, Any]]) -> float:
    """Run ``passes`` (features already on the tower's device) through ``model``; the seconds they took, the
    compilation included (raised where compiling fails)."""
    start = time.perf_counter()
    for features in passes:
        model(dict(features))
    if torch.device(model.device).type == "cuda":
        torch.cuda.synchronize(model.device)
    return time.perf_counter() - start


def compile_query_tower(model: Any) -> str:
    """Compile the query tower's layers (dynamic shapes) and run :data:`QUERY_WARM_UP` through it, so that a server
    pays the compiling at start; returns (and keeps, :func:`query_compile_state`) ``on (N s)``, or ``off (failed:
    ...)`` after a one-line warning where compiling fails (the tower then runs eager)."""
    start = time.perf_counter()
    try:
        if not compile_layers(model):
            raise ValueError(f"no transformer layers found in {type(model[0]).__name__}")
        with torch.inference_mode():  # as the encoding loop makes its features (a compiled graph guards on it)
            passes = [
                {k: v.to(model.device) if isinstance(v, torch.Tensor) else v for k, v in model.preprocess(t).items()}
                for t in QUERY_WARM_UP
            ]
        warm_up(model, passes)
        state = f"on ({time.perf_counter() - start:.1f} s)"
    except Exception as exc:  # any failure of the compiler stack: the tower runs eager, said once
        uncompile_layers(model)
        first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        logger.warning("torch.compile of the query tower failed (%s); running eager", first)
        state = f"off (failed: {first})"
    setattr(model, _QUERY_STATE, state)
    return state


def query_compile_state(model: Any) -> str:
    """What :func:`compile_query_tower` left on ``model`` (a query tower): ``on (N s)``, ``off (failed: ...)``, or
    ``off`` where it was not asked to compile."""
    return str(getattr(model, _QUERY_STATE, "off"))
