"""FP8 document towers (``--dtype fp8``, opt-in): the decoder layers' Linear layers in float8 e4m3, rowwise scaled.

Each Linear's weight is scaled per output row and its input per token (dynamic: the scale of each row is its largest
magnitude over e4m3's largest value, 448), both rounded to float8_e4m3fn, multiplied in FP8 with the scales applied
to the bf16 output: torchao's float8 dynamic rowwise recipe (``Float8DynamicActivationFloat8WeightConfig(PerRow())``)
where torchao is installed, else torch's own ``torch._scaled_mm`` with the same scales. The tower is loaded in bf16
first; embeddings, norms and attention stay bf16.

FP8 matmuls need a GPU of compute capability 8.9 or later (Ada, Hopper, Blackwell): elsewhere ``fp8`` is refused in
one line, before the tower is loaded. :func:`emulate_fp8` rounds weights and activations the same way, multiplies
the rounded values in fp32 and rounds the product once to the tower's dtype, on any device: it is how the fidelity
of FP8 vectors is measured on a CPU (``benchmarks/fp8_fidelity.py``).
"""

from __future__ import annotations

import importlib.util
import types
from typing import Any

import torch
import torch.nn.functional as F

from care_retriever.errors import ModelError

__all__ = [
    "E4M3_MAX",
    "FP8",
    "FP8_MIN_CAPABILITY",
    "emulate_fp8",
    "fp8_backend",
    "fp8_refusal",
    "quantize_fp8",
    "round_rowwise",
    "scaled_mm_linear",
]

FP8 = "fp8"
FP8_MIN_CAPABILITY = (8, 9)
E4M3_MAX = float(torch.finfo(torch.float8_e4m3fn).max)  # 448


def fp8_refusal(device: str | torch.device, capability: tuple[int, int] | None = None) -> str | None:
    """Why ``fp8`` cannot run on ``device`` (one line), or None where it can. ``capability``: the GPU's compute
    capability (read from the device where None)."""
    device = torch.device(device)
    if device.type != "cuda":
        return (
            f"--dtype fp8 runs on CUDA GPUs of compute capability >= 8.9 (Ada, Hopper) only, not on {device.type}; "
            "use fp32 or bf16 here"
        )
    if capability is None:
        index = device.index if device.index is not None else torch.cuda.current_device()
        capability = torch.cuda.get_device_capability(index)
    if tuple(capability) < FP8_MIN_CAPABILITY:
        major, minor = capability
        return (
            f"--dtype fp8 needs a GPU of compute capability >= 8.9 (Ada, Hopper); this one is {major}.{minor}: use bf16"
        )
    return None


def check_fp8(device: str | torch.device) -> None:
    """Raise the one-line :class:`ModelError` of :func:`fp8_refusal`, if any."""
    reason = fp8_refusal(device)
    if reason is not None:
        raise ModelError(reason)


def fp8_backend() -> str:
    """``torchao`` where it is installed, else ``scaled_mm`` (torch's own)."""
    return "torchao" if importlib.util.find_spec("torchao") is not None else "scaled_mm"


def round_rowwise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` (..., k) as float8_e4m3fn rows and their float32 scales (..., 1): ``x ~= q * scale``."""
    amax = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12)
    scale = amax / E4M3_MAX
    q = (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale


def _target_linears(model: Any) -> list[torch.nn.Linear]:
    from care_retriever.runtime.compiled import decoder_layers

    return [m for layer in decoder_layers(model) for m in layer.modules() if isinstance(m, torch.nn.Linear)]


def _emulated_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    w_q, w_scale = getattr(self, "care_fp8_weight"), getattr(self, "care_fp8_scale")  # noqa: B009 (emulate_fp8's)
    x_q, x_scale = round_rowwise(x)
    # the rounded operands are exact in fp32 and so is their product up to fp32's accumulation: one rounding to
    # the tower's dtype at the end, as the GPU's scaled matmul rounds its fp32 accumulator once
    out = F.linear(x_q.float() * x_scale, w_q.float() * w_scale)
    if self.bias is not None:
        out = out + self.bias.float()
    return out.to(x.dtype)


def emulate_fp8(model: Any) -> int:
    """Round the decoder layers' Linear weights and, at every call, their inputs to float8 e4m3 rowwise, multiply
    the rounded values in fp32 and round the output once to the input's dtype, on any device: what FP8's rounding
    does to the tower's vectors, without FP8 matmuls. The weights themselves stay as loaded (their float8 rows and
    scales are attributes beside them: one byte a weight), so the tower's ``state_dict`` and fingerprint do not
    change. Returns the layers changed."""
    linears = _target_linears(model)
    for linear in linears:
        linear.care_fp8_weight, linear.care_fp8_scale = round_rowwise(linear.weight.detach())
        linear.forward = types.MethodType(_emulated_forward, linear)  # type: ignore[method-assign]
    return len(linears)


def scaled_mm_linear(
    x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``x @ W.T + bias`` with ``W`` given as float8 rows ``w_q`` and their scales ``w_scale`` (out, 1): ``x`` rounded
    per token, multiplied in FP8 by ``torch._scaled_mm`` with both scales applied to the output, in ``x``'s dtype."""
    rows = x.reshape(-1, x.shape[-1])
    x_q, x_scale = round_rowwise(rows)
    out = torch._scaled_mm(
        x_q, w_q.t(), scale_a=x_scale, scale_b=w_scale.t(), bias=bias, out_dtype=x.dtype, use_fast_accum=True
    )
    return out.reshape(*x.shape[:-1], out.shape[-1])


def _scaled_mm_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    w_q, w_scale = getattr(self, "care_fp8_weight"), getattr(self, "care_fp8_scale")  # noqa: B009
    return scaled_mm_linear(x, w_q, w_scale, self.bias)


def quantize_fp8(model: Any, backend: str | None = None) -> str:
    """The decoder layers' Linear layers of ``model`` (on a GPU that computes FP8, in bf16) in float8 rowwise;
    returns the backend used (:func:`fp8_backend`)."""
    check_fp8(model.device)
    backend = backend or fp8_backend()
    linears = _target_linears(model)
    if backend == "torchao":
        from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, quantize_

        targets = {id(m) for m in linears}
        hf = model[0].auto_model
        quantize_(
            hf,
            Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()),
            filter_fn=lambda module, _name: id(module) in targets,
        )
        return backend
    for linear in linears:
        w_q, w_scale = round_rowwise(linear.weight.detach())
        linear.care_fp8_weight = w_q
        linear.care_fp8_scale = w_scale
        linear.forward = types.MethodType(_scaled_mm_forward, linear)  # type: ignore[method-assign]
    return "scaled_mm"
