"""``Embedder``: what indexing, search, evaluation and benchmarks need from a dense model.

:class:`~care_retriever.embedder.AsymmetricEmbedder` (a CARE model) and the baselines of
:mod:`care_retriever.baselines` implement it. Every capability a caller uses is here, so callers type
their argument as ``Embedder`` and call it, instead of probing with ``hasattr``. Towers that were not
loaded (``load="query"``) raise :class:`~care_retriever.errors.ModelError` when asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np
    from sentence_transformers import SentenceTransformer


@runtime_checkable
class Embedder(Protocol):
    """A dense model: a query side and a document side in one space of width :attr:`dim`."""

    @property
    def dim(self) -> int:
        """Width of the embedding space (what a store holds)."""
        ...

    @property
    def space_fingerprint(self) -> str:
        """The document space (:mod:`care_retriever.fingerprint`): stores refuse searches from another one."""
        ...

    @property
    def document_model_name(self) -> str:
        """Name of the document model, recorded in a store's manifest (for messages)."""
        ...

    @property
    def query_model(self) -> SentenceTransformer:
        """The tower that encodes queries."""
        ...

    @property
    def document_model(self) -> SentenceTransformer:
        """The tower that encodes documents (the index writer's encoding loop runs it)."""
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

    def embed_documents(self, texts: Sequence[str], *, batch_size: int = 16, show_progress: bool = False) -> np.ndarray:
        """``(len(texts), dim)`` float32 unit rows from the document side."""
        ...
