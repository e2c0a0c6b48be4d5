"""The one implementation of what an embedder says about itself (:class:`~care_retriever.model.protocols.
EncoderIdentity`): :class:`EmbedderBase`, and :class:`ConfiguredEmbedder`, a CARE model's, read from its config.

:class:`~care_retriever.model.embedder.AsymmetricEmbedder` and the exported query embedders are configured
embedders; the baselines (one model on both sides, :mod:`care_retriever.model.baselines`) derive from the base.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from care_retriever.model import fingerprint

if TYPE_CHECKING:
    from care_retriever.model.config import CareConfig
    from care_retriever.vectors import VectorContract


class EmbedderBase:
    """What every embedder derives the same way: a subclass gives its width, mode, loaded towers and the
    fingerprint of its document side's weights; the query width and the space fingerprint follow from them."""

    @property
    def dim(self) -> int:
        raise NotImplementedError

    @property
    def query_dim(self) -> int:
        return self.dim  # one space: the query side is as wide as the space it searches

    @property
    def mode(self) -> str:
        raise NotImplementedError

    @property
    def loaded_towers(self) -> tuple[str, ...]:
        raise NotImplementedError

    def document_weights(self) -> str:
        """The fingerprint of the document side's weights
        (:func:`care_retriever.model.fingerprint.weights_fingerprint`)."""
        raise NotImplementedError

    def document_space(self, weights: str) -> str:
        """The space fingerprint of document weights ``weights`` under this embedder's document conventions."""
        return fingerprint.space_fingerprint(weights)

    @property
    def space_fingerprint(self) -> str:
        """Identifies the document embedding space; a store built with another one refuses searches.

        Computed from the weights' fingerprint on every read (never stored), so a change of the document-text
        rule (:func:`care_retriever.model.fingerprint.space_fingerprint`) shows at once; hashing the weights, the
        slow part, is each subclass's :meth:`document_weights`.
        """
        return self.document_space(self.document_weights())


class ConfiguredEmbedder(EmbedderBase):
    """A CARE model's face, read from its :class:`~care_retriever.model.config.CareConfig` (``care_config.json``):
    :class:`~care_retriever.model.embedder.AsymmetricEmbedder` and the exported query embedders."""

    config: CareConfig

    @property
    def dim(self) -> int:
        """Width of the shared embedding space (what a store holds)."""
        return self.config.dim

    @property
    def mode(self) -> str:
        return self.config.mode

    @property
    def similarity(self) -> str:
        """What the model's scores are: ``cosine`` (unit vectors) or ``dot`` (normalised before the cut)."""
        return self.config.similarity

    @property
    def vectors(self) -> VectorContract:
        """What the model's vectors are (:mod:`care_retriever.vectors`): similarity, norms, how a store keeps them."""
        return self.config.vectors

    @property
    def takes_instruction(self) -> bool:
        """Whether the query prompt has an instruction slot (an instruction given otherwise is an error)."""
        return self.config.takes_instruction

    def query_prompt(self, instruction: str | None = None) -> str | None:
        return self.config.query_prompt(instruction)

    def document_space(self, weights: str) -> str:
        # the one definition: the document prompt and conventions the config records are part of the space
        return self.config.document_space(weights)
