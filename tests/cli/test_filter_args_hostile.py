"""``--filter`` and ``--filter-json`` as a hostile user types them: an operator mistyped (``year=>2020``) is one
line, not an equality with the string ``">2020"`` answered with exit 0; a value starting with one of the operator
characters can still be given, quoted; equalities that contradict each other inside a ``--filter-json`` AND are
refused as they are across flags."""

from __future__ import annotations

import json

import pytest

from care_retriever.cli.filter_args import cli_filters
from care_retriever.errors import InputError


@pytest.mark.parametrize("item", ["year=>2020", "year<>1", "year=<2020", "flag!==true", "year>=>1"])
def test_a_mistyped_operator_is_one_line(item: str) -> None:
    with pytest.raises(InputError) as raised:
        cli_filters([item], None)
    assert str(raised.value).startswith(f"--filter {item!r}: the value starts with") and "\n" not in str(raised.value)


def test_a_quoted_value_may_start_with_an_operator_character() -> None:
    assert cli_filters(["note='>1'"], None) == {"field": "meta.note", "operator": "==", "value": ">1"}


def test_contradictory_equalities_inside_a_json_and_are_refused() -> None:
    conditions = [{"field": "meta.year", "operator": "==", "value": year} for year in (2021, 2019)]
    whole = json.dumps({"operator": "AND", "conditions": conditions})
    with pytest.raises(InputError, match=r"^--filter year=2021 and year=2019: a field cannot equal both"):
        cli_filters(None, whole)
    assert cli_filters(["year>=2020"], '{"year": 2021, "dept": ["a", "b"]}') == {
        "operator": "AND",
        "conditions": [
            {"field": "meta.year", "operator": ">=", "value": 2020},
            {"field": "meta.year", "operator": "==", "value": 2021},
            {"field": "meta.dept", "operator": "in", "value": ["a", "b"]},
        ],
    }
