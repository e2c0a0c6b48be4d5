"""LoRA on the document tower (peft), and folding it back into the weights.

The paper fine-tunes the 4B/8B document tower with LoRA (r=32, alpha=64) in Stage 0 and Stage II:
full fine-tuning of the LLM would cost optimizer state for billions of parameters. The adapter is
merged before a stage's model is saved, so every saved folder is a plain model that
``AsymmetricEmbedder.from_pretrained`` and indexing load without peft.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sentence_transformers.sentence_transformer.modules import Transformer

from care_retriever.errors import InputError


@dataclass
class LoraSpec:
    r: int = 32
    alpha: int = 64
    dropout: float = 0.05
    target_modules: str | list[str] = "all-linear"

    @classmethod
    def from_options(cls, raw: Any, where: str) -> LoraSpec | None:
        if raw is None or raw is True:
            return cls()
        if raw is False:
            return None
        if not isinstance(raw, dict):
            raise InputError(f"{where}: lora must be a mapping (r, alpha, dropout, target_modules) or false")
        unknown = set(raw) - {"r", "alpha", "dropout", "target_modules"}
        if unknown:
            raise InputError(f"{where}: lora: unknown key(s) {sorted(unknown)}")
        spec = cls(**raw)
        if spec.r < 1 or spec.alpha <= 0:
            raise InputError(f"{where}: lora.r must be >= 1 and lora.alpha > 0")
        return spec


def transformer_of(modules: list) -> Transformer:
    for module in modules:
        if isinstance(module, Transformer):
            return module
    raise InputError("tower has no Transformer module")


def add_lora(modules: list, spec: LoraSpec, seed: int = 0) -> int:
    """Wrap the tower's transformer in a peft LoRA model in place; returns the trainable parameter count.

    Only the adapter weights train; the base weights are frozen by peft.
    """
    import torch
    from peft import LoraConfig, get_peft_model

    transformer = transformer_of(modules)
    torch.manual_seed(seed)
    config = LoraConfig(
        r=spec.r,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        target_modules=spec.target_modules,
        bias="none",
    )
    # A PeftModel forwards to the PreTrainedModel it wraps: the tower runs it in that one's place.
    transformer.model = get_peft_model(transformer.auto_model, config)  # type: ignore[assignment]
    return sum(p.numel() for p in transformer.auto_model.parameters() if p.requires_grad)


def merge_lora(modules: list) -> bool:
    """Fold an attached adapter into the base weights; False when none is attached."""
    transformer = transformer_of(modules)
    from peft import PeftModel

    model = transformer.auto_model
    if isinstance(model, PeftModel):
        transformer.model = model.merge_and_unload()
        return True
    return False
