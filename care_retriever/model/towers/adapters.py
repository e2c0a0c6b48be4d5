"""LoRA adapters on a tower: one attached to a document tower when a model is built from towers, and the adapters
of a saved model folded into its base weights when it is loaded."""

from __future__ import annotations

import torch
from sentence_transformers.sentence_transformer.modules import Module, Transformer

from care_retriever.errors import ModelError


def merge_lora(modules: list[Module]) -> None:
    """Fold LoRA adapters into the base weights: inference then costs what the plain model costs."""
    for module in modules:
        if isinstance(module, Transformer):
            model = module.auto_model
            if hasattr(model, "merge_and_unload") and hasattr(model, "peft_config"):
                module.model = model.merge_and_unload()


def attach_adapter(transformer: Transformer, adapter: str, merge: bool, base_name: str) -> None:
    """Apply a LoRA adapter to the document tower, read as the task peft saved it for.

    Adapters published for an LLM are usually peft ``CAUSAL_LM`` adapters: their keys and target
    modules name the causal-LM wrapper (``model.layers.N...``), and ``PeftModelForCausalLM`` needs the
    wrapper's generation methods. The tower holds the bare decoder (``AutoModel``), so such an adapter
    is applied to a causal-LM shell built around it without weights (its head stays on the meta device
    and is never run), merged, and the decoder taken back out.
    """
    from peft import PeftConfig, PeftModel
    from transformers import AutoModelForCausalLM

    try:
        peft_config = PeftConfig.from_pretrained(adapter)
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot load LoRA adapter {adapter!r}: {str(exc).splitlines()[0]}") from exc
    decoder = transformer.auto_model
    causal = str(getattr(peft_config.task_type, "value", peft_config.task_type)) == "CAUSAL_LM"
    if causal and not merge:
        raise ModelError(f"LoRA adapter {adapter!r} is a CAUSAL_LM adapter: the document tower takes it merged")
    host: torch.nn.Module = decoder
    if causal:
        with torch.device("meta"):
            host = AutoModelForCausalLM.from_config(decoder.config)
        host.model = decoder
    try:
        model = PeftModel.from_pretrained(host, adapter)
    except (OSError, ValueError, RuntimeError, KeyError, AttributeError) as exc:
        raise ModelError(
            f"cannot apply LoRA adapter {adapter!r} (trained on {peft_config.base_model_name_or_path!r}) to the "
            f"document tower {base_name!r}: {str(exc).splitlines()[0]}"
        ) from exc
    if not merge:
        # A PeftModel forwards to the PreTrainedModel it wraps: the tower runs it in that one's place.
        transformer.model = model  # type: ignore[assignment]
        return
    merged = model.merge_and_unload()
    transformer.model = merged.model if causal else merged
