"""Architectures of towers built from scratch (random weights).

``tiny`` trains in seconds (tests), ``mini`` is a few-million-parameter pair for CPU training,
``base`` has the paper's shapes (a gte-multilingual-base-sized BERT query tower, a
Qwen3-0.6B-shaped decoder document tower) for speed and memory measurement.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Preset:
    name: str
    query: dict[str, Any]
    document: dict[str, Any]
    tokenizer_vocab: int
    # Embedding tables are padded to these sizes so memory matches the real models.
    query_vocab_size: int | None = None
    document_vocab_size: int | None = None
    description: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


PRESETS: dict[str, Preset] = {
    "tiny": Preset(
        name="tiny",
        query=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64),
        document=dict(
            hidden_size=48,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=24,
            intermediate_size=96,
        ),
        tokenizer_vocab=2000,
        description="2-layer 32-wide BERT / 2-layer 48-wide decoder; seconds to train (tests)",
    ),
    "mini": Preset(
        name="mini",
        query=dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024),
        document=dict(
            hidden_size=384,
            num_hidden_layers=6,
            num_attention_heads=6,
            num_key_value_heads=2,
            head_dim=64,
            intermediate_size=1024,
        ),
        tokenizer_vocab=8000,
        description="4-layer 256-wide BERT / 6-layer 384-wide decoder; CPU training",
    ),
    "base": Preset(
        name="base",
        query=dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
        document=dict(
            hidden_size=1024,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            intermediate_size=3072,
        ),
        tokenizer_vocab=16000,
        query_vocab_size=250048,
        document_vocab_size=151936,
        description="12-layer 768-wide BERT (~305M) / Qwen3-0.6B-shaped decoder; speed and memory",
    ),
}


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError as exc:
        raise ValueError(f"Unknown preset {name!r}. Available presets: {sorted(PRESETS)}") from exc
