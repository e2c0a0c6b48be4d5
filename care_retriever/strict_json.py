"""JSON as every door writes it: strict JSON (RFC 8259), which any parser reads.

Python's ``json`` reads and writes ``NaN``, ``Infinity`` and ``-Infinity`` as bare tokens; JSON has none of them, and
strict parsers (JavaScript's ``JSON.parse``, jq, Go's ``encoding/json``, serde_json) refuse the whole line. Every
JSON the package prints or serves goes through :func:`dumps` (``search --json``, ``info --json``, ``index --json``,
``eval --json``, the HTTP service's bodies), so none carries such a token. The doors refuse non-finite numbers in
metadata (:func:`care_retriever.documents.metadata_json`); what is left (a metric with no value, such as the
correlation of constant scores, or a store written before the doors refused them) is written as ``null``.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["dumps", "non_finite_field"]


def dumps(value: Any, *, indent: int | None = None, compact: bool = False) -> str:
    """``value`` as strict JSON text (UTF-8 characters kept as they are); a NaN or infinite float becomes ``null``.

    ``compact``: no spaces after separators (the service's bodies); ``indent``: pretty-printed (``info --json``).
    """
    separators = (",", ":") if compact else None
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, indent=indent, separators=separators)
    except ValueError:  # a non-finite float somewhere: the second pass writes it as null, still strict
        return json.dumps(_finite(value), ensure_ascii=False, allow_nan=False, indent=indent, separators=separators)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def non_finite_field(value: Any, path: str = "") -> tuple[str, float] | None:
    """The first NaN or infinite float inside ``value`` as ``(path, number)``, the path written ``a.b[2]``; None when
    there is none."""
    if isinstance(value, float) and not math.isfinite(value):
        return path, value
    if isinstance(value, dict):
        items: Any = ((f"{path}.{key}" if path else str(key), item) for key, item in value.items())
    elif isinstance(value, (list, tuple)):
        items = ((f"{path}[{i}]", item) for i, item in enumerate(value))
    else:
        return None
    for where, item in items:
        found = non_finite_field(item, where)
        if found is not None:
            return found
    return None
