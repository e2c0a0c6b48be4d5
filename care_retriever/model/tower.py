"""``Tower``: one tower of a model as a value (its sentence-transformers modules and what ``care_config.json``
records of it), the unit :meth:`AsymmetricEmbedder.tower <care_retriever.model.embedder.AsymmetricEmbedder.tower>`
gives and :meth:`~care_retriever.model.embedder.AsymmetricEmbedder.with_tower` takes."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from sentence_transformers.sentence_transformer.modules import Module, Transformer

from care_retriever.errors import ModelError
from care_retriever.model.config import TowerInfo
from care_retriever.model.towers.modules import pooling_mode

Side = Literal["query", "document"]


@dataclass(frozen=True)
class Tower:
    """One tower of a model as a value: its sentence-transformers modules, what ``care_config.json`` records of
    it, and for a document tower its weights' fingerprint where known (hashing a 4B tower takes tens of seconds).

    The modules are shared, not copied: :meth:`AsymmetricEmbedder.with_tower` builds a new model around them,
    and code that changes their weights in place says so with :meth:`retrained`.
    """

    modules: list[Module]
    info: TowerInfo
    weights: str | None = None

    @property
    def transformer(self) -> Transformer:
        for module in self.modules:
            if isinstance(module, Transformer):
                return module
        raise ModelError("the tower has no Transformer module")

    def with_pooling(self, pooling: str) -> Tower:
        """This tower pooling with ``pooling`` (cls | mean | last_token); a pooling has no weights to hash."""
        from sentence_transformers.sentence_transformer.modules import Pooling

        mode = pooling_mode(pooling)
        modules: list[Module] = [
            Pooling(m.get_embedding_dimension(), pooling_mode=mode) if isinstance(m, Pooling) else m
            for m in self.modules
        ]
        return replace(self, modules=modules, info=replace(self.info, pooling=pooling))

    def with_max_length(self, max_length: int) -> Tower:
        """This tower reading at most ``max_length`` tokens per text. The limit is set on the shared Transformer
        module (there is no copy to set it on): the model the tower came from is meant to be replaced."""
        self.transformer.max_seq_length = max_length
        return replace(self, info=replace(self.info, max_length=max_length))

    def retrained(self) -> Tower:
        """This tower after its weights changed in place (training): its fingerprint is hashed again when asked."""
        return replace(self, weights=None)
