"""Diversification filter: keep a candidate only if the index does not already hold near-copies of it.

CARE's data curation (paper, "Training data curation"): a vector index is seeded with a first set
of texts (5,000 in the paper); for every further candidate the top-``k`` neighbours are retrieved
and the candidate is dropped when more than ``n`` of them have cosine similarity above ``t``;
kept candidates join the index, so later near-copies of them are dropped too. Paper defaults:
queries k=5, t=0.85, n=1; documents k=5, t=0.78, n=1.

The filter streams: one FAISS inner-product index (exact, on unit vectors) grows as candidates are
kept, and candidates are embedded in batches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from tqdm.auto import tqdm

from care_retriever.errors import InputError

PAPER_DEFAULTS = {"query": (5, 0.85, 1), "document": (5, 0.78, 1)}


@dataclass
class DiversifyReport:
    total: int
    kept: int
    seeded: int

    @property
    def dropped(self) -> int:
        return self.total - self.kept


def diversify(
    texts: Sequence[str],
    embed: Callable[[list[str]], np.ndarray],
    *,
    top_k: int = 5,
    threshold: float = 0.85,
    max_neighbours: int = 1,
    seed_size: int = 5000,
    batch_size: int = 256,
    show_progress: bool = True,
) -> tuple[list[int], DiversifyReport]:
    """Indices of the texts to keep, in input order.

    The first ``seed_size`` texts seed the index unconditionally; each later text is kept unless
    more than ``max_neighbours`` of its ``top_k`` nearest kept texts have cosine > ``threshold``.
    Within a batch, candidates are also checked against the candidates kept before them.
    """
    import faiss

    if top_k < 1 or max_neighbours < 0 or not -1.0 <= threshold <= 1.0:
        raise InputError(
            f"diversify: need top_k >= 1, max_neighbours >= 0 and -1 <= threshold <= 1 "
            f"(got {top_k}, {max_neighbours}, {threshold})"
        )
    n = len(texts)
    kept: list[int] = []
    index = None
    seed_size = min(max(seed_size, 0), n)
    with tqdm(total=n, desc="Diversifying", unit="text", disable=not show_progress) as bar:
        for start in range(0, n, batch_size):
            batch = list(range(start, min(start + batch_size, n)))
            vectors = np.ascontiguousarray(embed([texts[i] for i in batch]), dtype=np.float32)
            if index is None:
                index = faiss.IndexFlatIP(vectors.shape[1])
            for row, i in enumerate(batch):
                vec = vectors[row : row + 1]
                if i >= seed_size and index.ntotal:
                    scores, _ = index.search(vec, min(top_k, index.ntotal))
                    if int((scores[0] > threshold).sum()) > max_neighbours:
                        continue
                index.add(vec)
                kept.append(i)
            bar.update(len(batch))
    return kept, DiversifyReport(total=n, kept=len(kept), seeded=seed_size)
