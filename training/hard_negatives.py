"""Hard-negative mining over a FAISS index of the document tower's embeddings.

For each query the pool is searched with the query tower; candidates ranked inside the window
``[range_min, range_max)`` become negatives, except the query's positives and *near-duplicates of
a positive* (document-document cosine >= ``duplicate_threshold``): the top ranks and duplicates
are too often unlabelled positives, and training them away hurts (the usual false-negative
problem of mined negatives). sentence-transformers' ``mine_hard_negatives`` filters on the
query-candidate score only, so it cannot drop a candidate for being a copy of the positive.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from care_retriever.errors import InputError

if TYPE_CHECKING:
    from care_retriever.model.embedder import AsymmetricEmbedder


def mine_negative_indices(
    query_vectors: np.ndarray,
    doc_vectors: np.ndarray,
    positives: list[set[int]],
    *,
    num: int,
    range_min: int = 0,
    range_max: int = 50,
    duplicate_threshold: float = 0.95,
) -> list[list[int]]:
    """Indices (into ``doc_vectors``) of up to ``num`` mined negatives per query, best-ranked first.

    Vectors are unit-normalised float32, so inner product is cosine similarity.
    """
    import faiss

    if range_min < 0 or range_max <= range_min:
        raise InputError(f"hard negatives: need 0 <= range_min < range_max, got {range_min}, {range_max}")
    if num < 1:
        raise InputError(f"hard negatives: num must be >= 1, got {num}")
    if len(query_vectors) != len(positives):
        raise ValueError("one positive set per query is needed")
    index = faiss.IndexFlatIP(doc_vectors.shape[1])
    index.add(np.ascontiguousarray(doc_vectors, dtype=np.float32))
    depth = min(len(doc_vectors), range_max + max((len(p) for p in positives), default=0))
    _, ranked = index.search(np.ascontiguousarray(query_vectors, dtype=np.float32), depth)
    out: list[list[int]] = []
    for row, pos in zip(ranked, positives, strict=True):
        pos_list = sorted(pos)
        pos_vecs = doc_vectors[pos_list] if pos_list else None
        chosen: list[int] = []
        rank = 0
        for candidate in row:
            if candidate < 0 or candidate in pos:
                continue
            # rank counts non-positive candidates, so a query with many positives still gets its window
            if rank >= range_max:
                break
            rank += 1
            if rank - 1 < range_min:
                continue
            if pos_vecs is not None and float(np.max(pos_vecs @ doc_vectors[candidate])) >= duplicate_threshold:
                continue
            chosen.append(int(candidate))
            if len(chosen) >= num:
                break
        out.append(chosen)
    return out


def mine_for_queries(
    embedder: AsymmetricEmbedder,
    positives: Mapping[str, set[str]],
    pool: list[str],
    *,
    num: int,
    range_min: int = 3,
    range_max: int = 50,
    duplicate_threshold: float = 0.95,
    show_progress: bool = True,
    miner: str = "document",
    exchange_dir: Path | None = None,
    dtype: Any = None,
) -> dict[str, list[str]]:
    """Mine negatives for each query from ``pool`` (embedded by the document tower); text in, text out.

    ``miner`` picks the tower that embeds the queries. ``document`` (the default, used by Stage II)
    searches with the document tower on both sides: it is the strongest retriever at hand, and it
    is the same for every ablation (Stage I leaves it untouched), so Stage II with or without
    Stage I trains on the same negatives; query and document towers that were never aligned
    would mine noise. ``query`` searches as the trained model will (query tower -> document index).

    ``dtype``: the training precision (bf16/fp16 encode under autocast). Under torchrun every rank
    calls this with the same arguments: each encodes its share of the pool (exchanged through part
    files in ``exchange_dir``) and encodes and mines its share of the queries; every rank returns
    the whole result.
    """
    from care_retriever.training.distributed import gather_objects, gather_rows, my_share, world_size
    from care_retriever.training.teacher_cache import autocast

    if miner not in ("document", "query"):
        raise InputError(f"hard negatives: miner must be 'document' or 'query', got {miner!r}")
    if world_size() > 1 and exchange_dir is None:
        raise ValueError("several processes mine through part files: exchange_dir is needed")
    queries = list(positives)
    position = {text: i for i, text in enumerate(pool)}
    encode_queries = embedder.embed_documents if miner == "document" else embedder.embed_queries

    def encode(fn, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.empty((0, embedder.dim), dtype=np.float32)
        with autocast(embedder.device, dtype):
            return fn(texts, batch_size=64, show_progress=show_progress)

    pool_order = np.argsort([-len(t) for t in pool], kind="stable")
    pool_share = my_share(pool_order)
    d_vecs = gather_rows(
        exchange_dir or Path("."),
        "mining-pool",
        pool_order,
        encode(embedder.embed_documents, [pool[i] for i in pool_share]),
        embedder.dim,
    )
    query_share = my_share(np.arange(len(queries)))
    pos_idx = [{position[p] for p in positives[queries[i]] if p in position} for i in query_share]
    mined = mine_negative_indices(
        encode(encode_queries, [queries[i] for i in query_share]),
        d_vecs,
        pos_idx,
        num=num,
        range_min=range_min,
        range_max=range_max,
        duplicate_threshold=duplicate_threshold,
    )
    result: dict[str, list[str]] = {}
    for share in gather_objects(list(zip(query_share.tolist(), mined, strict=True))):
        for i, idx in share:
            result[queries[i]] = [pool[j] for j in idx]
    return {q: result[q] for q in queries}
