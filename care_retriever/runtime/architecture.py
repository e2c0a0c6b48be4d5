"""Whether a tower is a decoder (an LLM, causal attention) or a bidirectional encoder: read from its config, by the
towers that load it and the runtime that packs it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

DECODER_MODEL_TYPES = frozenset({"qwen2", "qwen3", "llama", "mistral", "gemma", "gemma2", "gemma3", "phi3", "gpt2"})


def config_is_decoder(config: Mapping[str, Any]) -> bool:
    """Whether a tower whose ``config.json`` holds ``config`` is a decoder (causal attention) rather than a
    bidirectional encoder."""
    archs = config.get("architectures") or []
    return (
        bool(config.get("is_decoder", False))
        or any("CausalLM" in a for a in archs)
        or config.get("model_type") in DECODER_MODEL_TYPES
    )


def is_decoder(transformer: Any) -> bool:
    """Whether the tower (a sentence-transformers ``Transformer`` module) is a decoder (causal attention) rather
    than a bidirectional encoder."""
    return config_is_decoder(transformer.auto_model.config.to_dict())
