"""Which payload index each metadata field of a Qdrant Edge collection gets: the fields filters can name, nested
objects walked, each indexed by the type of the first value seen."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from care_retriever.stores.filters import is_filter_field

# the payload index of a metadata value's type (bool before int: a bool is an int to isinstance). Every number gets a
# float index: an integer index leaves out a stored 2019.5, which a range filter on the field must still find.
METADATA_KINDS: tuple[tuple[type, str], ...] = ((bool, "bool"), (int, "float"), (float, "float"), (str, "keyword"))


def metadata_fields(metadata: dict[str, Any], prefix: str = "metadata") -> Iterator[tuple[str, Any]]:
    """Each (payload key, value) filters can name in ``metadata``: nested objects walked, a list read by its first
    element; a key filters cannot name (such as ``""`` or ``"a b"``) is no JSON path the engine indexes: skipped."""
    for name, value in metadata.items():
        if not is_filter_field(name):
            continue
        key = f"{prefix}.{name}"
        if isinstance(value, dict):
            yield from metadata_fields(value, key)
        elif isinstance(value, list):
            if value and not isinstance(value[0], (dict, list)):
                yield key, value[0]
        else:
            yield key, value


def metadata_kind(value: Any) -> str | None:
    """The payload index a metadata value gets (the first value seen of a field decides)."""
    return next((kind for of_type, kind in METADATA_KINDS if isinstance(value, of_type)), None)
