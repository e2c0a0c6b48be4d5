"""The results page: every headline table comes with its device, date and command, and its figures come from what
the benchmarks wrote (rendered when the site is built), none typed into docs/results.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks.results_page import MARKER, SECTIONS, render

PAGE = Path(__file__).resolve().parents[2] / "docs" / "results.md"


@pytest.fixture(scope="module")
def sections() -> dict[str, str]:
    parts = re.split(r"(?m)^## ", render())[1:]
    return {part.split("\n", 1)[0]: part for part in parts}


def test_every_table_says_its_device_date_and_command(sections: dict[str, str]) -> None:
    assert list(sections) == [title for title, _ in SECTIONS]
    for title, text in sections.items():
        assert re.search(r"(?m)^\|---", text), f"{title}: no table"
        assert re.search(r"\b20\d\d-\d\d-\d\d\b", text), f"{title}: no date"
        assert re.search(r"python -m benchmarks\.\w+|care-retriever \w+", text), f"{title}: no command"
        assert re.search(r"CPU|GPU|H100|H200|cores", text), f"{title}: no device"
        assert "github.com/care-retriever/care-retriever/blob/main/" in text, f"{title}: no link to its raw log"


def test_the_page_holds_no_figures_of_its_own() -> None:
    text = PAGE.read_text("utf-8")
    assert MARKER in text.splitlines()
    assert not [line for line in text.splitlines() if line.startswith("|")]
