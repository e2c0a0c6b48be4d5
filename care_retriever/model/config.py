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

from care_retriever.errors import ModelError
from care_retriever.model.towers import DEFAULT_MAX_LENGTH, release
from care_retriever.model.towers.loading import model_file
from care_retriever.model.towers.prompts import DEFAULT_INSTRUCTION, QUERY_PROMPT_TEMPLATE, fill_query_prompt
from care_retriever.vectors import Normalization, Similarity, VectorContract
from care_retriever.version import __version__

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
# 2: a model whose towers normalise before the Matryoshka cut (``normalize: before_truncation``); an older
# reader would renormalise after it and give other vectors, so such configs say they need this version.
FORMAT_VERSION = 2


@dataclass
class TowerInfo:
    pooling: str
    native_dim: int
    max_length: int = DEFAULT_MAX_LENGTH
    base_model: str | None = None
    # The tower's model classes are code shipped with it (auto_map): every load must opt in again.
    trust_remote_code: bool = False
    # The token ids the tower's tokenizer puts after every text (e.g. the EOS a last-token tower pools);
    # part of the document space. None: not recorded (models saved before it was).
    appended_tokens: list[int] | None = None


@dataclass
class CareConfig:
    """What a saved CARE model needs beyond the sentence-transformers modules: its ``care_config.json``.

    Usage example:
    ```python
    from care_retriever import CareConfig

    config = CareConfig.load("models/care")
    print(config.mode, config.dim, config.similarity, config.query_prompt())
    ```

    :param mode: ``asymmetric`` (two towers) or ``symmetric`` (one model on both sides).
    :param dim: the width of the shared embedding space.
    :param query: the query tower (:class:`TowerInfo`: pooling, native width, max length, base model).
    :param document: the document tower.
    :param query_prompt_template: the query prompt with an ``{instruction}`` slot; None: the tower takes no prompt.
    :param default_instruction: the instruction a query gets when the caller names none.
    :param document_prompt: the text put before every document (part of the space).
    :param space_fingerprint: the document tower's weights fingerprint (the space fingerprint derives from it).
    :param preset: the preset a model built from scratch came from.
    :param normalize: ``after_truncation`` (cut to ``dim``, then unit vectors) or ``before_truncation``
        (normalised at full width, then cut: the authors' released models, scored by dot product).
    :param similarity: ``cosine`` or ``dot``.
    :param instructions: query instructions by task type (``retrieval``, ``rerank``, ``sts``, ...).
    :param convention: whose conventions the model follows: None (this package's) or ``authors-release``.
    :param format_version: the file's format version.
    :param care_retriever_version: the version of care-retriever that saved it.
    :param extra: other fields, kept as they are.
    """

    mode: Literal["asymmetric", "symmetric"]
    dim: int
    query: TowerInfo
    document: TowerInfo
    query_prompt_template: str | None = None
    default_instruction: str | None = None
    document_prompt: str | None = None
    space_fingerprint: str | None = None
    preset: str | None = None
    normalize: Normalization = "after_truncation"
    similarity: Similarity = "cosine"
    instructions: dict[str, str] | None = None
    convention: str | None = None
    format_version: int = 1
    care_retriever_version: str = __version__
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        """The config as ``care_config.json`` holds it."""
        data = asdict(self)
        # Readers older than the normalisation field would renormalise: such a model says it needs version 2.
        data["format_version"] = 2 if self.normalize != "after_truncation" else 1
        return json.dumps(data, ensure_ascii=False, indent=2)

    def document_convention(self) -> dict[str, Any]:
        """What sets the document space beside its weights (the document-text convention)."""
        recorded = self.document.appended_tokens is not None
        return {
            "appended_tokens": self.document.appended_tokens,
            "max_length": self.document.max_length if recorded else None,
            "normalize": None if self.normalize == "after_truncation" else self.normalize,
        }

    def document_space(self, weights: str | None = None) -> str:
        """The space fingerprint stores compare: the document weights with the document prompt and convention.

        :param weights: the document tower's weights fingerprint as it is in memory (None: the one recorded here).
        """
        from care_retriever.model.fingerprint import space_fingerprint

        weights = weights or self.space_fingerprint
        if weights is None:
            raise ModelError("the model's document weights have no fingerprint yet (it is computed at save)")
        return space_fingerprint(weights, self.document_prompt, self.document_convention())

    @property
    def vectors(self) -> VectorContract:
        """What the model's vectors are (:mod:`care_retriever.vectors`): the one definition every door reads."""
        return VectorContract(self.similarity, self.normalize)

    @property
    def takes_instruction(self) -> bool:
        """Whether the query prompt has an instruction slot (an instruction given to any other tower is an error)."""
        return bool(self.query_prompt_template) and "{instruction}" in (self.query_prompt_template or "")

    def task_instruction(self, task_type: str) -> str | None:
        """The model's own instruction for a task type (its instruction table), else None.

        :param task_type: ``retrieval``, ``rerank``, ``sts``, ...
        """
        return (self.instructions or {}).get(task_type)

    def query_prompt(self, instruction: str | None = None) -> str | None:
        """The text prepended to every query (None for towers that take no prompt).

        :param instruction: the instruction to fill in (None: the default one).
        :raises ModelError: an instruction for a tower whose prompt has no instruction slot (never dropped).
        """
        if instruction and not self.takes_instruction:
            raise ModelError(
                "this model's query tower takes no instruction (its query prompt has no {instruction} slot); "
                "leave the instruction out"
            )
        return fill_query_prompt(self.query_prompt_template, instruction or self.default_instruction)

    @classmethod
    def load(cls, model: str | os.PathLike[str], hub: dict[str, Any] | None = None) -> CareConfig:
        """The ``care_config.json`` of a model folder or hub id (the one reader of that file).

        For a model in the authors' release layout, the config its conventions give.

        :param model: the model folder or hub id.
        :param hub: hub look-up options (revision, token, cache folder); offline mode is honoured either way.
        :raises ModelError: no config there, or one this version cannot read.
        """
        path = model_file(model, CONFIG_NAME, hub)
        if path is None:
            # The authors' release layout (query_encoder/ + doc_encoder/) has no care_config.json: its
            # conventions are known, and read from its folders.
            layout = release.find_release(str(model), need=("query",))
            if layout is not None:
                return cls.from_release(layout)
            raise ModelError(
                f"{model}: no {CONFIG_NAME}; not a CARE model (plain sentence-transformers models load with "
                "care_retriever.model.baselines.SentenceTransformerEmbedder)"
            )
        try:
            data = json.loads(Path(path).read_text("utf-8"))
        except (OSError, ValueError) as exc:
            raise ModelError(f"{path}: unreadable CARE config ({exc})") from exc
        if not isinstance(data, dict):
            raise ModelError(f"{path}: malformed CARE config (not a JSON object)")
        return cls.from_dict(data, str(path))

    @classmethod
    def from_release(cls, layout: release.ReleaseLayout) -> CareConfig:
        """The config of a model in the authors' release layout, read from its folders' configs alone.

        The one description of the authors' conventions every path reads; no tower is loaded.

        :param layout: the release's folders (:func:`care_retriever.model.towers.release.find_release`).
        """
        if layout.document.is_dir():  # an adapter-only document tower is named before anything is read
            release.check_document_folder(layout.document, layout.source)
        query_dim = release.hidden_size(layout.query)
        if not query_dim:
            raise ModelError(
                f"{layout.source}: {release.QUERY_FOLDER}/config.json does not give the tower's hidden_size"
            )
        document_dim = release.hidden_size(layout.document)
        dim = min(query_dim, release.AUTHORS_DIM)
        return cls(
            mode="asymmetric",
            dim=dim,
            query=TowerInfo("cls", query_dim, release.AUTHORS_MAX_LENGTH, layout.source),
            document=TowerInfo(
                "last_token", document_dim, release.AUTHORS_MAX_LENGTH, layout.source, appended_tokens=[]
            ),
            space_fingerprint=release.release_fingerprint(layout, dim),
            **release.authors_conventions(),
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = CONFIG_NAME) -> CareConfig:
        """The config a parsed ``care_config.json`` holds.

        :param data: the file's JSON object.
        :param source: where it was read, for messages.
        :raises ModelError: a newer format, or a malformed config.
        """
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
