"""A Qdrant server gets the Filter a ``qdrant::memory:``-style local client evaluates in the agreement suite: both are
built by the one builder (:mod:`care_retriever.stores.qdrant.filter_tree`) from qdrant-client's models, and what the
client sends a server (the models as JSON) reads back as the same Filter. No server runs here (no binary, no
network), so the wire form is what is checked."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings

pytest.importorskip("qdrant_client")

from qdrant_client import models

from benchmarks.filter_agreement import FILTERS
from care_retriever.stores.filters import parse_filters
from care_retriever.stores.qdrant import filter_tree
from care_retriever.stores.qdrant.server_search import ClientTerms


def _wire(filters: Any) -> tuple[models.Filter | None, models.Filter | None]:
    built = filter_tree.build(ClientTerms(), parse_filters(filters))
    return built, None if built is None else models.Filter.model_validate_json(built.model_dump_json())


def test_a_date_range_reaches_the_server_as_an_instant_with_numbers_ruled_out() -> None:
    built, sent = _wire({"field": "meta.d", "operator": "<=", "value": "2021-02-28T23:00:00-02:00"})
    assert sent == built and sent is not None
    (date_range,) = sent.must  # type: ignore[misc]
    assert date_range.range.lte.isoformat() == "2021-03-01T01:00:00+00:00"
    (numbers,) = sent.must_not  # type: ignore[misc]
    assert numbers.key == "metadata.d" and isinstance(numbers.range, models.Range)


@settings(max_examples=100, derandomize=True, deadline=None, database=None)
@given(FILTERS)
def test_every_filter_reads_back_from_its_wire_form_unchanged(filters: Any) -> None:
    built, sent = _wire(filters)
    assert sent == built
