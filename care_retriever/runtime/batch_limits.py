"""How much one forward pass of a tower may take: the batch defaults, :class:`BatchLimits` and the one parser of
``max_batch_tokens``.

The one home of the document batch default (:data:`DOCUMENT_BATCH_SIZE`: every ``batch_size`` default of the
document side refers to it). On the ground floor: the encoding loop, the embedders, the encoding config of an
indexing run and the writer read it; torch-free, it imports nothing of the package but its errors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from care_retriever.errors import InputError

# Texts per forward pass when none is given: on the CPU (small batches keep its caches warm), on a GPU (the token
# budget is then what bounds a batch of short texts).
DOCUMENT_BATCH_SIZE = 16
CUDA_DOCUMENT_BATCH_SIZE = 2048
AUTO = "auto"


def parse_max_batch_tokens(value: Any) -> int | str | None:
    """``auto``, ``none`` (no budget) or a number of tokens >= 1, from a flag's text or a Python value."""
    if value is None or value == AUTO:
        return value
    if isinstance(value, str):
        text = value.strip().lower()
        if text in (AUTO, "none"):
            return None if text == "none" else AUTO
        try:
            value = int(text)
        except ValueError:
            raise InputError(f"--max-batch-tokens must be an integer >= 1, auto or none, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"--max-batch-tokens must be an integer >= 1, auto or none, got {value!r}")
    return value


@dataclass
class BatchLimits:
    """How much one forward pass may take: ``texts`` texts and, when set, ``tokens`` tokens (padded: texts x the
    batch's longest text; flattened, for flash-attention's variable-length kernels: the sum of the texts' tokens).
    Halved on out-of-memory; a caller that encodes in many calls (the index writer) passes one object so a
    lowered limit holds for its later calls too."""

    texts: int = 32
    tokens: int | None = None
