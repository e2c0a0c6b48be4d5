"""The metadata filters of a Qdrant Edge search, in the engine's terms: part of the adapter (:mod:`edge`), which
hands it the engine module, kept in a file of its own. A filter gives the answer a FAISS store's gives for the
same documents, by :func:`~care_retriever.stores.qdrant.common.value_match`'s rule (a server's filter reads it too).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from care_retriever.stores.qdrant.common import value_match


def build_filter(qe: Any, conditions: Sequence[tuple[str, Sequence[Any]]] | None) -> Any:
    """An Edge filter (of the engine module ``qe``): every ``(key, values)`` must match one of its values."""
    if not conditions:
        return None

    def one(key: str, value: Any) -> Any:
        match value_match(value):
            case "bool":  # the binding reads a Python bool as an int (no stored bool matches); numpy's not
                return qe.FieldCondition(key, match=qe.MatchValue(np.bool_(value)))
            case "range":
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
