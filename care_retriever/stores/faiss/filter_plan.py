"""How a filtered FAISS search runs, chosen by the share of the store the filter lets through, as Qdrant's query
planner chooses by its cardinality estimate.

- **Exact scan**: few rows match (up to :func:`~care_retriever.stores.faiss.index_factory.exact_scan_rows`):
  their vectors are scored exactly.
- **Id selector**: the index searches with an id bitmap of the matching rows (a query it leaves short: an exact
  scan of them).
- **Widening**: most rows match. The index searches unfiltered for ``wanted x 2 + 10`` expected matches (the
  filter's estimated share of the store tells how many candidates that takes), keeps the candidates the filter
  lets through, in the index's order, and a query left with fewer than ``wanted`` of them runs one of the plans
  above. On flat, IVF and quantized codes the first ``wanted`` matching candidates are the ones the selector's
  search returns; an HNSW search is approximate under either plan.

Both selecting plans read every matching row id from the docstore, which costs more than the search itself once a
filter matches hundreds of thousands of rows; widening reads only its candidates' metadata. It is chosen where its
candidates are estimated to cost less than the matching rows (:func:`widening_candidates`; the filter's share is
estimated on a fixed sample of the rows, :meth:`~care_retriever.stores.faiss.field_index.FieldIndexes.fraction`).

Example:
    ```python
    store.filter_plan({"field": "meta.year", "operator": ">=", "value": 2000}, top_k=10)  # Plan.WIDENING
    ```
"""

from __future__ import annotations

import math
from collections.abc import Callable
from enum import Enum

import numpy as np

from care_retriever.stores.filters import FilterNode

WIDENING_SURPLUS = 10  # matches expected beyond twice those wanted: few searches fall back to the selector
# What one widened candidate costs, counted in matching row ids read from a field index: its metadata checked
# (about one row read) and, on an HNSW graph, its share of a search whose candidate list grows with it (about 25
# row reads). Widening is chosen where it is estimated to cost less.
CANDIDATE_COST = 1.0
HNSW_CANDIDATE_COST = 25.0
MAX_CANDIDATES = 2048  # the most results FAISS's GPU indexes return a query; a filter needing more is selected


class Plan(str, Enum):
    """The ways a filtered search runs (see the module's text)."""

    EXACT_SCAN = "exact scan"
    SELECTOR = "id selector"
    WIDENING = "widening"


def widening_candidates(fraction: float | None, wanted: int, ntotal: int, *, graph: bool, scan_rows: int) -> int | None:
    """How many unfiltered candidates a widened search takes to expect ``2 x wanted + 10`` matches, or None where
    reading the filter's rows costs less: they are estimated fewer than the candidates (times what one costs), or
    few enough for an exact scan of them, which costs less than a search of a flat index or IVF lists; or where it
    would take more than :data:`MAX_CANDIDATES`.

    :param fraction: the filter's estimated share of the stored rows (None: not known).
    :param wanted: the results a query needs (with a quantized store: the candidates it rescores).
    :param ntotal: the vectors the index holds.
    :param graph: the index is an HNSW graph (a widened search's cost grows with its candidates).
    :param scan_rows: up to how many matching rows a search scans them exactly.
    """
    if fraction is None or fraction <= 0:
        return None
    matching = fraction * ntotal
    candidates = math.ceil((2 * wanted + WIDENING_SURPLUS) / fraction)
    cost = HNSW_CANDIDATE_COST if graph else CANDIDATE_COST
    if candidates > MAX_CANDIDATES or candidates * cost >= matching or (not graph and matching <= scan_rows):
        return None
    return candidates


class Selection:
    """What a filter lets through, read from the docstore as a plan needs it: its estimated share, whether given
    rows match, or every matching row id.

    Usage example:
    ```python
    selection = Selection(node, fraction=0.5, read_rows=lambda: rows, keep=lambda ids: ids[ids % 2 == 0])
    selection.rows()
    ```

    :param node: the parsed filter.
    :param fraction: its estimated share of the stored rows (None: not estimated; it is never widened).
    :param read_rows: reads every matching row id (ascending); called once, on first need.
    :param keep: the given row ids that match (ascending).
    """

    def __init__(
        self,
        node: FilterNode | None,
        fraction: float | None,
        read_rows: Callable[[], np.ndarray],
        keep: Callable[[np.ndarray], np.ndarray],
    ) -> None:
        self.node = node
        self.fraction = fraction
        self.keep = keep
        self._read_rows = read_rows
        self._rows: np.ndarray | None = None

    @classmethod
    def of_rows(cls, rows: np.ndarray) -> Selection:
        """A selection whose rows are read already (never widened: its rows cost nothing more)."""
        return cls(None, None, lambda: rows, lambda ids: np.intersect1d(ids, rows))

    def rows(self) -> np.ndarray:
        """Every matching row id, ascending (read on the first call)."""
        if self._rows is None:
            self._rows = self._read_rows()
        return self._rows


def first_matches(ids: np.ndarray, keep: Callable[[np.ndarray], np.ndarray], wanted: int) -> list[np.ndarray | None]:
    """For each query's candidate row ids (best first, -1 past the last), the positions of its first ``wanted``
    candidates that match (``keep`` is asked once, for every query's candidates), or None where fewer match."""
    matching = set(keep(np.unique(ids[ids >= 0])).tolist())
    out: list[np.ndarray | None] = []
    for row in ids.tolist():
        positions = [j for j, r in enumerate(row) if r in matching][:wanted]
        out.append(np.asarray(positions, dtype=np.int64) if len(positions) == wanted else None)
    return out
