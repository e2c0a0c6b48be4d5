"""Haystack filters over the core stores (FAISS, and Qdrant through :class:`CareStoreRetriever`).

Haystack's filter language (comparisons, AND/OR/NOT) is evaluated exactly by
``haystack.utils.filters.document_matches_filter`` on candidate documents. The core store only
pre-filters by metadata equality; :func:`to_core_filters` translates the subset that maps onto it
exactly (``==`` / ``in`` on top-level ``meta`` fields with plain values, joined by AND) so such
searches run inside FAISS; everything else is post-filtered. Either way results are re-checked
with Haystack's evaluator, so both paths return what ``InMemoryDocumentStore`` would.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime
from typing import Any

from haystack import Document
from haystack.errors import FilterError
from haystack.utils.filters import document_matches_filter

LOGICAL = ("AND", "OR", "NOT")
COMPARISON = ("==", "!=", ">", ">=", "<", "<=", "in", "not in")
# Fields that are columns of the core store, not keys of its metadata JSON.
_NOT_METADATA = {"title"}
_CORE_KEY = re.compile(r"^[\w\-]+$")


def validate_filters(filters: dict[str, Any] | None) -> None:
    """Raise FilterError for malformed filters even when no document exists to evaluate them on."""
    if not filters:
        return
    if not isinstance(filters, dict):
        raise FilterError(f"filters must be a dict, got {type(filters).__name__}")
    if "field" in filters:
        for key in ("operator", "value"):
            if key not in filters:
                raise FilterError(f"'{key}' key missing in {filters}")
        if filters["operator"] not in COMPARISON:
            raise FilterError(
                f"Unknown comparison operator '{filters['operator']}'. Valid operators are: {sorted(COMPARISON)}"
            )
        return
    for key in ("operator", "conditions"):
        if key not in filters:
            raise FilterError(f"'{key}' key missing in {filters}")
    if filters["operator"] not in LOGICAL:
        raise FilterError(f"Unknown logical operator '{filters['operator']}'. Valid operators are: {sorted(LOGICAL)}")
    if not isinstance(filters["conditions"], list):
        raise FilterError(f"'conditions' must be a list in {filters}")
    for condition in filters["conditions"]:
        validate_filters(condition)


def _looks_like_date(value: str) -> bool:
    try:
        datetime.fromisoformat(value)
    except ValueError:
        return False
    return True


def _plain(value: Any) -> bool:
    """Values the core store's filters can pre-select for Haystack's ``==`` (no dates, no None)."""
    if isinstance(value, str):
        return not _looks_like_date(value)
    return isinstance(value, (bool, int, float))


def _python_equals(values: list[Any]) -> list[Any]:
    """``values`` and what Python's ``==`` also finds equal to them that the core stores tell apart: they match
    filters as Qdrant does, where a boolean is not the integer 1, while Haystack's evaluator has ``True == 1 == 1.0``.
    The core filter is a pre-selection that the evaluator re-checks, so it may hold more, never less."""
    found = list(values)
    for v in values:
        if isinstance(v, bool) or (isinstance(v, (int, float)) and v in (0, 1)):
            found += [bool(v), int(v)]
    return list({(type(v), v): v for v in found}.values())  # each value once, 1 and True kept apart


def to_core_filters(filters: dict[str, Any] | None) -> dict[str, Any] | None:
    """The equivalent core metadata filter, or None when the filter needs Haystack's evaluator."""
    if not filters:
        return None
    conditions = filters.get("conditions") if filters.get("operator") == "AND" else [filters]
    if not isinstance(conditions, list) or not conditions:
        return None
    core: dict[str, Any] = {}
    for cond in conditions:
        field, op, value = cond.get("field"), cond.get("operator"), cond.get("value")
        if not isinstance(field, str) or not field.startswith("meta."):
            return None
        key = field[len("meta.") :]
        if not _CORE_KEY.match(key) or key in _NOT_METADATA or key in core:
            return None
        if op == "==" and _plain(value):
            core[key] = _python_equals([value])
        elif op == "in" and isinstance(value, list) and value and all(_plain(v) for v in value):
            core[key] = _python_equals(list(value))
        else:
            return None
    return core


def filtered_top_k(
    search: Callable[[int, dict[str, Any] | None], tuple[int, list[Document]]],
    filters: dict[str, Any] | None,
    top_k: int,
    count: Callable[[], int],
    core_filters: dict[str, Any] | None,
) -> list[Document]:
    """The ``top_k`` best documents of a store search that match Haystack ``filters``.

    ``search(k, core_filters)`` returns how many hits the store gave for ``k`` and those hits as
    Haystack documents (adapters drop their bookkeeping hits there). ``core_filters`` is the store's
    pre-filter (:func:`to_core_filters` or a stricter subset of it); every candidate is still checked
    with Haystack's evaluator, and the candidate list widens (x4) until ``top_k`` documents match or
    the store is exhausted. ``count`` (the store's size) is only called when widening.
    """
    validate_filters(filters)
    k = top_k
    while True:
        returned, docs = search(k, core_filters)
        if filters:
            docs = [d for d in docs if document_matches_filter(filters, d)]
        # Fewer hits than asked for: the store (or its pre-filter) is exhausted.
        if len(docs) >= top_k or returned < k:
            break
        total = count()
        if k >= total:
            break
        k = min(total, k * 4)
    return docs[:top_k]
