"""The precision a stage trains in: bf16 where the GPU computes it natively, never fp16 for a tower
pretrained in bf16, fp32 on CPU.

A recipe asks with the trainer's own flags (``bf16: true`` / ``fp16: true`` in ``defaults`` or a stage's
``args``); :func:`training_precision` turns that request, the GPU's compute capability and the towers'
pretraining dtypes into what the trainer is given. It takes no torch state, so every branch is tested
without a GPU; :func:`current_capability` and :func:`care_retriever.model.towers.modules.tower_pretrained_dtype` read
the inputs of a real run.

Why fp16 is never used for a bf16-pretrained tower: fp16's largest value is 65,504, bf16's is fp32's. A
decoder pretrained in bf16 (Qwen3's ``config.json`` says ``bfloat16``) has activations beyond fp16's range;
under fp16 autocast they overflow to inf, and the loss scaler then skips those steps without a word.
Why bf16 only natively: ``torch.cuda.is_bf16_supported()`` also counts GPUs that emulate it (V100, T4),
where a bf16 step runs on fp32 units, slower than fp32 itself.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from care_retriever.errors import InputError

logger = logging.getLogger("care_retriever")
NATIVE_BF16_CAPABILITY = (8, 0)  # Ampere on: A100, A10, RTX 30xx, H100 (the rule of runtime.device.native_bf16)
PRETRAINED_DTYPE_KEY = "pretrained_dtype"  # care_config.json extra: {"query": "float32", "document": "bfloat16"}


@dataclass(frozen=True)
class Precision:
    name: str  # "fp32" | "bf16" | "fp16"
    note: str | None = None  # one line, logged, when the recipe's request was changed

    @property
    def trainer_flags(self) -> dict[str, bool]:
        return {"bf16": self.name == "bf16", "fp16": self.name == "fp16"}

    @property
    def torch_dtype(self) -> Any:
        import torch

        return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[self.name]


def requested_precision(settings: Mapping[str, Any]) -> str:
    """What the recipe's trainer flags ask for: fp32, bf16 or fp16."""
    bf16, fp16 = bool(settings.get("bf16")), bool(settings.get("fp16"))
    if bf16 and fp16:
        raise InputError("training arguments: bf16 and fp16 are both true; set one of them")
    return "bf16" if bf16 else "fp16" if fp16 else "fp32"


def training_precision(
    settings: Mapping[str, Any],
    capability: tuple[int, int] | None,
    pretrained: Mapping[str, str | None],
) -> Precision:
    """The precision to train in.

    ``settings``: the stage's trainer arguments (``bf16`` / ``fp16``); ``capability``: the CUDA GPU's
    compute capability, None without a CUDA GPU; ``pretrained``: tower name -> the dtype its
    ``config.json`` names (``bfloat16``, ``float16``, ``float32`` or None when unknown).
    """
    requested = requested_precision(settings)
    if capability is None:
        note = f"no CUDA GPU: training in fp32 (the recipe's {requested} is for GPUs)" if requested != "fp32" else None
        return Precision("fp32", note)
    native = tuple(capability) >= NATIVE_BF16_CAPABILITY
    gpu = f"compute capability {capability[0]}.{capability[1]}"
    in_bf16 = sorted(name for name, dtype in pretrained.items() if dtype == "bfloat16")
    if requested == "bf16":
        if native:
            return Precision("bf16")
        raise InputError(
            f"bf16: this GPU ({gpu}) has no native bf16 (it would emulate it, slower than fp32); "
            + (
                f"fp16 would overflow the {' and '.join(in_bf16)} tower pretrained in bf16: set bf16: false (fp32)"
                if in_bf16
                else "set bf16: false (fp32) or fp16: true"
            )
        )
    if requested == "fp16" and in_bf16:
        towers = " and ".join(in_bf16)
        if native:
            return Precision("bf16", f"fp16 -> bf16: the {towers} tower was pretrained in bf16 (fp16 would overflow)")
        raise InputError(
            f"fp16: the {towers} tower was pretrained in bf16 and overflows in fp16, and this GPU ({gpu}) has no "
            "native bf16; set fp16: false (fp32)"
        )
    return Precision(requested)


def held_dtypes(
    defaults: Mapping[str, Any], pretrained: Mapping[str, str | None], device: Any = None
) -> dict[str, str]:
    """The dtype each tower is held in while it trains: fp32 (mixed precision autocasts), except a
    document tower pretrained in the half precision the run trains in on a GPU that computes it natively
    (Qwen3-4B under ``bf16: true``): it is held, loaded and saved in that dtype, half the memory and
    bytes. Its stages train it through LoRA (fp32 adapters) or keep it frozen. The query tower, trained
    in full, keeps fp32 weights for the optimizer. ``defaults``: the recipe's ``bf16`` / ``fp16``."""
    fp32 = {"query": "fp32", "document": "fp32"}
    requested = requested_precision({key: defaults.get(key) for key in ("bf16", "fp16")})
    half = {"bf16": "bfloat16", "fp16": "float16"}.get(requested)
    capability = current_capability(device)
    if capability is None or half is None or pretrained.get("document") != half:
        return fp32
    if requested == "bf16" and tuple(capability) < NATIVE_BF16_CAPABILITY:
        return fp32  # refused by training_precision when the stage starts, with its one line
    return {"query": "fp32", "document": requested}


def current_capability(device: Any = None) -> tuple[int, int] | None:
    """The compute capability of the GPU training runs on; None on CPU (or ``--device cpu``)."""
    import torch

    if not torch.cuda.is_available() or (device is not None and torch.device(device).type != "cuda"):
        return None
    if torch.version.hip:  # ROCm GPUs report their GCN architecture; every one torch supports has bf16
        return NATIVE_BF16_CAPABILITY
    return tuple(torch.cuda.get_device_capability())  # type: ignore[return-value]
