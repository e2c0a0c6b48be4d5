"""mkdocs hook: the results page's tables rendered from what the benchmarks wrote (``benchmarks.results_page``).

A page holding the line ``::: results-page`` gets them when the site is built, so it cannot drift from the
benchmarks' JSON and logs.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def on_page_markdown(markdown: str, **_: Any) -> str:
    if "::: results-page" not in markdown:
        return markdown
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from benchmarks.results_page import MARKER, render

    return markdown.replace(MARKER, render())
