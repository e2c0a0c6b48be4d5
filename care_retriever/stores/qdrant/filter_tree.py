"""A filter tree (:mod:`care_retriever.stores.filters`) as a Qdrant Filter (must / should / must_not, match,
range, is_empty on ``metadata.PATH`` keys), built once for both Qdrant engines: Edge's binding and qdrant-client's
models name the same conditions differently, so each hands :func:`build` its :class:`QdrantTerms`. The filter
answers as :func:`care_retriever.stores.filter_matching.matches` does (and a FAISS store's SQL): a number as a point
range (Qdrant's exact match takes a stored 2.0 for no integer 2), a boolean matching booleans only.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Protocol

from care_retriever.stores.filters import Comparison, Constant, FilterNode

EXACT_FLOAT_INTEGERS = 2**53  # integers below this in magnitude are held by a float without rounding
NUMBER_LIMIT = 1.7e308  # every finite float: a range over all stored numbers
RANGE_KEYS = {">": "gt", ">=": "gte", "<": "lt", "<=": "lte"}


class QdrantTerms(Protocol):
    """The conditions of one Qdrant engine's filter objects."""

    def match(self, key: str, value: str | int | bool) -> Any: ...
    def match_any(self, key: str, values: list[str]) -> Any: ...
    def number_range(self, key: str, **bounds: float) -> Any: ...
    def date_range(self, key: str, **bounds: str) -> Any: ...
    def is_empty(self, key: str) -> Any: ...
    def nothing(self) -> Any: ...
    def filter(
        self, must: list[Any] | None = None, should: list[Any] | None = None, must_not: list[Any] | None = None
    ) -> Any: ...


def payload_key(path: tuple[str, ...]) -> str:
    """The payload key of a metadata field path (steps are letters, digits, ``_``, ``-``: no quoting needed)."""
    return "metadata." + ".".join(path)


def _equal(terms: QdrantTerms, key: str, value: Any) -> Any:
    if value is None:
        return terms.is_empty(key)
    if isinstance(value, (bool, str)):
        return terms.match(key, value)
    if isinstance(value, float) or abs(value) < EXACT_FLOAT_INTEGERS:
        return terms.number_range(key, gte=float(value), lte=float(value))
    return terms.match(key, value)


def _comparison(terms: QdrantTerms, node: Comparison) -> Any:
    key = payload_key(node.path)
    if node.operator == "==":
        return _equal(terms, key, node.value)
    if node.operator == "in":
        strings = [v for v in node.value if isinstance(v, str)]
        others = [_equal(terms, key, v) for v in node.value if not isinstance(v, str)]
        conditions = (
            [terms.match_any(key, strings)] if len(strings) > 1 else [_equal(terms, key, strings[0])] if strings else []
        ) + others
        return conditions[0] if len(conditions) == 1 else terms.filter(should=conditions)
    bound = RANGE_KEYS[node.operator]
    if isinstance(node.value, datetime):
        # Qdrant reads a stored number as a timestamp in a datetime range: numbers are ruled out, so that only
        # stored date strings compare (a list holding a number is not compared as dates, on every engine)
        text = node.value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
        numbers = terms.number_range(key, gte=-NUMBER_LIMIT, lte=NUMBER_LIMIT)
        return terms.filter(must=[terms.date_range(key, **{bound: text})], must_not=[numbers])
    return terms.number_range(key, **{bound: float(node.value)})


def _condition(terms: QdrantTerms, node: FilterNode) -> Any:
    if isinstance(node, Comparison):
        return _comparison(terms, node)
    assert not isinstance(node, Constant)  # folded away by parse_filters below the root
    children = [_condition(terms, c) for c in node.conditions]
    if node.operator == "AND":
        return terms.filter(must=children)
    if node.operator == "OR":
        return terms.filter(should=children)
    return terms.filter(must_not=[children[0] if len(children) == 1 else terms.filter(must=children)])


def build(terms: QdrantTerms, node: FilterNode | None) -> Any:
    """The engine's Filter for ``node`` (None: no filter)."""
    if node is None or node == Constant(True):
        return None
    if isinstance(node, Constant):
        return terms.filter(must=[terms.nothing()])
    condition = _condition(terms, node)
    return condition if _is_filter(condition) else terms.filter(must=[condition])


def _is_filter(condition: Any) -> bool:
    return type(condition).__name__ == "Filter"
