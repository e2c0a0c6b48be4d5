"""``care_config.json``: what a saved CARE model needs beyond the sentence-transformers modules.

Kept free of torch so a torch-free search process (the ONNX query backend) reads the same
definitions as the torch path: pooling, dims, the prompt template and the space fingerprint.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from care_retriever import __version__
from care_retriever.errors import ModelError
from care_retriever.loading import model_file
from care_retriever.prompts import DEFAULT_INSTRUCTION, QUERY_PROMPT_TEMPLATE, fill_query_prompt

__all__ = [
    "CONFIG_NAME",
    "DEFAULT_INSTRUCTION",
    "DEFAULT_MAX_LENGTH",
    "FORMAT_VERSION",
    "QUERY_PROMPT_TEMPLATE",
    "CareConfig",
    "TowerInfo",
]

CONFIG_NAME = "care_config.json"
FORMAT_VERSION = 1
DEFAULT_MAX_LENGTH = 512


@dataclass
class TowerInfo:
    pooling: str
    native_dim: int
    max_length: int = DEFAULT_MAX_LENGTH
    base_model: str | None = None
    # The tower's model classes are code shipped with it (auto_map): every load must opt in again.
    trust_remote_code: bool = False


@dataclass
class CareConfig:
    """What a saved CARE model needs beyond the sentence-transformers modules."""

    mode: Literal["asymmetric", "symmetric"]
    dim: int
    query: TowerInfo
    document: TowerInfo
    # A prompt template with an ``{instruction}`` slot, or None for towers that take no prompt.
    query_prompt_template: str | None = None
    default_instruction: str | None = None
    # The text put before every document, where the pretrained document tower declares one (part of the space).
    document_prompt: str | None = None
    # The document tower's weights fingerprint (care_retriever.fingerprint.weights_fingerprint); the
    # space fingerprint stores compare is derived from it (AsymmetricEmbedder.space_fingerprint).
    space_fingerprint: str | None = None
    preset: str | None = None
    format_version: int = FORMAT_VERSION
    care_retriever_version: str = __version__
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False, indent=2)

    def query_prompt(self, instruction: str | None = None) -> str | None:
        """The text prepended to every query (None for towers that take no prompt)."""
        return fill_query_prompt(self.query_prompt_template, instruction or self.default_instruction)

    @classmethod
    def load(cls, model: str | os.PathLike[str], hub: dict[str, Any] | None = None) -> CareConfig:
        """The ``care_config.json`` of a model folder or hub id: the one reader of that file.

        ``hub``: hub look-up options (revision, token, cache folder); offline mode is honoured either way.
        """
        path = model_file(model, CONFIG_NAME, hub)
        if path is None:
            raise ModelError(
                f"{model}: no {CONFIG_NAME}; not a CARE model (plain sentence-transformers models load with "
                "care_retriever.baselines.SentenceTransformerEmbedder)"
            )
        try:
            data = json.loads(Path(path).read_text("utf-8"))
        except (OSError, ValueError) as exc:
            raise ModelError(f"{path}: unreadable CARE config ({exc})") from exc
        if not isinstance(data, dict):
            raise ModelError(f"{path}: malformed CARE config (not a JSON object)")
        return cls.from_dict(data, str(path))

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = CONFIG_NAME) -> CareConfig:
        version = data.get("format_version", 1)
        if version > FORMAT_VERSION:
            raise ModelError(
                f"{source}: format_version {version} is newer than this care-retriever understands "
                f"({FORMAT_VERSION}); upgrade care-retriever"
            )
        try:
            return cls(
                **{
                    **data,
                    "query": TowerInfo(**data["query"]),
                    "document": TowerInfo(**data["document"]),
                }
            )
        except (KeyError, TypeError) as exc:
            raise ModelError(f"{source}: malformed CARE config ({exc})") from exc
