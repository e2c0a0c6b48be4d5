"""What each side of the system needs from a model, as protocols a type checker holds callers to, and the one
implementation of what every embedder of this package says about itself.

- :class:`EmbedderFace`: what any embedder says about itself, whichever side it encodes: its space's width
  (``dim``, ``query_dim``), ``mode``, the towers in memory and the fingerprint of its document space.
- :class:`QueryEncoder`: the search path (:class:`~care_retriever.search.retriever.CareRetriever`, the HTTP
  service, the framework query embedders). :func:`care_retriever.search.backends.load_query_embedder` returns
  one: a torch query tower (:class:`~care_retriever.model.embedder.AsymmetricEmbedder` loaded with
  ``load="query"``) or an exported one (ONNX, OpenVINO), which has no torch module at all. Nothing here
  names a torch tower, so a search process type-checks without the document tower or torch.
- :class:`DocumentEncoder`: indexing (:class:`~care_retriever.indexing.writer.DocumentStoreWriter`,
  :mod:`care_retriever.indexing.distributed`, the framework document embedders): the document side's encoding and
  identity.
  It is a sibling of :class:`QueryEncoder`, not a kind of it: a document-only object is no query encoder.
- :class:`Embedder`: both sides and their torch towers: the evaluation harness and benchmarks, which also
  count each tower's parameters.
- :class:`SavableModel`: what the one writer of a model folder (:func:`care_retriever.model.saving.save_model`)
  reads of a model; declared here, not by naming the embedder, so that the writer and the embedder whose
  ``save_pretrained`` calls it do not import each other.

:class:`~care_retriever.model.embedder.AsymmetricEmbedder` and the baselines of :mod:`care_retriever.model.baselines`
implement all of them; the exported query embedders of :mod:`care_retriever.search.backends` a :class:`QueryEncoder`.
They share one implementation of the face: :class:`EmbedderBase`, specialised by :class:`ConfiguredEmbedder`
(a CARE model, read from its ``care_config.json``) and :class:`OneModelEmbedder` (one model on both sides).
Towers that were not loaded (``load="query"``) raise :class:`~care_retriever.errors.ModelError` when asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from care_retriever.errors import InputError
from care_retriever.model import fingerprint
from care_retriever.runtime.batch_limits import DOCUMENT_BATCH_SIZE

if TYPE_CHECKING:
    import numpy as np
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Module
    from tqdm.auto import tqdm

    from care_retriever.model.config import CareConfig
    from care_retriever.model.tower import Side, Tower
    from care_retriever.runtime.batch_limits import BatchLimits
    from care_retriever.vectors import VectorContract


@runtime_checkable
class EmbedderFace(Protocol):
    """What every embedder says about itself, whichever side (or sides) it encodes."""

    @property
    def dim(self) -> int:
        """Width of the embedding space (what a store holds)."""
        ...

    @property
    def query_dim(self) -> int:
        """Width of the query side's vectors: the space's width (one space for both sides)."""
        ...

    @property
    def mode(self) -> str:
        """``asymmetric`` (two towers) or ``symmetric`` (one model on both sides)."""
        ...

    @property
    def loaded_towers(self) -> tuple[str, ...]:
        """The towers in memory: ``("query",)`` in a search process (the service's ``/health`` reports it)."""
        ...

    @property
    def space_fingerprint(self) -> str:
        """The document space (:mod:`care_retriever.model.fingerprint`): stores refuse searches from another one."""
        ...


@runtime_checkable
class QueryEncoder(EmbedderFace, Protocol):
    """The query side of a model: what a search process loads and calls."""

    def query_prompt(self, instruction: str | None = None) -> str | None:
        """The prompt put before each query for ``instruction`` (None: no prompt)."""
        ...

    def embed_queries(
        self,
        texts: Sequence[str],
        *,
        instruction: str | None = None,
        batch_size: int = 32,
        show_progress: bool = False,
    ) -> np.ndarray:
        """``(len(texts), dim)`` float32 unit rows from the query side."""
        ...


@runtime_checkable
class DocumentEncoder(EmbedderFace, Protocol):
    """The document side of a model: what indexing needs."""

    @property
    def document_model_name(self) -> str:
        """The document tower's identity (hub id or folder), recorded in a store's manifest (for messages)."""
        ...

    @property
    def similarity(self) -> str:
        """What the document vectors' scores are (:data:`care_retriever.stores.base.METRICS`): ``cosine`` (unit
        vectors) or ``dot`` (normalised before a Matryoshka cut); a new store records it as its metric."""
        ...

    @property
    def document_model(self) -> SentenceTransformer | None:
        """The torch tower that encodes documents, or None where the document side has none. The index writer
        reads where it runs (on an accelerator the BM25 side is tokenised in a child process beside it) and
        measures a GPU's token budget on it (``max_batch_tokens="auto"``); with None it runs on the CPU's limits."""
        ...

    def embed_documents(
        self,
        texts: Sequence[str],
        *,
        batch_size: int = DOCUMENT_BATCH_SIZE,
        show_progress: bool = False,
        limits: BatchLimits | None = None,
        progress: tqdm | None = None,
        stats: dict[str, int] | None = None,
    ) -> np.ndarray:
        """``(len(texts), dim)`` float32 unit rows from the document side, with its document prompt.

        ``limits``: texts and padded tokens per forward pass, as an object the caller keeps across calls
        (halved on out-of-memory: the index writer's later chunks keep the lowered limit); it replaces
        ``batch_size``. ``progress``: an outer bar to advance instead of drawing one. ``stats``: a dict to
        add the ``truncated`` count to (see :func:`care_retriever.model.encoding.encode_texts`).
        """
        ...


@runtime_checkable
class Embedder(QueryEncoder, DocumentEncoder, Protocol):
    """Both sides and their torch towers: the evaluation harness and benchmarks (parameter counts)."""

    @property
    def query_model(self) -> SentenceTransformer:
        """The tower that encodes queries."""
        ...

    @property
    def document_model(self) -> SentenceTransformer:
        """The tower that encodes documents."""
        ...


class SavableModel(Protocol):
    """What a save reads of a model (:func:`care_retriever.model.saving.save_model`): both towers' modules (one
    list for both where the towers are one), each tower as a value, the model as one ``SentenceTransformer`` and
    the config it is saved with. :class:`~care_retriever.model.embedder.AsymmetricEmbedder` is one."""

    query_modules: list[Module] | None
    document_modules: list[Module] | None

    @property
    def loaded_towers(self) -> tuple[str, ...]:
        """The towers in memory (a save needs both)."""
        ...

    def tower(self, side: Side) -> Tower:
        """The ``side`` tower as a value: its modules and its transformer, cast to a save's dtype."""
        ...

    def to_sentence_transformer(self) -> SentenceTransformer:
        """Both towers as one ``SentenceTransformer`` (sentence-transformers' folder layout)."""
        ...

    def saved_config(self, *, rehash: bool = False) -> CareConfig:
        """The config a save writes, with the document weights' fingerprint (``rehash``: hashed again)."""
        ...


# ---------------------------------------------------------------------- the face's one implementation
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


class OneModelEmbedder(EmbedderBase):
    """One model on both sides (the baselines): symmetric, both sides in memory, its weights the document side's."""

    model: Any
    _weights: str | None = None

    @property
    def mode(self) -> str:
        return "symmetric"

    @property
    def similarity(self) -> str:
        return "cosine"  # what a baseline's store has always recorded: its scores are compared as cosines

    @property
    def loaded_towers(self) -> tuple[str, ...]:
        return ("query", "document")  # one model, both sides

    @property
    def document_model(self) -> Any:
        """The model both sides run."""
        return self.model

    @property
    def query_model(self) -> Any:
        return self.model

    def document_weights(self) -> str:
        # hashed on first use and kept: the model is not trained through this interface
        if self._weights is None:
            self._weights = fingerprint.weights_fingerprint([self.model], self.dim)
        return self._weights


# ------------------------------------------------------------------
# Input checks for texts to encode; torch-free, so the exported query backends share them.
def check_texts(texts: Sequence[str], what: str) -> list[str]:
    """Validate a batch of texts: a list of str, no None, valid Unicode. Empty strings are allowed here.

    A lone surrogate (``"\\ud800"``, which JSON escapes can produce) is not Unicode text: the tokenizer
    would fail with an obscure TypeError and SQLite could not store it, so it is refused here by index.
    """
    if isinstance(texts, str):
        raise InputError(f"{what}: expected a list of texts, got a single str (wrap it in a list)")
    out = list(texts)
    if all_unicode(out):  # the usual case, checked in bulk; otherwise each text, for the first one's message
        return out
    for i, text in enumerate(out):
        if not isinstance(text, str):
            raise InputError(f"{what}[{i}]: expected str, got {type(text).__name__}")
        check_unicode(text, f"{what}[{i}]")
    return out


# Strings checked by all_unicode at once: joined in pieces of this many, so that the joined copy stays small beside
# the texts themselves.
UNICODE_PIECE = 1024


def all_unicode(strings: Sequence[object]) -> bool:
    """Whether every item is a str that encodes as UTF-8, found without a Python call per string (a join and one
    encode per piece: about a tenth of the time of one ``check_unicode`` each on short texts). False: some item is
    not, and the caller checks each to say which. Joining cannot hide a lone surrogate: Python's UTF-8 codec refuses
    every surrogate code point, paired or not."""
    try:
        for start in range(0, len(strings), UNICODE_PIECE):
            "".join(strings[start : start + UNICODE_PIECE]).encode("utf-8")  # type: ignore[arg-type]
    except (TypeError, UnicodeEncodeError):
        return False
    return True


def check_unicode(text: str, where: str) -> None:
    """Raise :class:`InputError` if ``text`` cannot be encoded as UTF-8 (lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(f"{where}: not valid Unicode (lone surrogate at character {exc.start})") from exc
