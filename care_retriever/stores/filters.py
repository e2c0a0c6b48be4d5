"""What a store's metadata filters are: ``{"topic": "高血压"}`` (equal) or ``{"topic": [a, b]}`` (any of), and which
metadata fields they can name. Every store reads its filters through :func:`validate_filters`, and the service's
request schema checks them with it too (:mod:`care_retriever.search.service_schema`), so a bad filter is the same
one line from every door.
"""

from __future__ import annotations

import math
import re
from typing import Any

from care_retriever.errors import InputError

Filters = dict[str, Any]
# The metadata fields a store indexes for filtering: letters, digits, "_", "-", ".".
FILTER_KEY = re.compile(r"^[\w.\-]+$")


def is_filter_field(name: object) -> bool:
    """Whether filters can name the metadata field ``name`` (letters, digits, ``_``, ``-``, ``.``): the fields a
    store indexes for filtering; others are kept, and not filterable."""
    return isinstance(name, str) and FILTER_KEY.match(name) is not None


def validate_filters(filters: Filters | None) -> Filters | None:
    """Filters match metadata fields: ``{"topic": "高血压"}`` (equal) or ``{"topic": [a, b]}`` (any of)."""
    if not filters:
        return None
    if not isinstance(filters, dict):
        raise InputError(f"filters must be a dict of metadata field -> value or list of values, got {filters!r}")
    for key, value in filters.items():
        if not is_filter_field(key):
            raise InputError(f"invalid filter field {key!r}: use letters, digits, '_', '-' or '.'")
        values = value if isinstance(value, list) else [value]
        if not values or not all(isinstance(v, (str, int, float, bool)) for v in values):
            raise InputError(f"filter {key!r}: values must be str, int, float or bool (or a non-empty list of them)")
        if any(isinstance(v, float) and not math.isfinite(v) for v in values):
            raise InputError(f"filter {key!r}: values must be finite numbers")
        if any(type(v) is int and not -(2**63) <= v < 2**63 for v in values):  # SQLite's and Qdrant's integers
            raise InputError(f"filter {key!r}: integers must be within 64 bits (-2**63 to 2**63 - 1)")
    return filters
