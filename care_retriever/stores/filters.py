"""The one metadata filter language of every store and door: Haystack's filter syntax, parsed into a typed tree.

A filter is a comparison, ``{"field": "meta.year", "operator": ">=", "value": 2020}``, or a logical node,
``{"operator": "AND" | "OR" | "NOT", "conditions": [...]}`` (NOT: not all of its conditions). Two short forms name
metadata keys directly: ``{"year": 2021}`` (equal) and ``{"dept": ["心内科", "内科"]}`` (any of), several keys
AND-ed. What the comparisons mean, the same on FAISS, Qdrant Edge, a Qdrant server and BM25:

* A field is ``meta.`` followed by a dotted path into nested objects (``meta.src.kind``); a short-form key is the
  path itself (``src.kind``). Each step is letters, digits, ``_`` or ``-``; a metadata key holding a dot is refused
  when a document is written (:func:`care_retriever.documents.metadata_json`), so a dot always means a nested step.
* Values are typed: ``str``, ``int`` (64-bit), ``float`` (finite), ``bool``, ``None``. A number equals any number of
  the same value (``2 == 2.0``); a boolean equals only a boolean (``True`` is not ``1``); a string only a string.
* A stored list matches where any of its elements does; a list of values (``in``) matches any of them.
* ``== None`` matches a field that is missing, null or an empty list; ``!= x`` and ``not in`` are the negations of
  ``==`` and ``in``, so they match documents without the field (as Haystack's FilterDocumentsTest asks).
* ``>``, ``>=``, ``<``, ``<=`` take a number (stored numbers compare numerically) or an ISO 8601 date string
  (``2021-03-01``, ``2021-03-01 08:00``, ``2021-03-01T08:00:00.000125``, a zone ``Z`` or ``+08:00`` after the
  seconds; stored strings of that form compare as instants to the microsecond, a date without a zone being UTC; a
  stored list holding a number is not compared as dates). Any other string, a list or a boolean is refused;
  ``None`` matches nothing. ``==`` compares strings as strings, dates included.

Every store reads its filters through :func:`parse_filters`, and the service's request schema checks them with it
too (:mod:`care_retriever.search.service_schema`), so a bad filter is the same one line from every door.

Example:
    ```python
    from care_retriever.stores.filters import parse_filters

    tree = parse_filters({"operator": "AND", "conditions": [
        {"field": "meta.year", "operator": ">=", "value": 2020},
        {"field": "meta.dept", "operator": "in", "value": ["心内科", "内科"]},
    ]})
    ```
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from care_retriever.errors import InputError

Filters = dict[str, Any]
Scalar = str | int | float | bool | None

COMPARISONS = ("==", "!=", ">", ">=", "<", "<=", "in", "not in")
LOGICAL = ("AND", "OR", "NOT")
ORDERINGS = (">", ">=", "<", "<=")
# One step of a field path: letters (any script), digits, "_", "-".
FIELD_STEP = re.compile(r"^[\w\-]+$")
# The ISO 8601 dates ordering comparisons take (and stored strings compare as): a date, an optional time to the
# minute, second or microsecond, a zone after the seconds; the spellings every engine reads as the same instant
# (Qdrant reads no zone after a bare date or minutes).
ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?(Z|[+-]\d{2}:\d{2})?)?)?", re.ASCII)
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICROSECOND = timedelta(microseconds=1)
MAX_DEPTH = 32  # nesting of logical nodes: deeper is refused rather than recursed into


@dataclass(frozen=True)
class Comparison:
    """``path`` (metadata keys, outermost first) compared with ``value`` by ``operator``.

    After :func:`parse_filters` the operator is one of ``==``, ``in``, ``>``, ``>=``, ``<``, ``<=`` (``!=`` and
    ``not in`` become a :class:`Logic` NOT); ``in`` holds a tuple of values, an ordering a number or a
    :class:`datetime` (aware, UTC for a string without a zone).

    :param path: the metadata keys, outermost first.
    :param operator: the comparison.
    :param value: the typed value (a tuple for ``in``).
    """

    path: tuple[str, ...]
    operator: str
    value: Any


@dataclass(frozen=True)
class Logic:
    """``AND`` (all), ``OR`` (any) or ``NOT`` (not all) of ``conditions``.

    :param operator: ``AND``, ``OR`` or ``NOT``.
    :param conditions: the child nodes (at least one).
    """

    operator: str
    conditions: tuple[FilterNode, ...]


@dataclass(frozen=True)
class Constant:
    """A filter whose answer does not depend on the document (an ordering against ``None``: nothing matches).

    :param matches: whether every document matches (True) or none (False).
    """

    matches: bool


FilterNode = Comparison | Logic | Constant


def is_filter_field(name: object) -> bool:
    """Whether ``name`` is one step of a filter path (letters, digits, ``_``, ``-``): the metadata keys a store
    indexes for filtering; others are kept, and not filterable."""
    return isinstance(name, str) and FIELD_STEP.match(name) is not None


def parse_date(value: str) -> datetime | None:
    """``value`` as a datetime in UTC (a string naming no zone being UTC) when it is an ISO 8601 date of the form
    filters compare and its instant falls within years 1 to 9999, else None."""
    if not ISO_DATE.fullmatch(value):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        return parsed.astimezone(timezone.utc) if parsed.tzinfo is not None else parsed.replace(tzinfo=timezone.utc)
    except (ValueError, OverflowError):  # no such date, or an instant before year 1 or after 9999 in UTC
        return None


def instant(date: datetime) -> int:
    """The microseconds from 1970-01-01 UTC to ``date`` (aware): the number every engine orders dates by, exact
    (no float)."""
    return (date - _EPOCH) // _MICROSECOND


def date_instant(value: object) -> int | None:
    """:func:`instant` of ``value`` where it is a date filters compare (:func:`parse_date`), else None: how a FAISS
    store's docstore reads a stored string (an SQL function of its connections)."""
    date = parse_date(value) if isinstance(value, str) else None
    return None if date is None else instant(date)


def _path(field: object, *, short: bool) -> tuple[str, ...]:
    if not isinstance(field, str):
        raise InputError(f"filter field must be a string, got {field!r}")
    name = field if short else field.removeprefix("meta.")
    if not short and not field.startswith("meta."):
        raise InputError(f"invalid filter field {field!r}: name a metadata field as 'meta.NAME' (or 'meta.a.b')")
    steps = tuple(name.split("."))
    if not all(is_filter_field(step) for step in steps):
        raise InputError(
            f"invalid filter field {field!r}: each dotted step needs letters, digits, '_' or '-' (a dot steps into "
            "a nested object)"
        )
    return steps


def _scalar(field: str, value: object) -> Scalar:
    if isinstance(value, str):
        try:
            value.encode("utf-8")  # what every engine's query holds: a lone surrogate is no text it can match
        except UnicodeEncodeError as exc:
            raise InputError(
                f"filter {field!r}: the value is not valid Unicode (lone surrogate at character {exc.start})"
            ) from None
        return value
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if not -(2**63) <= value < 2**63:  # SQLite's and Qdrant's integers
            raise InputError(f"filter {field!r}: integers must be within 64 bits (-2**63 to 2**63 - 1)")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InputError(f"filter {field!r}: values must be finite numbers")
        return value
    raise InputError(f"filter {field!r}: values must be str, int, float, bool or null, got {type(value).__name__}")


def _comparison(field: object, operator: object, value: object, *, short: bool = False) -> FilterNode:
    path = _path(field, short=short)
    name = str(field)
    if operator not in COMPARISONS:
        raise InputError(f"filter {name!r}: unknown operator {operator!r}; use one of {', '.join(COMPARISONS)}")
    if operator in ("in", "not in"):
        if not isinstance(value, list) or not value:
            raise InputError(f"filter {name!r}: {operator!r} takes a non-empty list of values")
        values = tuple(dict.fromkeys((type(v), _scalar(name, v)) for v in value))
        node: FilterNode = Comparison(path, "in", tuple(v for _, v in values))
        return Logic("NOT", (node,)) if operator == "not in" else node
    if isinstance(value, list):
        raise InputError(f"filter {name!r}: {operator!r} takes one value, not a list (use 'in' for any of)")
    scalar = _scalar(name, value)
    if operator in ORDERINGS:
        if scalar is None:
            return Constant(False)
        if isinstance(scalar, bool):
            raise InputError(f"filter {name!r}: {operator!r} compares numbers or ISO dates, not booleans")
        if isinstance(scalar, str):
            date = parse_date(scalar)
            if date is None:
                raise InputError(
                    f"filter {name!r}: {operator!r} compares numbers or ISO 8601 dates (2021-03-01, "
                    f"2021-03-01T08:00:00+08:00), got the string {scalar!r}"
                    + (" (no such instant within years 1 to 9999 in UTC)" if ISO_DATE.fullmatch(scalar) else "")
                )
            return Comparison(path, str(operator), date)
        return Comparison(path, str(operator), scalar)
    node = Comparison(path, "==", scalar)
    return Logic("NOT", (node,)) if operator == "!=" else node


def _node(filters: object, depth: int) -> FilterNode:
    if depth > MAX_DEPTH:
        raise InputError(f"filters nest deeper than {MAX_DEPTH} levels")
    if not isinstance(filters, dict):
        raise InputError(f"a filter condition must be an object, got {filters!r}")
    if "field" in filters:
        for key in ("operator", "value"):
            if key not in filters:
                raise InputError(f"filter condition {filters!r} has no {key!r}")
        if extra := set(filters) - {"field", "operator", "value"}:
            raise InputError(f"filter condition {filters!r}: unknown keys {sorted(extra)}")
        return _comparison(filters["field"], filters["operator"], filters["value"])
    if "operator" not in filters or "conditions" not in filters:
        missing = "operator" if "operator" not in filters else "conditions"
        raise InputError(f"logical filter {filters!r} has no {missing!r}")
    operator, conditions = filters["operator"], filters["conditions"]
    if operator not in LOGICAL:
        raise InputError(f"unknown logical operator {operator!r}; use one of {', '.join(LOGICAL)}")
    if not isinstance(conditions, list) or not conditions:
        raise InputError(f"{operator} needs a non-empty list of conditions")
    return Logic(operator, tuple(_node(c, depth + 1) for c in conditions))


def _short_form(filters: dict[str, Any]) -> FilterNode:
    nodes = [
        _comparison(key, "in" if isinstance(value, list) else "==", value, short=True) for key, value in filters.items()
    ]
    return nodes[0] if len(nodes) == 1 else Logic("AND", tuple(nodes))


def simplify(node: FilterNode) -> FilterNode:
    """``node`` with its constants folded: the result is a :class:`Constant` or holds none."""
    if not isinstance(node, Logic):
        return node
    children = [simplify(c) for c in node.conditions]
    constants = {c.matches for c in children if isinstance(c, Constant)}
    rest = tuple(c for c in children if not isinstance(c, Constant))
    if node.operator == "OR":
        if True in constants:
            return Constant(True)
        return Logic("OR", rest) if rest else Constant(False)
    if False in constants:  # AND is false; NOT (not all) is true
        return Constant(node.operator == "NOT")
    if not rest:
        return Constant(node.operator == "AND")
    return Logic(node.operator, rest)


def parse_filters(filters: object) -> FilterNode | None:
    """The typed tree of ``filters`` (Haystack syntax or a short form), constants folded; None for no filter.

    Example:
        ```python
        parse_filters({"year": 2021})  # Comparison(path=("year",), operator="==", value=2021)
        ```

    :param filters: a Haystack-style filter, a short form ``{"key": value | [values]}``, or None / ``{}``.
    :raises InputError: one line naming the invalid field, operator or value.
    """
    if filters is None or filters == {}:
        return None
    if not isinstance(filters, dict):
        raise InputError(
            "filters must be a dict of metadata field -> value(s), or a Haystack filter (field, operator, value; or "
            f"operator, conditions), got {filters!r}"
        )
    is_haystack = _is_haystack(filters)
    if not is_haystack and ({"operator", "conditions"} & set(filters)):
        _node(filters, 0)  # a logical node missing a key: its one-line error
    node = _node(filters, 0) if is_haystack else _short_form(filters)
    return simplify(node)


def _is_haystack(filters: dict[str, Any]) -> bool:
    return "field" in filters or ("operator" in filters and "conditions" in filters)


def haystack_form(filters: Filters) -> Filters:
    """``filters`` in Haystack's syntax, so that a door can nest them in a logical node: a short form as its
    comparisons on ``meta.KEY`` (AND-ed), a Haystack filter unchanged.

    Example:
        ```python
        haystack_form({"year": 2021})  # {"field": "meta.year", "operator": "==", "value": 2021}
        ```

    :param filters: filters :func:`parse_filters` reads (not None or empty).
    """
    if _is_haystack(filters):
        return filters
    conditions: list[Filters] = [
        {"field": f"meta.{key}", "operator": "in" if isinstance(value, list) else "==", "value": value}
        for key, value in filters.items()
    ]
    return conditions[0] if len(conditions) == 1 else {"operator": "AND", "conditions": conditions}


def validate_filters(filters: Filters | None) -> Filters | None:
    """``filters`` unchanged when :func:`parse_filters` reads them (None for no filter), else one line.

    :param filters: the filters a door received.
    :raises InputError: one line naming the invalid field, operator or value.
    """
    return None if parse_filters(filters) is None else filters
