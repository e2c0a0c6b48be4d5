"""Where and how a tower runs: its device, its precision (``auto``, ``saved``, or a named dtype) and its attention
implementation, resolved once from what was asked and what the machine has.

The embedder's constructors and training (:mod:`care_retriever.training.models`) both call these, so both sides of a
model, and a model trained and indexed on one machine, agree on its precision.
"""

from __future__ import annotations

import torch

from care_retriever.errors import ModelError
from care_retriever.runtime.choices import ATTN_IMPLEMENTATIONS, DTYPE_CHOICES
from care_retriever.runtime.fp8 import FP8, check_fp8

__all__ = [
    "DTYPES",
    "auto_dtype",
    "cpu_dtype",
    "flash_attn_installed",
    "gpu_dtype",
    "native_bf16",
    "native_cpu_bf16",
    "resolve_attn_implementation",
    "resolve_device",
    "resolve_dtype",
]


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}


def native_bf16(device: str | torch.device) -> bool:
    """Whether ``device`` computes in bf16 in hardware: a CUDA GPU of compute capability >= 8.0 (Ampere on), or ROCm.

    ``torch.cuda.is_bf16_supported()`` also counts GPUs that only emulate bf16 (a V100 or T4 makes bf16
    tensors but computes them in fp32 units at a fraction of fp16's speed); its ``including_emulation=False``
    (torch >= 2.3) applies the same ``major >= 8`` test, but to the current device, not to ``device``.
    """
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    if torch.version.hip:
        return True
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch.cuda.get_device_capability(index)[0] >= 8


def gpu_dtype(native: bool, pretrained: str | None = None) -> torch.dtype:
    """The half precision a CUDA GPU runs a tower in: bf16 where the GPU computes it natively; on an older GPU fp16,
    except for a tower pretrained in bf16 (Qwen3's ``config.json`` says ``bfloat16``), whose activations go beyond
    fp16's largest value (65,504) and would come out inf: fp32 for that one."""
    if native:
        return torch.bfloat16
    return torch.float32 if pretrained == "bfloat16" else torch.float16


def native_cpu_bf16() -> bool:
    """Whether this machine's CPU multiplies bf16 matrices in hardware: Intel AMX (Sapphire Rapids on), where a bf16
    matmul is much faster than an fp32 one. Other CPUs convert bf16 in software, slower than fp32. Read from torch's
    own CPU feature check (a private function: a torch without it counts as no AMX)."""
    probe = getattr(torch.cpu, "_is_amx_tile_supported", None)
    try:
        return bool(probe()) if callable(probe) else False
    except RuntimeError:
        return False


def cpu_dtype(native: bool, pretrained: str | None = None, decoder: bool = False) -> torch.dtype:
    """The precision a CPU runs a tower in: fp32, except an LLM tower (``decoder``) pretrained in bf16 (Qwen3's
    ``config.json`` says ``bfloat16``) on a CPU that computes bf16 natively (``native``: AMX), which runs in the
    bf16 it was trained in, as transformers and sentence-transformers load it by default (faster there, at half the
    memory). Encoders (query towers) stay fp32 on every CPU: their exported and compiled query paths are fp32."""
    return torch.bfloat16 if native and decoder and pretrained == "bfloat16" else torch.float32


def auto_dtype(device: str | torch.device, pretrained: str | None = None, decoder: bool = False) -> torch.dtype:
    """The precision ``dtype="auto"`` picks: on CUDA :func:`gpu_dtype`, elsewhere :func:`cpu_dtype` (``pretrained``:
    the dtype the tower's ``config.json`` names, see
    :func:`care_retriever.model.towers.modules.tower_pretrained_dtype`; ``decoder``: whether it is an LLM tower,
    :func:`~care_retriever.runtime.architecture.config_is_decoder`).

    Training and indexing call this one function, so both sides of a model agree on its precision.
    """
    device = torch.device(device)
    if device.type == "cuda":
        return gpu_dtype(native_bf16(device), pretrained)
    return cpu_dtype(device.type == "cpu" and native_cpu_bf16(), pretrained, decoder)


def resolve_dtype(
    dtype: str | torch.dtype | None, device: str | torch.device, pretrained: str | None = None, decoder: bool = False
) -> torch.dtype:
    """A torch dtype from ``auto`` (see :func:`auto_dtype`), ``saved`` (``pretrained``, fp32 when unknown), a name
    in :data:`DTYPES`, ``fp8`` (bf16, refused in one line where FP8 does not run), or a torch dtype. fp16 for a
    tower pretrained in bf16 is refused in one line: it overflows."""
    if isinstance(dtype, torch.dtype):
        resolved = dtype
    elif dtype in (None, "auto"):
        return auto_dtype(device, pretrained, decoder)
    elif dtype == "saved":
        return DTYPES.get(str(pretrained), torch.float32)
    elif dtype == FP8:  # loaded in bf16, its Linear layers then in float8 (care_retriever.runtime.forward)
        check_fp8(device)
        return torch.bfloat16
    else:
        try:
            resolved = DTYPES[str(dtype)]
        except KeyError as exc:
            raise ModelError(f"Unknown dtype {dtype!r}. Available dtypes: {[*DTYPE_CHOICES, *DTYPES]}") from exc
    if resolved == torch.float16 and pretrained == "bfloat16":
        raise ModelError(
            "fp16: this tower was pretrained in bf16 and overflows fp16's range (inf vectors); use bf16 on a GPU "
            "that computes it natively, or fp32"
        )
    return resolved


def flash_attn_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("flash_attn") is not None


def resolve_attn_implementation(requested: str | None, device: str | torch.device, dtype: torch.dtype) -> str | None:
    """The ``attn_implementation`` transformers loads a tower with; None leaves transformers' own default.

    ``auto`` (or None): ``flash_attention_2`` where the ``flash_attn`` package is installed and the tower runs
    on CUDA in fp16/bf16 (the only setting flash-attention runs in), else None: transformers' default,
    which is ``sdpa`` for every architecture that has it and ``eager`` for model code that has not (an
    explicit ``sdpa`` would be refused by such code). ``sdpa``, ``flash_attention_2`` and ``eager`` are
    passed as asked, after checking that flash-attention can run here.
    """
    if requested is not None and requested not in ATTN_IMPLEMENTATIONS:
        raise ModelError(f"Unknown attn_implementation {requested!r}. Available: {list(ATTN_IMPLEMENTATIONS)}")
    half = dtype in (torch.float16, torch.bfloat16)
    on_cuda = torch.device(device).type == "cuda"
    if requested in (None, "auto"):
        return "flash_attention_2" if flash_attn_installed() and on_cuda and half else None
    if requested == "flash_attention_2":
        if not flash_attn_installed():
            raise ModelError(
                "attn_implementation 'flash_attention_2' needs the flash_attn package (pip install flash-attn "
                "--no-build-isolation); or use 'sdpa'"
            )
        if not (on_cuda and half):
            raise ModelError(
                f"attn_implementation 'flash_attention_2' runs on CUDA in fp16/bf16 only, not on {device} in "
                f"{str(dtype).removeprefix('torch.')}; use 'sdpa'"
            )
    return requested
