"""What each side of the system needs from a model, as protocols a type checker holds callers to.

- :class:`EncoderIdentity`: what every encoder says about itself: its space's width, its mode, the towers in
  memory and the fingerprint of its document space.
- :class:`QueryEncoder`: the search path (:class:`~care_retriever.search.retriever.CareRetriever`, the HTTP
  service, the framework query embedders): a torch query tower or an exported one (ONNX, OpenVINO). Nothing here
  names a torch tower, so a search process type-checks without the document tower or torch.
- :class:`DocumentEncoder`: indexing (:class:`~care_retriever.indexing.writer.DocumentStoreWriter`, the framework
  document embedders). A sibling of :class:`QueryEncoder`, not a kind of it: a document-only object encodes no
  queries.
- :class:`Embedder`: both sides and their torch towers (the evaluation harness and benchmarks).
- :class:`SavableModel`: what the writer of a model folder (:func:`care_retriever.model.saving.save_model`) reads
  of a model; declared here so that the writer and the embedder do not import each other.

Their one shared implementation is :mod:`care_retriever.model.embedder_base`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from care_retriever.runtime.batch_limits import DOCUMENT_BATCH_SIZE

if TYPE_CHECKING:
    import numpy as np
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Module
    from tqdm.auto import tqdm

    from care_retriever.model.config import CareConfig
    from care_retriever.model.tower import Side, Tower
    from care_retriever.runtime.batch_limits import BatchLimits


@runtime_checkable
class EncoderIdentity(Protocol):
    """What every encoder says about itself, whichever side (or sides) it encodes."""

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
class QueryEncoder(EncoderIdentity, Protocol):
    """The query side of a model: what a search process loads and calls.

    :func:`~care_retriever.search.backends.load_query_embedder` returns one (torch, ONNX or OpenVINO).

    Usage example:
    ```python
    from care_retriever import CareRetriever, QueryEncoder
    from care_retriever.search.backends import load_query_embedder

    encoder = load_query_embedder("models/care", "auto")
    assert isinstance(encoder, QueryEncoder) and encoder.loaded_towers == ("query",)
    retriever = CareRetriever("faiss:stores/care", encoder)
    print(retriever.search("头痛", top_k=1)[0].id)
    ```
    """

    def query_prompt(self, instruction: str | None = None) -> str | None:
        """The prompt put before each query (None: no prompt).

        :param instruction: the instruction to fill in (None: the model's default).
        """
        ...

    def embed_queries(
        self,
        texts: Sequence[str],
        *,
        instruction: str | None = None,
        batch_size: int = 32,
        show_progress: bool = False,
    ) -> np.ndarray:
        """``(len(texts), dim)`` float32 unit rows from the query side.

        :param texts: the queries.
        :param instruction: the instruction of the query prompt (None: the model's default).
        :param batch_size: queries per forward pass.
        :param show_progress: draw a progress bar.
        """
        ...


@runtime_checkable
class DocumentEncoder(EncoderIdentity, Protocol):
    """The document side of a model: what indexing needs.

    Usage example:
    ```python
    from care_retriever import AsymmetricEmbedder, DocumentEncoder, DocumentStoreWriter, read_corpus

    encoder = AsymmetricEmbedder.from_pretrained("models/care", load="document")
    assert isinstance(encoder, DocumentEncoder) and encoder.loaded_towers == ("document",)
    DocumentStoreWriter(encoder, "faiss:stores/documents", show_progress=False).write(read_corpus("corpus.jsonl"))
    ```
    """

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

        :param texts: the documents' texts.
        :param batch_size: documents per forward pass at most.
        :param show_progress: draw a progress bar.
        :param limits: texts and padded tokens per pass, as an object the caller keeps across calls (halved on
            out-of-memory, so later calls keep the lowered limit); it replaces ``batch_size``.
        :param progress: an outer progress bar to advance instead of drawing one.
        :param stats: a dict to add the ``truncated`` count to.
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
