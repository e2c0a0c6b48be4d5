"""SQL ``IN (...)`` lists over many values, in chunks SQLite accepts.

SQLite caps the bound parameters of one statement (999 before 3.32, 32766 after); a list of ids from
a caller can be any length, so it is sent in chunks of :data:`MAX_IN_PARAMS`, each with its own
placeholders: ``for marks, chunk in in_chunks(ids): db.execute(f"... IN ({marks})", chunk)``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

T = TypeVar("T")

# Under the oldest limit (999) with room for the statement's other parameters.
MAX_IN_PARAMS = 500


def in_chunks(values: Sequence[T], size: int = MAX_IN_PARAMS) -> Iterator[tuple[str, list[T]]]:
    """``(placeholders, chunk)`` for consecutive chunks of ``values``: ``("?,?,?", [a, b, c])``."""
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    for start in range(0, len(values), size):
        chunk = list(values[start : start + size])
        yield ",".join("?" * len(chunk)), chunk
