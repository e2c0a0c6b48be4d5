"""A filter tree (:mod:`care_retriever.stores.filters`) as one SQL condition over the docstore's ``metadata`` JSON,
answering as :func:`care_retriever.stores.filter_matching.matches` does (and as Qdrant does for the same documents):
SQLite's JSON functions read each path; every sub-condition is 0 or 1, never NULL, so NOT negates exactly.

Example:
    ```python
    sql, args = condition(parse_filters({"year": 2021}))
    db.execute(f"SELECT row_id FROM documents WHERE {sql}", args)
    ```
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import datetime

from care_retriever.stores.filters import Comparison, Constant, FilterNode, date_instant, instant

META = "documents.metadata"
DATE_PREFIX = "[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]*"  # what a stored date starts with: read no further
# A stored string's instant in microseconds (NULL where it is no date filters compare): the filter language's own
# reading of a date, so a FAISS store orders the same spellings, to the same microsecond, as the reference does.
INSTANT = "care_instant"


def add_functions(db: sqlite3.Connection) -> None:
    """Give a docstore connection the SQL functions filter conditions call (:data:`INSTANT`)."""
    db.create_function(INSTANT, 1, date_instant, deterministic=True)


def json_path(path: tuple[str, ...]) -> str:
    """The SQLite JSON path of a metadata field path (each step quoted: steps hold no quote, by the language)."""
    return "$" + "".join(f'."{step}"' for step in path)


def _marks(values: Sequence[object]) -> str:
    return ",".join("?" * len(values))


def _equals(path: str, values: list[object]) -> tuple[str, list[object]]:
    """The field equals one of ``values`` (a stored list: one of its elements does): a boolean only a boolean
    (SQLite's JSON reads ``true`` as 1), a number any number of equal value, a string the same string. Scalars
    are read by ``json_extract``, dispatched on their JSON type; only stored lists are walked."""
    strings = [v for v in values if isinstance(v, str)]
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    flags = ["true" if v else "false" for v in sorted({v for v in values if isinstance(v, bool)})]
    element = [f"e.type = '{flag}'" for flag in flags]
    if strings:
        element.append(f"(e.type = 'text' AND e.value IN ({_marks(strings)}))")
    if numbers:
        element.append(f"(e.type IN ('integer', 'real') AND e.value IN ({_marks(numbers)}))")
    sql = (
        f"CASE json_type({META}, ?) WHEN 'array' THEN EXISTS (SELECT 1 FROM "
        f"json_each({META}, ?) AS e WHERE {' OR '.join(element)}) "
    )
    args: list[object] = [path, path, *strings, *numbers]
    if strings:
        sql += f"WHEN 'text' THEN json_extract({META}, ?) IN ({_marks(strings)}) "
        args += [path, *strings]
    for kind in ("integer", "real") if numbers else ():
        sql += f"WHEN '{kind}' THEN json_extract({META}, ?) IN ({_marks(numbers)}) "
        args += [path, *numbers]
    sql += "".join(f"WHEN '{flag}' THEN 1 " for flag in flags)
    return sql + "ELSE 0 END", args


def _empty(path: str) -> tuple[str, list[object]]:
    """The field is missing, null or an empty list."""
    sql = (
        f"CASE COALESCE(json_type({META}, ?), 'null') WHEN 'null' THEN 1 "
        f"WHEN 'array' THEN json_array_length({META}, ?) = 0 ELSE 0 END"
    )
    return sql, [path, path]


def _ordered(path: str, operator: str, bound: object) -> tuple[str, list[object]]:
    """The field (or one of its list's elements) compares with ``bound``: numbers numerically, ISO dates as UTC
    instants (a stored string that is no date never matches, nor a list holding a number: Qdrant's rule)."""
    if isinstance(bound, datetime):
        utc = instant(bound)
        test = f"COALESCE({INSTANT}({{x}}) {operator} ?, 0)"
        scalar = f"(json_extract({META}, ?) GLOB '{DATE_PREFIX}' AND {test.format(x=f'json_extract({META}, ?)')})"
        element = f"(e.type = 'text' AND e.value GLOB '{DATE_PREFIX}' AND {test.format(x='e.value')})"
        sql = (
            f"CASE json_type({META}, ?) WHEN 'array' THEN EXISTS (SELECT 1 FROM json_each({META}, ?) AS e "
            f"WHERE {element}) AND NOT EXISTS (SELECT 1 FROM json_each({META}, ?) AS e "
            f"WHERE e.type IN ('integer', 'real')) WHEN 'text' THEN {scalar} ELSE 0 END"
        )
        return sql, [path, path, utc, path, path, path, utc]
    sql = (
        f"CASE json_type({META}, ?) WHEN 'array' THEN EXISTS (SELECT 1 FROM json_each({META}, ?) AS e "
        f"WHERE e.type IN ('integer', 'real') AND e.value {operator} ?) "
        f"WHEN 'integer' THEN json_extract({META}, ?) {operator} ? "
        f"WHEN 'real' THEN json_extract({META}, ?) {operator} ? ELSE 0 END"
    )
    return sql, [path, path, bound, path, bound, path, bound]


def _comparison(node: Comparison) -> tuple[str, list[object]]:
    path = json_path(node.path)
    if node.operator in (">", ">=", "<", "<="):
        return _ordered(path, node.operator, node.value)
    values = list(node.value) if node.operator == "in" else [node.value]
    present = [v for v in values if v is not None]
    parts = [_equals(path, present)] if present else []
    if len(present) < len(values):
        parts.append(_empty(path))
    return " OR ".join(f"({sql})" for sql, _ in parts), [a for _, args in parts for a in args]


def condition(node: FilterNode) -> tuple[str, list[object]]:
    """The SQL condition on a ``documents`` row, and its arguments in order, that ``node`` matches."""
    if isinstance(node, Constant):
        return ("1" if node.matches else "0"), []
    if isinstance(node, Comparison):
        return _comparison(node)
    parts = [condition(c) for c in node.conditions]
    args = [a for _, a_ in parts for a in a_]
    if node.operator == "OR":
        return " OR ".join(f"({sql})" for sql, _ in parts), args
    joined = " AND ".join(f"({sql})" for sql, _ in parts)
    return (f"NOT ({joined})" if node.operator == "NOT" else joined), args
