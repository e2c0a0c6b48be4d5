"""docs/filters.md: its Python examples run, in order, in one namespace (their asserts are the guide's claims)."""

from __future__ import annotations

import re
from pathlib import Path

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "filters.md"


def test_the_filters_guide_examples_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.S)
    assert len(blocks) == 2
    namespace: dict[str, object] = {}
    for block in blocks:
        exec(compile(block, str(GUIDE), "exec"), namespace)  # the guide's own code
    namespace["store"].close()  # type: ignore[attr-defined]
