"""The core filter language: Haystack syntax and the short forms parse to one typed tree; an invalid field, operator
or value is one line; a metadata key holding a dot is refused at write time."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from care_retriever.documents import metadata_json
from care_retriever.errors import InputError
from care_retriever.stores.filters import Comparison, Constant, Logic, parse_filters


def test_short_forms_and_haystack_syntax_parse_to_the_same_tree() -> None:
    short = parse_filters({"year": 2021, "dept": ["心内科", "内科"]})
    haystack = parse_filters(
        {
            "operator": "AND",
            "conditions": [
                {"field": "meta.year", "operator": "==", "value": 2021},
                {"field": "meta.dept", "operator": "in", "value": ["心内科", "内科"]},
            ],
        }
    )
    assert (
        short
        == haystack
        == Logic("AND", (Comparison(("year",), "==", 2021), Comparison(("dept",), "in", ("心内科", "内科"))))
    )


def test_negations_dates_and_none_become_typed_nodes() -> None:
    assert parse_filters({"field": "meta.a.b", "operator": "!=", "value": 1}) == Logic(
        "NOT", (Comparison(("a", "b"), "==", 1),)
    )
    assert parse_filters({"field": "meta.d", "operator": ">", "value": "2021-03-01T08:00:00+08:00"}) == Comparison(
        ("d",), ">", datetime(2021, 3, 1, tzinfo=timezone.utc)
    )
    assert parse_filters({"field": "meta.d", "operator": "<", "value": None}) == Constant(False)
    never = {"field": "meta.d", "operator": "<", "value": None}
    assert parse_filters({"operator": "NOT", "conditions": [never]}) == Constant(True)
    assert parse_filters({}) is None and parse_filters(None) is None
    assert parse_filters({"flag": [True, 1]}) == Comparison(("flag",), "in", (True, 1))  # True and 1 kept apart


@pytest.mark.parametrize(
    ("filters", "message"),
    [
        ({"a.": 1}, "invalid filter field 'a.'"),
        ({"..": 1}, "invalid filter field '..'"),
        ({"field": "year", "operator": "==", "value": 1}, "invalid filter field 'year': name a metadata field"),
        ({"field": "meta.y", "operator": "~", "value": 1}, "filter 'meta.y': unknown operator '~'"),
        ({"field": "meta.y", "operator": "in", "value": 1}, "filter 'meta.y': 'in' takes a non-empty list"),
        ({"field": "meta.y", "operator": ">", "value": [1]}, "filter 'meta.y': '>' takes one value"),
        ({"field": "meta.y", "operator": ">", "value": "1"}, "filter 'meta.y': '>' compares numbers or ISO 8601"),
        ({"field": "meta.y", "operator": ">", "value": True}, "filter 'meta.y': '>' compares numbers or ISO dates"),
        ({"field": "meta.y", "operator": "=="}, "filter condition"),
        ({"operator": "AND"}, "logical filter {'operator': 'AND'} has no 'conditions'"),
        ({"operator": "XOR", "conditions": [{"a": 1}]}, "unknown logical operator 'XOR'"),
        ({"y": float("nan")}, "filter 'y': values must be finite numbers"),
        ({"y": {"b": 1}}, "filter 'y': values must be str, int, float, bool or null"),
    ],
)
def test_an_invalid_filter_is_one_line(filters: dict, message: str) -> None:
    with pytest.raises(InputError) as raised:
        parse_filters(filters)
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value)


def test_a_metadata_key_with_a_dot_is_refused_when_written() -> None:
    with pytest.raises(InputError, match=r"^document 'd1': metadata key 'a\.b' holds a '\.'"):
        metadata_json("d1", {"src": {"a.b": 1}})
    assert metadata_json("d1", {"src": {"a_b": 1}}) == '{"src": {"a_b": 1}}'
