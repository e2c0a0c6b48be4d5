"""What each side of the system needs from a model, as protocols a type checker holds callers to.

- :class:`QueryEncoder`: the search path (:class:`~care_retriever.retriever.CareRetriever`, the HTTP
  service, the framework query embedders). :func:`care_retriever.backends.load_query_embedder` returns
  one: a torch query tower (:class:`~care_retriever.embedder.AsymmetricEmbedder` loaded with
  ``load="query"``) or an exported one (ONNX, OpenVINO), which has no torch module at all. Nothing here
  names a torch tower, so a search process type-checks without the document tower or torch.
- :class:`DocumentEncoder`: indexing (:class:`~care_retriever.writer.DocumentStoreWriter`,
  :mod:`care_retriever.index`, the framework document embedders): the query side's space plus the
  document side's encoding and identity.
- :class:`Embedder`: the evaluation harness and benchmarks, which also count each tower's parameters.

:class:`~care_retriever.embedder.AsymmetricEmbedder` and the baselines of :mod:`care_retriever.baselines`
implement all three. Towers that were not loaded (``load="query"``) raise
:class:`~care_retriever.errors.ModelError` when asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np
    from sentence_transformers import SentenceTransformer
    from tqdm.auto import tqdm

    from care_retriever.encoding import BatchLimits


@runtime_checkable
class QueryEncoder(Protocol):
    """The query side of a model: what a search process loads and calls."""

    @property
    def dim(self) -> int:
        """Width of the embedding space (what a store holds)."""
        ...

    @property
    def space_fingerprint(self) -> str:
        """The document space (:mod:`care_retriever.fingerprint`): stores refuse searches from another one."""
        ...

    @property
    def loaded_towers(self) -> tuple[str, ...]:
        """The towers in memory: ``("query",)`` in a search process (the service's ``/health`` reports it)."""
        ...

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
class DocumentEncoder(QueryEncoder, Protocol):
    """A model's document side as well: what indexing needs."""

    @property
    def document_model_name(self) -> str:
        """The document tower's identity (hub id or folder), recorded in a store's manifest (for messages)."""
        ...

    def embed_documents(
        self,
        texts: Sequence[str],
        *,
        batch_size: int = 16,
        show_progress: bool = False,
        limits: BatchLimits | None = None,
        progress: tqdm | None = None,
        stats: dict[str, int] | None = None,
    ) -> np.ndarray:
        """``(len(texts), dim)`` float32 unit rows from the document side, with its document prompt.

        ``limits``: texts and padded tokens per forward pass, as an object the caller keeps across calls
        (halved on out-of-memory: the index writer's later chunks keep the lowered limit); it replaces
        ``batch_size``. ``progress``: an outer bar to advance instead of drawing one. ``stats``: a dict to
        add the ``truncated`` count to (see :func:`care_retriever.encoding.encode_texts`).
        """
        ...


@runtime_checkable
class Embedder(DocumentEncoder, Protocol):
    """Both sides and their torch towers: the evaluation harness and benchmarks (parameter counts)."""

    @property
    def query_model(self) -> SentenceTransformer:
        """The tower that encodes queries."""
        ...

    @property
    def document_model(self) -> SentenceTransformer:
        """The tower that encodes documents."""
        ...
