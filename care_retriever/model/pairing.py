"""How two pretrained towers are paired into one CARE model (:class:`TowerPairing`): torch-free, so a command
checks it before any weights load."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from care_retriever.errors import ModelError
from care_retriever.model.towers import DEFAULT_MAX_LENGTH
from care_retriever.model.towers.prompts import DEFAULT_INSTRUCTION
from care_retriever.model.towers.release import CONVENTION

CONVENTIONS = (CONVENTION,)


@dataclass(frozen=True)
class TowerPairing:
    """How two pretrained towers are paired into one model (the settings of ``AsymmetricEmbedder.from_towers``).

    Every field has the default a pair of hub towers needs.

    Usage example:
        ```python
        from care_retriever import AsymmetricEmbedder
        from care_retriever.model.pairing import TowerPairing

        embedder = AsymmetricEmbedder.from_towers(
            "alibaba-nlp-community/gte-multilingual-base",
            "Qwen/Qwen3-Embedding-4B",
            TowerPairing(max_length=256),
        )
        ```

    :param query_pooling: the query tower's pooling (``cls``, ``mean``, ``last_token``); None: the tower's own.
    :param document_pooling: the document tower's pooling; None: the tower's own, else ``last_token``.
    :param query_prompt_template: the query prompt with ``{instruction}`` and ``{query}``; ``"auto"``: the query
        tower's own prompt, else the instruction form for a decoder query tower and none for a BERT tower.
    :param default_instruction: the instruction a query gets when the caller names none.
    :param max_length: the tokens each tower reads at most.
    :param document_adapter: a LoRA adapter (folder or hub id) attached to the document tower.
    :param merge_adapter: merge that adapter into the document tower's weights.
    :param trust_remote_code: let a tower run model code shipped with it (every later load must pass it again).
    :param allow_pickled_weights: read ``pytorch_model.bin`` weights (pickles run code when read).
    :param preset: the preset a tower built from scratch came from, recorded in the model's config.
    :param convention: ``"authors-release"``: the conventions of the authors' released models (``[CLS]`` queries,
        their instruction table, normalisation before the Matryoshka cut, dot-product scores).
    """

    query_pooling: str | None = None
    document_pooling: str | None = None
    query_prompt_template: str | Literal["auto"] | None = "auto"
    default_instruction: str = DEFAULT_INSTRUCTION
    max_length: int = DEFAULT_MAX_LENGTH
    document_adapter: str | None = None
    merge_adapter: bool = True
    trust_remote_code: bool = False
    allow_pickled_weights: bool = False
    preset: str | None = None
    convention: str | None = None

    def __post_init__(self) -> None:
        if self.convention not in (None, *CONVENTIONS):
            raise ModelError(f"Unknown convention {self.convention!r}. Available conventions: {list(CONVENTIONS)}")
        if self.max_length < 1:
            raise ModelError(f"max_length must be >= 1, got {self.max_length}")
