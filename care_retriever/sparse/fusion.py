"""Fusing a dense and a sparse ranking into one: RRF, DBSF, weighted sum of min-max scores.

Written here rather than taken from ranx because of the query path: ranx compiles its fusion with numba, which a
search process would pay for at import and first call, where these functions import nothing. They follow the usual
definitions (ranx's ``rrf`` and ``wsum`` with ``norm="min-max"``; Qdrant's
server-side ``Fusion.RRF`` and ``Fusion.DBSF``), so a Qdrant store fuses on the server with the
same meaning.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

FUSIONS = ("rrf", "dbsf", "wsum")
MODES = ("dense", "sparse", "hybrid")
# A document id: a store's id (str), or a row number where the evaluation harness fuses (care_retriever.evaluation)
Id = TypeVar("Id", str, int)
Ranking = Sequence[tuple[Id, float]]  # (id, score), best first

# The defaults with the best mean nDCG@10 on the dev tasks (benchmarks/hybrid_eval.py prints the table).
DEFAULT_FUSION = "wsum"
DEFAULT_RRF_K = 10
DEFAULT_DENSE_WEIGHT = 0.4
DEFAULT_CANDIDATES = 100  # depth of each side's ranking before fusion


@dataclass(frozen=True)
class FusionConfig:
    """How ``hybrid`` fuses: ``rrf`` (``k``), ``dbsf``, or ``wsum`` (``dense_weight``, sparse gets the rest)."""

    method: str = DEFAULT_FUSION
    k: int = DEFAULT_RRF_K
    dense_weight: float = DEFAULT_DENSE_WEIGHT
    candidates: int = DEFAULT_CANDIDATES

    def __post_init__(self) -> None:
        from care_retriever.errors import InputError

        if self.method not in FUSIONS:
            raise InputError(f"Unknown fusion {self.method!r}. Available fusions: {list(FUSIONS)}")
        if self.k < 1:
            raise InputError(f"rrf k must be >= 1, got {self.k}")
        if not 0.0 <= self.dense_weight <= 1.0:
            raise InputError(f"dense_weight must be within [0, 1], got {self.dense_weight}")
        if self.candidates < 1:
            raise InputError(f"candidates must be >= 1, got {self.candidates}")


def check_mode(mode: str) -> str:
    from care_retriever.errors import InputError

    if mode not in MODES:
        raise InputError(f"Unknown mode {mode!r}. Available modes: {list(MODES)}")
    return mode


def rrf(rankings: Sequence[Ranking[Id]], k: int = DEFAULT_RRF_K) -> dict[Id, float]:
    """Reciprocal rank fusion: sum of 1 / (k + rank), ranks from 1."""
    out: dict[Id, float] = {}
    for ranking in rankings:
        for rank, (doc, _) in enumerate(ranking, 1):
            out[doc] = out.get(doc, 0.0) + 1.0 / (k + rank)
    return out


def _minmax(ranking: Ranking[Id]) -> dict[Id, float]:
    if not ranking:
        return {}
    scores = [s for _, s in ranking]
    low, high = min(scores), max(scores)
    span = high - low
    return {doc: (s - low) / span if span > 0 else 1.0 for doc, s in ranking}


def _dbsf(ranking: Ranking[Id]) -> dict[Id, float]:
    """Distribution-based score normalisation as Qdrant does it: (s - (mean - 3 sd)) / (6 sd), sample sd."""
    if len(ranking) < 2:
        return {doc: 0.5 for doc, _ in ranking}
    scores = [s for _, s in ranking]
    mean = sum(scores) / len(scores)
    std = math.sqrt(sum((s - mean) ** 2 for s in scores) / (len(scores) - 1))
    if std == 0:
        return {doc: 0.5 for doc, _ in ranking}
    low = mean - 3 * std
    return {doc: (s - low) / (6 * std) for doc, s in ranking}


def weighted_sum(
    rankings: Sequence[Ranking[Id]],
    weights: Sequence[float],
    normalise: Callable[[Ranking[Id]], dict[Id, float]] = _minmax,
) -> dict[Id, float]:
    out: dict[Id, float] = {}
    for ranking, weight in zip(rankings, weights, strict=True):
        for doc, s in normalise(ranking).items():
            out[doc] = out.get(doc, 0.0) + weight * s
    return out


def fuse(dense: Ranking[Id], sparse: Ranking[Id], config: FusionConfig) -> list[tuple[Id, float]]:
    """One ranking, best first (ties broken by id for a stable order across runs and backends)."""
    if config.method == "rrf":
        fused = rrf([dense, sparse], config.k)
    elif config.method == "dbsf":
        fused = weighted_sum([dense, sparse], [1.0, 1.0], _dbsf)
    else:
        fused = weighted_sum([dense, sparse], [config.dense_weight, 1.0 - config.dense_weight])
    return sorted(fused.items(), key=lambda item: (-item[1], item[0]))
