"""What a model's vectors are: the one definition every door reads (torch- and faiss-free).

A model's ``care_config.json`` records how its towers normalise (``normalize``) and what its scores are
(``similarity``); a store's manifest records the metric its model scores with. From either, :class:`VectorContract`
says what a vector written to a store or a query vector searched with must look like, and what norms a store of
that model may hold (what ``verify`` checks):

- this package's own models (``after_truncation``, ``cosine``): unit vectors; a store's inner product is cosine;
- the authors' released models and models continued from them (``before_truncation``, ``dot``): normalised at full
  width, cut to the shared dim, never renormalised (norms at most 1, about 0.86 for documents); scores are dot
  products, so a door must keep the vectors exactly as the model gives them.

Every door (the CLI, the Python API, the Haystack and LangChain adapters, the server, ``eval``, ``verify``) goes
through :meth:`VectorContract.prepare` before it writes or searches, so the same text scores the same through any.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from care_retriever.errors import InputError

__all__ = ["NORM_TOLERANCE", "SIMILARITIES", "Normalization", "Similarity", "VectorContract"]

Normalization = Literal["after_truncation", "before_truncation"]
Similarity = Literal["cosine", "dot"]
SIMILARITIES: tuple[Similarity, ...] = ("cosine", "dot")
# How far a stored float32 vector's norm may stray from what its model promises (fp16/bf16 towers, quantized stores
# rescoring from float32 copies): wider than rounding, far narrower than any corruption that matters.
NORM_TOLERANCE = 1e-3


@dataclass(frozen=True)
class VectorContract:
    """What a model's vectors are: its ``similarity`` (the score a store must compute) and its ``normalize`` rule.

    ``unit_norm``: every vector has length 1 (cosine equals the inner product). ``norm_range``: the norms a store
    of this model may hold (a vector written without an embedding is zero and always allowed).
    """

    similarity: Similarity = "cosine"
    normalize: Normalization = "after_truncation"

    def __post_init__(self) -> None:
        if self.similarity not in SIMILARITIES:
            raise InputError(f"Unknown similarity {self.similarity!r}. Available: {list(SIMILARITIES)}")
        if self.normalize not in ("after_truncation", "before_truncation"):
            raise InputError(
                f"Unknown normalisation {self.normalize!r}. Available: ['after_truncation', 'before_truncation']"
            )

    @classmethod
    def for_metric(cls, metric: str) -> VectorContract:
        """The contract of a store whose manifest records ``metric``: ``cosine`` (unit vectors) or ``dot`` (vectors
        as the model gives them: the authors' convention, norms at most 1)."""
        if metric == "dot":
            return cls("dot", "before_truncation")
        if metric == "cosine":
            return cls("cosine", "after_truncation")
        raise InputError(f"Unknown metric {metric!r}. Available metrics: {list(SIMILARITIES)}")

    @property
    def metric(self) -> Similarity:
        """What a store of this model records and computes (``cosine`` stores hold unit vectors)."""
        return self.similarity

    @property
    def unit_norm(self) -> bool:
        """Whether every vector a store of this model holds has length 1."""
        return self.similarity == "cosine" or self.normalize == "after_truncation"

    @property
    def norm_range(self) -> tuple[float, float]:
        """The norms a stored (non-zero) vector may have: exactly 1, or at most 1 (cut without renormalising)."""
        return (1.0, 1.0) if self.unit_norm else (0.0, 1.0)

    def prepare(self, vectors: np.ndarray) -> np.ndarray:
        """Vectors as a store of this model holds them and searches with them, as contiguous float32 rows.

        Cosine: each row L2-normalised (an embedding from elsewhere need not be unit; zero rows stay zero), so the
        store's inner product is cosine. Dot: unchanged; renormalising would change the model's scores and its
        ranking (a short document vector is part of what the model says).
        """
        vectors = np.ascontiguousarray(np.atleast_2d(vectors), dtype=np.float32)
        if self.similarity == "dot":
            return vectors
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return np.divide(vectors, norms, out=np.zeros_like(vectors), where=norms > 0)

    def bad_norms(self, norms: np.ndarray) -> np.ndarray:
        """A mask of the norms a store of this model may not hold (zero rows are allowed: documents written
        without an embedding)."""
        norms = np.asarray(norms, dtype=np.float64)
        low, high = self.norm_range
        inside = (norms >= low - NORM_TOLERANCE) & (norms <= high + NORM_TOLERANCE)
        return ~(inside | (norms == 0.0))

    def describe_norms(self) -> str:
        """The promise in words, for an error message."""
        return "unit-norm" if self.unit_norm else "of norm at most 1"
