"""The metadata filters of a Qdrant Edge search, in the engine's terms: part of the adapter (:mod:`edge`), which
hands it the engine module, kept in a file of its own. A filter gives the answer a FAISS store's gives for the
same documents: a boolean matches booleans, a number matches an equal integer or float (``2 == 2.0``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def build_filter(qe: Any, conditions: Sequence[tuple[str, Sequence[Any]]] | None) -> Any:
    """An Edge filter (of the engine module ``qe``): every ``(key, values)`` must match one of its values."""
    if not conditions:
        return None

    def one(key: str, value: Any) -> Any:
        if isinstance(value, bool):  # the binding reads a Python bool as an int (no stored bool matches); numpy's not
            return qe.FieldCondition(key, match=qe.MatchValue(np.bool_(value)))
        if isinstance(value, float) or (isinstance(value, int) and abs(value) < 2**53):
            # a stored 2.0 is no integer 2 to Qdrant's match: a point range matches both, as FAISS's filter does
            # (exact for the integers a float holds without rounding)
            return qe.FieldCondition(key, range=qe.RangeFloat(gte=float(value), lte=float(value)))
        return qe.FieldCondition(key, match=qe.MatchValue(value))

    must: list[Any] = []
    for key, values in conditions:
        if len(values) == 1:
            must.append(one(key, values[0]))
        elif all(isinstance(v, str) for v in values):
            must.append(qe.FieldCondition(key, match=qe.MatchAny(list(values))))
        else:
            must.append(qe.Filter(should=[one(key, v) for v in values]))
    return qe.Filter(must=must)
