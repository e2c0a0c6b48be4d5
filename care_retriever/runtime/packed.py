"""The packed forward of a decoder document tower: the texts of a pass laid end to end, no padding and no mask.

A pass of ``n`` texts is one row of ``sum(lengths)`` tokens (``input_ids`` of shape ``(1, total)``), with
``position_ids`` restarting at 0 for each text and ``cu_seq_lens_q/k`` (the texts' offsets, ``n + 1`` int32) and
``max_length_q/k`` beside it, the keyword arguments transformers 5 hands a model's attention function for packed
inputs (its ``DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_position_ids=True)`` builds the same).
sentence-transformers' ``Pooling`` reads its rows from ``cu_seq_lens_q`` (the last token of a text is the row
``cu_seq_lens_q[i + 1] - 1``), so the tower's own pooling runs unchanged.

The tower's attention implementation becomes :data:`PACKED_ATTENTION`, registered with transformers'
``AttentionInterface`` (the registry its attention layers look names up in):

* packed inputs (``cu_seq_lens_q`` given): on CUDA torch's ``varlen_attn`` (torch >= 2.10), or the ``flash_attn``
  package's ``flash_attn_varlen_func`` where it is installed; elsewhere (the CPU) a reference that runs SDPA on each
  text's slice, causal, which is what the tests compare with the padded path;
* padded inputs (every other caller of the tower: the token-budget probe, training, sentence-transformers' own
  ``encode``): SDPA with the causal and padding mask, as transformers' ``sdpa`` does.

The mask function registered beside it is transformers' ``sdpa_mask`` for padded inputs and nothing for packed ones
(which come without an ``attention_mask``): a packed pass of 100K tokens would otherwise get a 100K x 100K
block-diagonal mask.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Set as AbstractSet
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

__all__ = [
    "PACKED_ATTENTION",
    "can_pack",
    "enable_packed",
    "is_packed",
    "pack_features",
    "pack_padded_passes",
    "packed_attention",
    "torch_varlen_parameters",
    "varlen_backend",
    "varlen_dtype_refusal",
]

PACKED_ATTENTION = "care_packed"
# The attribute a packed tower carries (on the sentence-transformers model): the encoding loop reads it to lay its
# passes out packed and to budget them by the sum of their tokens.
_PACKED_FLAG = "care_packed_forward"


def is_packed(model: Any) -> bool:
    """Whether ``model`` (a sentence-transformers tower) runs its passes packed (:func:`enable_packed`)."""
    return bool(getattr(model, _PACKED_FLAG, False))


def pack_features(features: dict[str, Any]) -> dict[str, Any]:
    """Padded rows (``input_ids`` + ``attention_mask``, padded on either side) as one packed row: the texts' tokens
    end to end, positions restarting per text, the offsets as ``cu_seq_lens_q/k`` and the longest as
    ``max_length_q/k`` (ints: the varlen kernels take them on the host). Other per-batch values are kept."""
    ids, mask = features["input_ids"], features["attention_mask"]
    keep = mask.bool()
    lengths = keep.sum(dim=1)
    packed = {k: v for k, v in features.items() if k not in ("input_ids", "attention_mask", "token_type_ids")}
    packed["input_ids"] = ids[keep].unsqueeze(0)  # row-major: each text's tokens in order, texts in batch order
    lengths_np = lengths.cpu().numpy().astype(np.int64)
    offsets = packed_offsets(lengths_np)
    if ids.device.type != "cpu":  # a pass already on its device (training's): the offsets go there too
        offsets = {k: v.to(ids.device) if isinstance(v, torch.Tensor) else v for k, v in offsets.items()}
    packed.update(offsets)
    return packed


def pack_padded_passes(model: Any) -> torch.utils.hooks.RemovableHandle:
    """Lay out packed every padded pass that reaches ``model``'s transformers module (a tower
    :func:`enable_packed` made packed) until the returned handle is removed: the passes of a training stage,
    which sentence-transformers' collator pads, then run the packed forward with gradients. A pass already
    packed (the encoding loop's) goes through as it is."""

    def pack(_module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        features = args[0] if args else kwargs.get("features")
        if not isinstance(features, dict) or "cu_seq_lens_q" in features or "attention_mask" not in features:
            return None
        if args:
            return (pack_features(features), *args[1:]), kwargs
        return args, {**kwargs, "features": pack_features(features)}

    return model[0].register_forward_pre_hook(pack, with_kwargs=True)


def packed_offsets(lengths: np.ndarray) -> dict[str, Any]:
    """The position ids and offsets of texts of these token ``lengths`` laid end to end."""
    cu = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=cu[1:])
    starts = np.repeat(cu[:-1].astype(np.int64), lengths)
    positions = np.arange(int(cu[-1]), dtype=np.int64) - starts
    cu_t = torch.from_numpy(cu)
    longest = int(lengths.max()) if len(lengths) else 0
    return {
        "position_ids": torch.from_numpy(positions).unsqueeze(0),
        "cu_seq_lens_q": cu_t,
        "cu_seq_lens_k": cu_t.clone(),
        "max_length_q": longest,
        "max_length_k": longest,
    }


# ------------------------------------------------------------------ attention
# What a device type's packed passes run, found once per process (find_spec and inspect.signature are Python that
# torch.compile cannot trace: called inside a compiled layer's attention, each broke the graph there). The forward
# pass is set up outside any compiled code (care_retriever.runtime.forward), which fills these first.
_BACKENDS: dict[str, str | None] = {}
_TORCH_VARLEN_PARAMETERS: list[frozenset[str]] = []


def varlen_backend(device: torch.device | str) -> str | None:
    """Which variable-length kernel a packed pass on ``device`` runs: ``flash_attn`` (the package, where installed),
    ``torch`` (``torch.nn.attention.varlen``), or None where neither runs (off CUDA: the reference runs there)."""
    kind = torch.device(device).type
    if kind in _BACKENDS:
        return _BACKENDS[kind]
    backend = None
    if kind == "cuda":
        import importlib.util

        if importlib.util.find_spec("flash_attn") is not None:
            backend = "flash_attn"
        elif importlib.util.find_spec("torch.nn.attention.varlen") is not None:
            backend = "torch"
    _BACKENDS[kind] = backend
    return backend


def torch_varlen_parameters() -> frozenset[str]:
    """The parameters of this torch's ``varlen_attn`` (they changed between releases), read once."""
    if not _TORCH_VARLEN_PARAMETERS:
        from torch.nn.attention.varlen import varlen_attn

        _TORCH_VARLEN_PARAMETERS.append(frozenset(inspect.signature(varlen_attn).parameters))
    return _TORCH_VARLEN_PARAMETERS[0]


def varlen_dtype_refusal(dtype: torch.dtype) -> str | None:
    """Why a pass computing in ``dtype`` cannot run the CUDA varlen kernels (flash attention's: fp16 and bf16
    only), or None where it can."""
    if dtype in (torch.float16, torch.bfloat16):
        return None
    return (
        f"the variable-length kernels compute fp16 / bf16 only, the tower computes {str(dtype).removeprefix('torch.')}"
    )


def torch_varlen_kwargs(parameters: AbstractSet[str], heads: int, kv_heads: int) -> tuple[dict[str, Any], bool]:
    """How torch's ``varlen_attn`` is asked for causal attention with these heads, for the parameters its signature
    has: ``is_causal=True`` (torch 2.10) or ``window_size=(-1, 0)`` (later); ``enable_gqa`` where it exists (torch
    2.12 on), else the caller repeats the key/value heads (the second value: whether it must)."""
    kwargs: dict[str, Any] = {}
    if "window_size" in parameters:
        kwargs["window_size"] = (-1, 0)
    else:
        kwargs["is_causal"] = True
    repeat = heads != kv_heads
    if repeat and "enable_gqa" in parameters:
        kwargs["enable_gqa"] = True
        repeat = False
    return kwargs, repeat


def varlen_scale_kwargs(parameters: AbstractSet[str], scale: float, head_dim: int) -> tuple[dict[str, Any], float]:
    """How torch's ``varlen_attn`` gets the softmax scale: as ``scale=`` where its signature has it (torch 2.11 on),
    else (torch 2.10, which scales by ``head_dim ** -0.5`` itself) by the factor the caller multiplies the queries
    by first (the second value: 1.0 where the tower's scale is that default, as Qwen3's is)."""
    if "scale" in parameters:
        return {"scale": scale}, 1.0
    return {}, scale * head_dim**0.5


def _repeat_kv(states: torch.Tensor, times: int) -> torch.Tensor:
    # (total, kv_heads, dim) -> (total, kv_heads * times, dim), each kv head next to the query heads that share it
    return states if times == 1 else states.repeat_interleave(times, dim=1)


def _varlen_cuda(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float, kw: dict[str, Any]) -> torch.Tensor:
    cu_q, cu_k = kw["cu_seq_lens_q"].to(torch.int32), kw["cu_seq_lens_k"].to(torch.int32)
    if torch.is_autocast_enabled(q.device.type):
        # a custom op is not cast by autocast as SDPA is: over fp32 weights (training), Qwen3's q/k norms hand
        # fp32 states and the value projection bf16; the kernels take one half dtype
        half = torch.get_autocast_dtype(q.device.type)
        q, k, v = q.to(half), k.to(half), v.to(half)
    max_q, max_k = int(kw["max_length_q"]), int(kw["max_length_k"])
    if varlen_backend(q.device) == "flash_attn":
        from flash_attn import flash_attn_varlen_func  # handles grouped-query heads itself

        return flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale=scaling, causal=True)
    from torch.nn.attention.varlen import varlen_attn

    parameters = torch_varlen_parameters()
    extra, repeat = torch_varlen_kwargs(parameters, q.shape[1], k.shape[1])
    if repeat:
        k, v = _repeat_kv(k, q.shape[1] // k.shape[1]), _repeat_kv(v, q.shape[1] // v.shape[1])
    scaled, factor = varlen_scale_kwargs(parameters, scaling, q.shape[-1])
    if abs(factor - 1.0) > 1e-6:
        q = q * factor
    out = varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, **scaled, **extra)
    return out if isinstance(out, torch.Tensor) else out[0]


@torch.compiler.disable  # a loop over the texts of a pass: compiled, each pass's offsets would make a new graph
def _varlen_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float, cu: torch.Tensor
) -> torch.Tensor:
    """Causal SDPA on each text's slice of the packed row: the same packing, computed the plain way (the CPU)."""
    out = torch.empty_like(q)
    bounds = cu.tolist()
    for start, end in itertools.pairwise(bounds):
        if end == start:
            continue
        qs, ks, vs = (t[start:end].transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        part = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scaling, enable_gqa=True)
        out[start:end] = part.squeeze(0).transpose(0, 1)
    return out


def _padded_sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scaling: float
) -> torch.Tensor:
    """SDPA over padded rows with the mask :func:`packed_mask` built (transformers' ``sdpa_mask``: causal and blind to
    padding), or causal alone where it built none (no padding in the pass)."""
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=mask is None, scale=scaling, enable_gqa=q.shape[1] != k.shape[1]
    )


def packed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The attention function transformers calls with ``(batch, heads, tokens, dim)`` states; returns the output as
    ``(batch, tokens, heads, dim)``, as its own functions do."""
    scale = float(scaling if scaling is not None else query.shape[-1] ** -0.5)
    if kwargs.get("cu_seq_lens_q") is None:
        out = _padded_sdpa(query, key, value, attention_mask, scale)
        return out.transpose(1, 2).contiguous(), None
    if query.shape[0] != 1:
        raise ValueError(f"packed attention takes one packed row, got a batch of {query.shape[0]}")
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # (total, heads, dim)
    if varlen_backend(q.device) is not None:
        out = _varlen_cuda(q, k, v, scale, kwargs)
    else:
        out = _varlen_reference(q, k, v, scale, kwargs["cu_seq_lens_q"])
    return out.unsqueeze(0), None


# ------------------------------------------------------------------ the tower
def packed_mask(**kwargs: Any) -> torch.Tensor | None:
    """The mask a pass gets: none for a packed pass (no ``attention_mask``), SDPA's for padded rows."""
    if kwargs.get("attention_mask") is None:
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(**kwargs)


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(PACKED_ATTENTION, packed_attention)
    AttentionMaskInterface.register(PACKED_ATTENTION, packed_mask)


def can_pack(model: Any) -> str | None:
    """Why ``model`` (a sentence-transformers tower) cannot run packed, or None where it can: a decoder read through
    transformers' attention registry (Qwen3 and its kind), pooled by sentence-transformers' ``Pooling`` (which reads
    packed rows), on SDPA or eager attention (flash-attention towers are packed by sentence-transformers itself)."""
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    from care_retriever.runtime.architecture import is_decoder

    modules = list(model)
    if not modules or not isinstance(modules[0], Transformer):
        return "the tower is not a transformers model"
    transformer = modules[0]
    hf = transformer.auto_model
    if not is_decoder(transformer):
        return "the tower is not a decoder"
    if not getattr(hf, "_supports_attention_backend", False):
        return f"{type(hf).__name__} does not take a registered attention function"
    if len(modules) < 2 or not isinstance(modules[1], Pooling):
        return "the tower's pooling is not sentence-transformers' Pooling"
    if getattr(transformer, "can_flatten_inputs", False):
        return "sentence-transformers already packs this tower (flash-attention)"
    attn = getattr(hf.config, "_attn_implementation", None)
    if attn not in (None, "sdpa", "eager", PACKED_ATTENTION):
        return f"the tower runs {attn} attention"
    return None


def enable_packed(model: Any) -> None:
    """Run ``model``'s passes packed from now on (:func:`can_pack` must have said yes): its attention implementation
    becomes :data:`PACKED_ATTENTION`, and the encoding loop lays its batches out packed."""
    _register()
    hf = model[0].auto_model
    hf.set_attn_implementation(PACKED_ATTENTION)
    setattr(model, _PACKED_FLAG, True)


def disable_packed(model: Any, implementation: str = "sdpa") -> None:
    """Back to padded passes on ``implementation``."""
    if is_packed(model):
        model[0].auto_model.set_attn_implementation(implementation)
        setattr(model, _PACKED_FLAG, False)
