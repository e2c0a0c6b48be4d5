"""The sparse side of a Qdrant store (Edge or server): BM25 as a native sparse named vector beside the dense one.

Each point carries ``bm25``: for each of its tokens (:mod:`care_retriever.sparse.tokenizer`) an id
and the BM25 term-frequency part ``tf / (tf + k1 * (1 - b + b * |d| / avgdl))``; the collection
declares that vector with the IDF modifier, so the engine multiplies each query token by its inverse
document frequency, computed from the collection as it is at query time. ``avgdl`` is fixed when the
sparse side is created (recorded in the manifest), so writing a document never rewrites the others.
Token ids are a hash of the token (32 bits of BLAKE2b), the same in every process.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from typing import Any

from care_retriever.sparse.sqlite_bm25 import K1, B

VECTOR = "bm25"


def token_id(token: str) -> int:
    return int.from_bytes(hashlib.blake2b(token.encode("utf-8"), digest_size=4).digest(), "little")


def _merge(ids_values: dict[int, float]) -> tuple[list[int], list[float]]:
    ids = sorted(ids_values)
    return ids, [ids_values[i] for i in ids]


def document_terms(tokens: Sequence[str], avgdl: float, k1: float = K1, b: float = B) -> tuple[list[int], list[float]]:
    """A document's sparse vector as (token ids, BM25 term-frequency weights), for either Qdrant engine."""
    norm = k1 * (1 - b + b * len(tokens) / avgdl)
    values: dict[int, float] = {}
    for token, tf in Counter(tokens).items():  # two tokens sharing a hash add up, as one token would
        tid = token_id(token)
        values[tid] = values.get(tid, 0.0) + tf / (tf + norm)
    return _merge(values)


def query_terms(tokens: Sequence[str]) -> tuple[list[int], list[float]]:
    """A query's sparse vector as (token ids, weights): repeated query tokens count again, as in bm25s."""
    values: dict[int, float] = {}
    for token in tokens:
        tid = token_id(token)
        values[tid] = values.get(tid, 0.0) + 1.0
    return _merge(values)


def document_vector(tokens: Sequence[str], avgdl: float, k1: float = K1, b: float = B) -> Any:
    from qdrant_client import models

    ids, vals = document_terms(tokens, avgdl, k1, b)
    return models.SparseVector(indices=ids, values=vals)


def query_vector(tokens: Sequence[str]) -> Any:
    from qdrant_client import models

    ids, vals = query_terms(tokens)
    return models.SparseVector(indices=ids, values=vals)


def vectors_config() -> dict[str, Any]:
    from qdrant_client import models

    return {VECTOR: models.SparseVectorParams(modifier=models.Modifier.IDF)}
