"""Haystack filters over the core stores: Haystack's filter syntax is the core's own filter language
(:mod:`care_retriever.stores.filters`), so a filter passes through unchanged and runs inside the store (SQL in a
FAISS docstore, a native Filter on Qdrant), with no candidate re-checking; a bad filter is Haystack's
``FilterError`` in one line.
"""

from __future__ import annotations

from typing import Any

from haystack.errors import FilterError

from care_retriever.errors import InputError
from care_retriever.stores.filters import Comparison, FilterNode, Logic, haystack_form, parse_filters


def parse_haystack_filters(filters: dict[str, Any] | None) -> FilterNode | None:
    """The core filter tree of Haystack ``filters`` (None: no filter), or ``FilterError`` in one line."""
    try:
        return parse_filters(filters)
    except InputError as exc:
        raise FilterError(str(exc)) from None


def validate_filters(filters: dict[str, Any] | None) -> None:
    """Raise ``FilterError`` for malformed filters even when no document exists to evaluate them on."""
    parse_haystack_filters(filters)


def _names_title(node: FilterNode | None) -> bool:
    if isinstance(node, Comparison):
        return node.path[0] == "title"
    return isinstance(node, Logic) and any(_names_title(c) for c in node.conditions)


def core_filters(filters: dict[str, Any] | None, hidden: str | None = None) -> dict[str, Any] | None:
    """``filters`` as the store takes them, AND-ed with "not the bookkeeping flag ``hidden``" when given (documents
    an adapter stored without an embedding are never search hits). ``meta.title`` is the stores' title column,
    not metadata: a search filter naming it is refused in one line rather than matching nothing."""
    if _names_title(parse_haystack_filters(filters)):
        raise FilterError(
            "meta.title is the document's title column, which a search filter cannot name (filter_documents can): "
            "filter on a metadata field"
        )
    if hidden is None:
        return filters or None
    visible = {"field": f"meta.{hidden}", "operator": "!=", "value": True}
    return {"operator": "AND", "conditions": [haystack_form(filters), visible]} if filters else visible
