"""The metadata filters of a Qdrant Edge search, in the engine's terms: part of the adapter (:mod:`edge`), which
hands it the engine module, kept in a file of its own. The tree is built by :mod:`.filter_tree`, shared with a
server's filter, so a filter gives the answer a FAISS store's gives for the same documents.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from care_retriever.stores.filters import FilterNode
from care_retriever.stores.qdrant import filter_tree


class EdgeTerms:
    """:class:`~.filter_tree.QdrantTerms` of Edge's binding (the engine module ``qe``)."""

    def __init__(self, qe: Any) -> None:
        self.qe = qe

    def match(self, key: str, value: str | int | bool) -> Any:
        if isinstance(value, bool):  # the binding reads a Python bool as an int (no stored bool matches); numpy's not
            return self.qe.FieldCondition(key, match=self.qe.MatchValue(np.bool_(value)))
        return self.qe.FieldCondition(key, match=self.qe.MatchValue(value))

    def match_any(self, key: str, values: list[str]) -> Any:
        return self.qe.FieldCondition(key, match=self.qe.MatchAny(values))

    def number_range(self, key: str, **bounds: float) -> Any:
        return self.qe.FieldCondition(key, range=self.qe.RangeFloat(**bounds))

    def date_range(self, key: str, **bounds: str) -> Any:
        return self.qe.FieldCondition(key, range=self.qe.RangeDateTime(**bounds))

    def is_empty(self, key: str) -> Any:
        return self.qe.IsEmptyCondition(key)

    def nothing(self) -> Any:
        return self.qe.HasIdCondition(set())

    def filter(
        self, must: list[Any] | None = None, should: list[Any] | None = None, must_not: list[Any] | None = None
    ) -> Any:
        return self.qe.Filter(must=must, should=should, must_not=must_not)


def build_filter(qe: Any, node: FilterNode | None) -> Any:
    """An Edge filter (of the engine module ``qe``) for the filter tree ``node`` (None: no filter)."""
    return filter_tree.build(EdgeTerms(qe), node)
