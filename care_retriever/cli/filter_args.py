"""The ``--filter`` / ``--filter-json`` grammar of the command line, read into one filter of the core language
(:mod:`care_retriever.stores.filters`).

``--filter FIELD OP VALUE``: FIELD a metadata key or dotted path (``src.kind``), OP one of ``=`` (or ``==``), ``!=``,
``>``, ``>=``, ``<``, ``<=``. An unquoted VALUE is typed: ``3`` an integer, ``2.5`` a float, ``true`` / ``false`` a
boolean, ``null`` nothing, anything else a string; quotes (``'3'``, ``"a,b"``) make it a string. Commas outside quotes
list values: ``dept=心内科,内科`` is any of them, ``dept!=A,B`` none of them. ``--filter-json`` takes a whole filter
as JSON (Haystack syntax or ``{"key": value}``), or ``@file.json``. Every flag given is AND-ed.

Example:
    ```python
    cli_filters(["year>=2020", "dept=心内科"], None)
    # {"operator": "AND", "conditions": [{"field": "meta.year", "operator": ">=", "value": 2020}, ...]}
    ```
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from care_retriever.errors import InputError
from care_retriever.stores.filters import haystack_form, parse_filters

ITEM = re.compile(r"^\s*([^=!<>\s]+)\s*(==|=|!=|>=|<=|>|<)\s*(.*?)\s*$", re.S)
INTEGER = re.compile(r"^[+-]?\d+$")
FLOAT = re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+(\.\d*)?[eE][+-]?\d+)$")
WORDS: dict[str, Any] = {"true": True, "false": False, "null": None}


def _split(text: str, item: str) -> list[tuple[str, bool]]:
    """``text`` cut at commas outside quotes: each piece and whether it was quoted."""
    pieces: list[tuple[str, bool]] = []
    rest = text
    while True:
        rest = rest.strip()
        if rest[:1] in ("'", '"'):
            end = rest.find(rest[0], 1)
            if end < 0:
                raise InputError(f"--filter {item!r}: a quote is not closed")
            pieces.append((rest[1:end], True))
            rest = rest[end + 1 :].strip()
            if rest and not rest.startswith(","):
                raise InputError(f"--filter {item!r}: expected ',' after a quoted value")
        else:
            value, _, rest = rest.partition(",")
            pieces.append((value.strip(), False))
            rest = "," + rest if _ else ""
        if not rest:
            return pieces
        rest = rest[1:]


def _typed(text: str, quoted: bool) -> Any:
    if quoted:
        return text
    if text in WORDS:
        return WORDS[text]
    if INTEGER.match(text):
        return int(text)
    if FLOAT.match(text) and math.isfinite(float(text)):
        return float(text)
    return text


def parse_filter_item(item: str) -> dict[str, Any]:
    """One ``--filter`` value as a Haystack comparison, or one line saying what is wrong with it."""
    found = ITEM.match(item)
    if not found:
        raise InputError(
            f"--filter {item!r}: expected FIELD OP VALUE with OP one of =, !=, >, >=, <, <= (e.g. year>=2020, "
            "dept=心内科, dept=A,B for any of)"
        )
    field, operator, text = found.groups()
    if text[:1] in ("=", "<", ">", "!"):  # year=>2020, year<>1: an operator mistyped, not a value
        raise InputError(
            f"--filter {item!r}: the value starts with {text[0]!r}; OP is one of =, !=, >, >=, <, <= (quote a value "
            f"that starts with it: {field}{operator}'{text}')"
        )
    values = [_typed(value, quoted) for value, quoted in _split(text, item)]
    operator = "==" if operator == "=" else operator
    if len(values) > 1:
        if operator not in ("==", "!="):
            raise InputError(f"--filter {item!r}: {operator} takes one value; a list (A,B) goes with = or !=")
        return {"field": f"meta.{field}", "operator": "in" if operator == "==" else "not in", "value": values}
    return {"field": f"meta.{field}", "operator": operator, "value": values[0]}


def _json_filter(text: str) -> Any:
    where = "--filter-json"
    if text.startswith("@"):
        path = Path(text[1:])
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"--filter-json {path}: cannot read the file ({exc})") from None
        where = f"--filter-json {path}"

    def refuse(token: str) -> None:
        raise InputError(f"{where}: JSON has no {token}")

    try:
        return json.loads(text, parse_constant=refuse)
    except json.JSONDecodeError as exc:
        raise InputError(f"{where}: not JSON ({exc})") from None


def _conditions(filters: dict[str, Any]) -> list[dict[str, Any]]:
    """A filter as conditions to AND (a short form one comparison per key, an AND its conditions)."""
    form = haystack_form(filters)
    return list(form["conditions"]) if form.get("operator") == "AND" else [form]


def _refuse_contradictions(conditions: list[dict[str, Any]]) -> None:
    equal: dict[str, Any] = {}
    for c in conditions:
        if c.get("operator") != "==" or isinstance(c.get("value"), list):
            continue
        field, value = str(c.get("field")), c.get("value")
        if field in equal and (type(equal[field]), equal[field]) != (type(value), value):
            name = str(field).removeprefix("meta.")
            raise InputError(
                f"--filter {name}={equal[field]!r} and {name}={value!r}: a field cannot equal both "
                f"(for either, give one flag: {name}=A,B)"
            )
        equal[field] = value


def cli_filters(items: list[str] | None, json_text: str | None) -> dict[str, Any] | None:
    """The filter of the ``--filter`` flags and ``--filter-json``, AND-ed, checked by the core's parser (None:
    no filter).

    :param items: each ``--filter`` value.
    :param json_text: ``--filter-json``'s value (JSON, or ``@file.json``).
    :raises InputError: one line for a malformed item, JSON that is no filter, or two equalities on one field.
    """
    conditions = [parse_filter_item(item) for item in items or []]
    if json_text is not None:
        whole = _json_filter(json_text)
        parse_filters(whole)  # its own one-line error before it is combined
        if whole:
            conditions += _conditions(whole)
    if not conditions:
        return None
    _refuse_contradictions(conditions)
    filters = conditions[0] if len(conditions) == 1 else {"operator": "AND", "conditions": conditions}
    parse_filters(filters)
    return filters
