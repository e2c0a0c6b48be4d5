"""How many texts and tokens one forward pass takes: the tokens a pass computes (:func:`batch_cost`), passes cut
within limits (:class:`Batches`), the limits halved after an out-of-memory error (:func:`halve_limits`) and the
automatic token budget measured on a GPU (:func:`auto_batch_limits`, :func:`measure_token_budget`)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import numpy as np
import torch
from sentence_transformers import SentenceTransformer

from care_retriever.runtime.batch_limits import (
    CUDA_DOCUMENT_BATCH_SIZE,
    DOCUMENT_BATCH_SIZE,
    BatchLimits,
    parse_max_batch_tokens,
)
from care_retriever.runtime.features import sequence_lengths, to_device, tokenizer_lock
from care_retriever.runtime.packed import is_packed, pack_features

logger = logging.getLogger("care_retriever")

# Raised by the CUDA caching allocator; torch.OutOfMemoryError (torch >= 2.5) is the same class on CUDA builds.
OOM_ERRORS: tuple[type[BaseException], ...] = tuple(
    {torch.cuda.OutOfMemoryError, getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)}
)


def batch_cost(lengths: np.ndarray, packed: bool = False) -> int:
    """Tokens a forward pass over texts of these token ``lengths`` computes: padded to the longest, or summed
    when the batch is flattened (no padding)."""
    if len(lengths) == 0:
        return 0
    return int(lengths.sum()) if packed else len(lengths) * int(lengths.max())


class Batches:
    """Batches over ``order`` (texts sorted longest first) within ``limits``: at most ``limits.texts`` texts and,
    with a token budget, at most ``limits.tokens`` tokens (:func:`batch_cost`). A text longer than the whole
    budget goes alone: every batch holds at least one text, so the walk always moves on."""

    def __init__(self, order: np.ndarray, lengths: np.ndarray, limits: BatchLimits, packed: bool = False) -> None:
        self.order, self.lengths, self.limits, self.packed = order, lengths, limits, packed

    def __iter__(self) -> Iterator[np.ndarray]:
        pos, n = 0, len(self.order)
        while pos < n:
            size = max(1, self.limits.texts)
            budget = self.limits.tokens
            if budget is not None and not self.packed:
                longest = max(1, int(self.lengths[self.order[pos]]))
                size = max(1, min(size, budget // longest))
            elif budget is not None:  # flattened: the texts' tokens add up
                sums = np.cumsum(self.lengths[self.order[pos : pos + size]])
                size = max(1, int(np.searchsorted(sums, budget, side="right")))
            batch = self.order[pos : pos + size]
            pos += len(batch)
            yield batch


def halve_limits(limits: BatchLimits, texts: int, width: int) -> int:
    """A batch of ``texts`` texts, each padded to ``width`` tokens, ran out of memory: halve the limits (the token
    budget to what the halved batch holds) and return the new text limit."""
    limits.texts = max(1, texts // 2)
    if limits.tokens is not None:
        limits.tokens = max(1, min(limits.tokens, limits.texts * width))
    return limits.texts


# The automatic token budget: this share of the GPU's free memory, at most this many tokens per pass (past that,
# bigger passes add memory, not speed).
AUTO_MEMORY_SHARE = 0.6
AUTO_MAX_TOKENS = 1 << 17


def auto_batch_limits(
    model: SentenceTransformer | None, batch_size: int | None, max_batch_tokens: int | str | None
) -> BatchLimits:
    """The limits of a run: ``batch_size`` texts (None: :data:`~care_retriever.runtime.batch_limits.DOCUMENT_BATCH_SIZE`
    on the CPU, :data:`~care_retriever.runtime.batch_limits.CUDA_DOCUMENT_BATCH_SIZE` on a GPU) and ``max_batch_tokens``
    tokens, where ``"auto"`` is a budget measured on the GPU the tower is on (:func:`measure_token_budget`) and no
    budget elsewhere."""
    device = torch.device(getattr(model, "device", "cpu")) if model is not None else torch.device("cpu")
    on_cuda = device.type == "cuda"
    texts = batch_size or (CUDA_DOCUMENT_BATCH_SIZE if on_cuda else DOCUMENT_BATCH_SIZE)
    budget = parse_max_batch_tokens(max_batch_tokens)  # the one parser: "auto", "none" or a count
    if budget == "auto":
        tokens = measure_token_budget(model, device) if on_cuda and model is not None else None
    else:
        tokens = budget if isinstance(budget, int) else None
    return BatchLimits(texts, tokens)


@torch.inference_mode()
def measure_token_budget(
    model: SentenceTransformer, device: torch.device, share: float = AUTO_MEMORY_SHARE, cap: int = AUTO_MAX_TOKENS
) -> int:
    """Tokens per forward pass that fit in ``share`` of the GPU's free memory: one probe pass of about 4,096 tokens
    measures the peak memory per token (activations of the tower as loaded: precision, attention), and the free
    memory left beside the weights is divided by it. At most ``cap``; a pass that still runs out of memory is
    halved by the encoding loop."""
    model.eval()
    text = "医学检查" * 64
    with tokenizer_lock(model):
        one = model.preprocess([text])
    length = max(1, int(sequence_lengths(one).max()))
    rows = max(1, 4096 // length)
    with tokenizer_lock(model):
        features = model.preprocess([text] * rows)
    if is_packed(model):  # probed as it will run
        features = pack_features(features)
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    try:
        model(to_device(features, device))
        torch.cuda.synchronize(device)
        per_token = max(1, torch.cuda.max_memory_allocated(device) - before) / (rows * length)
    except OOM_ERRORS:
        per_token = None
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info(device)
    if per_token is None:  # not even the probe fits: let the loop's back-off find the size
        return max(length, 1024)
    budget = int(share * free / per_token)
    logger.info(
        "token budget: %d tokens per pass (%.0f KiB per token, %.1f GiB free)", budget, per_token / 1024, free / 2**30
    )
    return max(length, min(cap, budget))
