"""Which payload index each metadata field of a Qdrant Edge collection gets: the fields filters can name, nested
objects walked, each indexed by the type of the first value seen, and a numeric index made a keyword one when the
field takes a date string."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from care_retriever.documents import Document
from care_retriever.stores.filters import is_filter_field, parse_date

# the payload index of a metadata value's type (bool before int: a bool is an int to isinstance). Every number gets a
# float index: an integer index leaves out a stored 2019.5, which a range filter on the field must still find.
METADATA_KINDS: tuple[tuple[type, str], ...] = ((bool, "bool"), (int, "float"), (float, "float"), (str, "keyword"))
NUMERIC_KINDS = ("integer", "float")


def metadata_fields(metadata: dict[str, Any], prefix: str = "metadata") -> Iterator[tuple[str, Any]]:
    """Each (payload key, value) filters can name in ``metadata``: nested objects walked, each scalar of a list
    given; a key filters cannot name (such as ``""`` or ``"a b"``) is no JSON path the engine indexes: skipped."""
    for name, value in metadata.items():
        if not is_filter_field(name):
            continue
        key = f"{prefix}.{name}"
        if isinstance(value, dict):
            yield from metadata_fields(value, key)
        elif isinstance(value, list):
            yield from ((key, element) for element in value if not isinstance(element, (dict, list)))
        else:
            yield key, value


def metadata_kind(value: Any) -> str | None:
    """The payload index a metadata value gets (the first value seen of a field decides)."""
    return next((kind for of_type, kind in METADATA_KINDS if isinstance(value, of_type)), None)


def reindexed_kind(indexed: str | None, value: Any) -> str | None:
    """The payload index a field indexed as ``indexed`` (None: not yet) needs once it holds ``value``, when that is
    another index than it has; else None.

    A numeric index answers a date range from its numbers alone, so a stored date string of the field would never
    match one: a field that takes a date string gets a keyword index, whose engine checks ranges on the payload
    itself (as filters mean: :func:`care_retriever.stores.filter_matching.matches`).
    """
    if indexed is None:
        return metadata_kind(value)
    if indexed in NUMERIC_KINDS and isinstance(value, str) and parse_date(value) is not None:
        return "keyword"
    return None


def index_metadata(shard: Any, documents: Sequence[Document]) -> None:
    """A payload index in ``shard`` (an ``edge.EdgeShard``) for each metadata field filters can match
    (:func:`metadata_fields`), created the first time the field is seen, replaced when a value needs another
    (:func:`reindexed_kind`)."""
    indexed = shard.payload_indexes()
    for document in documents:
        for key, value in metadata_fields(document.metadata):
            kind = reindexed_kind(indexed.get(key), value)
            if kind is not None:
                shard.index_field(key, kind)
                indexed[key] = kind
