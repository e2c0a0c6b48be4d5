"""The document tower's RMSNorm layers through torch's fused kernel (``torch.nn.functional.rms_norm``).

Eager Qwen3 normalises in six memory-bound kernels per call (a cast to fp32, a square, a mean, an rsqrt, two
multiplications and a cast back), and calls it four times a layer (before attention and the MLP, and on the query
and key heads). On CUDA, ``rms_norm`` runs one kernel that reads the input once and writes the output once
(``_fused_rms_norm``, torch >= 2.8), with the same fp32 accumulation; on the CPU it is the same composite of kernels
as the model's own code, so nothing is gained there. Each norm's ``forward`` is replaced on the instance (its weight,
its ``state_dict`` key and the space fingerprint stay as they were) and is a bound method, so a ``deepcopy`` of the
tower keeps the copy's norms reading the copy's weights.

Only norms whose formula is known to be ``weight * (x.float() * rsqrt(mean(x.float()^2) + eps)).to(x.dtype)`` are
fused (:data:`FUSABLE_NORMS`): Gemma's ``(1 + weight)`` form, for one, is not. A call with gradients, under
autocast, or with an input in another dtype than the weight runs the model's own code: the fused kernel serves
inference passes in the weights' dtype, where it is measured (``benchmarks.cuda_checks``); the fused result differs
from the model's own in bf16 by one rounding (the weight is applied before the cast back, not after).
"""

from __future__ import annotations

import types
from typing import Any

import torch

from care_retriever.runtime.compiled import transformers_model

__all__ = ["FUSABLE_NORMS", "fusable_norms", "fuse_norms", "norm_classes", "norms_fused", "unfuse_norms"]

# transformers' RMSNorm classes computing the formula above (their ``weight`` and ``variance_epsilon``)
FUSABLE_NORMS = frozenset({"Qwen3RMSNorm", "Qwen2RMSNorm", "LlamaRMSNorm", "MistralRMSNorm"})
_FUSED_FLAG = "care_fused_norms"


def _fused_rms_norm(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    if (
        torch.is_grad_enabled()
        or torch.is_autocast_enabled(hidden_states.device.type)
        or hidden_states.dtype != self.weight.dtype
    ):
        return type(self).forward(self, hidden_states)
    return torch.nn.functional.rms_norm(hidden_states, (self.weight.shape[-1],), self.weight, self.variance_epsilon)


def fusable_norms(model: Any) -> list[torch.nn.Module]:
    """The RMSNorm modules of a sentence-transformers tower's transformers model that :func:`fuse_norms` fuses."""
    hf = transformers_model(model)
    if not isinstance(hf, torch.nn.Module):
        return []
    return [m for m in hf.modules() if type(m).__name__ in FUSABLE_NORMS and hasattr(m, "variance_epsilon")]


def norm_classes(model: Any) -> list[str]:
    """The class names of the tower's norm layers (for the message that says why none is fused)."""
    hf = transformers_model(model)
    modules = hf.modules() if isinstance(hf, torch.nn.Module) else []
    return sorted({type(m).__name__ for m in modules if "norm" in type(m).__name__.lower()})


def fuse_norms(model: Any) -> int:
    """Run the tower's fusable RMSNorm layers through ``torch.nn.functional.rms_norm``; returns how many."""
    norms = fusable_norms(model)
    for norm in norms:
        norm.forward = types.MethodType(_fused_rms_norm, norm)
    setattr(model, _FUSED_FLAG, bool(norms))
    return len(norms)


def unfuse_norms(model: Any) -> None:
    """Back to the model's own norms: drop the instance ``forward`` each fused norm got."""
    for norm in fusable_norms(model):
        if "forward" in vars(norm):
            del norm.forward
    setattr(model, _FUSED_FLAG, False)


def norms_fused(model: Any) -> bool:
    return bool(getattr(model, _FUSED_FLAG, False))
