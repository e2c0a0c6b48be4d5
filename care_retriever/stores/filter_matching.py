"""The reference meaning of a filter tree (:mod:`care_retriever.stores.filters`) on one document's metadata, in
Python: what every engine's translation (SQL for FAISS, Qdrant's Filter) must answer, and what a door that lists
documents rather than searching them (the Haystack document store's ``filter_documents``) evaluates.

Example:
    ```python
    from care_retriever.stores.filter_matching import matches
    from care_retriever.stores.filters import parse_filters

    matches(parse_filters({"year": 2021}), {"year": 2021.0})  # True: 2021 == 2021.0
    ```
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from care_retriever.stores.filters import Comparison, Constant, FilterNode, parse_date

_MISSING = object()


def _lookup(metadata: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = metadata
    for step in path:
        if not isinstance(value, Mapping) or step not in value:
            return _MISSING
        value = value[step]
    return value


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _equals(stored: object, wanted: object) -> bool:
    if isinstance(wanted, bool):
        return isinstance(stored, bool) and stored == wanted
    if _is_number(wanted):
        return _is_number(stored) and stored == wanted
    return isinstance(stored, str) and stored == wanted


def _ordered(stored: object, operator: str, bound: int | float | datetime) -> bool:
    if isinstance(bound, datetime):
        if not isinstance(stored, str) or (date := parse_date(stored)) is None:
            return False
        left: Any = date
    elif _is_number(stored):
        left = stored
    else:
        return False
    if operator == ">":
        return bool(left > bound)
    if operator == ">=":
        return bool(left >= bound)
    if operator == "<":
        return bool(left < bound)
    return bool(left <= bound)


def _compare(node: Comparison, metadata: Mapping[str, Any]) -> bool:
    stored = _lookup(metadata, node.path)
    if node.operator == "==" and node.value is None:
        return stored is _MISSING or stored is None or stored == []
    if node.operator == "in" and None in node.value and _compare(Comparison(node.path, "==", None), metadata):
        return True
    elements = stored if isinstance(stored, list) else [stored]
    if isinstance(node.value, datetime) and any(_is_number(e) for e in elements):
        return False  # a list holding a number is not compared as dates (Qdrant reads numbers as timestamps)
    if node.operator == "==":
        return any(_equals(e, node.value) for e in elements)
    if node.operator == "in":
        return any(_equals(e, v) for e in elements for v in node.value if v is not None)
    return any(_ordered(e, node.operator, node.value) for e in elements)


def matches(node: FilterNode | None, metadata: Mapping[str, Any]) -> bool:
    """Whether a document with ``metadata`` matches the filter tree ``node`` (None: no filter, every document).

    :param node: a tree from :func:`~care_retriever.stores.filters.parse_filters`.
    :param metadata: the document's metadata.
    """
    if node is None:
        return True
    if isinstance(node, Constant):
        return node.matches
    if isinstance(node, Comparison):
        return _compare(node, metadata)
    results = (matches(c, metadata) for c in node.conditions)
    if node.operator == "AND":
        return all(results)
    if node.operator == "OR":
        return any(results)
    return not all(results)
