"""Fixtures of the framework integration tests (Haystack, LangChain)."""

from __future__ import annotations

import pytest

from tests.support.data import sample_queries


@pytest.fixture(scope="module")
def queries() -> list[str]:
    """The first twelve queries of the shipped sample."""
    return sample_queries()[:12]
