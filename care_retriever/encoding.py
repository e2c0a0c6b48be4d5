"""The encoding loop shared by both towers.

Texts are sorted by length so each batch pads to similar lengths (fewer wasted FLOPs), encoded in
inference mode, and written back in input order. Batches hold at most ``batch_size`` texts and, with
``max_batch_tokens``, at most that many padded tokens; a batch that runs out of GPU memory is halved
and retried (said once per halving). Texts that reach ``max_length`` are counted and reported once
per call instead of once per text.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.util import batch_to_device
from tqdm.auto import tqdm

from care_retriever.encoding_checks import check_texts, check_unicode
from care_retriever.errors import InputError, ModelError

__all__ = ["BatchLimits", "check_texts", "check_unicode", "encode_texts", "logger"]

logger = logging.getLogger("care_retriever")

# Fast tokenizers are not safe to call from several threads at once ("Already borrowed");
# the forward pass is, so only tokenisation is serialised.
_TOKENIZER_LOCKS: dict[int, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def _tokenizer_lock(model: SentenceTransformer) -> threading.Lock:
    with _LOCKS_GUARD:
        return _TOKENIZER_LOCKS.setdefault(id(model), threading.Lock())


# Raised by the CUDA caching allocator; torch.OutOfMemoryError (torch >= 2.5) is the same class on CUDA builds.
OOM_ERRORS: tuple[type[BaseException], ...] = tuple(
    {torch.cuda.OutOfMemoryError, getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)}
)


@dataclass
class BatchLimits:
    """How much one forward pass may take: ``texts`` texts and, when set, ``tokens`` padded tokens
    (texts x the batch's longest text). Halved on out-of-memory; a caller that encodes in many calls
    (the index writer) passes one object so a lowered limit holds for its later calls too."""

    texts: int = 32
    tokens: int | None = None


class Batches:
    """Batches over texts sorted longest first (each batch pads to its first text, so it costs
    ``len(batch) x lengths[batch[0]]`` tokens), within ``limits``; a text longer than the token budget
    goes alone. After an out-of-memory error :meth:`retry_smaller` halves the limits and yields the failed
    batch's texts again."""

    def __init__(self, order: np.ndarray, lengths: np.ndarray, limits: BatchLimits) -> None:
        self.order, self.lengths, self.limits = order, lengths, limits
        self._pos = self._last = 0

    def __iter__(self) -> Iterator[np.ndarray]:
        while self._pos < len(self.order):
            longest = max(1, int(self.lengths[self.order[self._pos]]))
            size = self.limits.texts
            if self.limits.tokens is not None:
                size = max(1, min(size, self.limits.tokens // longest))
            self._last = self._pos
            batch = self.order[self._pos : self._pos + size]
            self._pos += len(batch)
            yield batch

    def retry_smaller(self, texts: int, tokens: int) -> int:
        """The last batch (``texts`` texts of ``tokens`` padded tokens each) ran out of memory: halve the
        limits, rewind to that batch; return the new text limit."""
        self.limits.texts = max(1, texts // 2)
        if self.limits.tokens is not None:
            self.limits.tokens = min(self.limits.tokens, self.limits.texts * tokens)
        self._pos = self._last
        return self.limits.texts


def _token_lengths(
    model: SentenceTransformer, texts: Sequence[str], prompt: str | None, lock: threading.Lock
) -> np.ndarray:
    """Tokens per text as the tower sees it (prompt and special tokens included, truncated to its max length)."""
    lengths = np.empty(len(texts), dtype=np.int64)
    for start in range(0, len(texts), 1024):  # bounded: the padded ids of one slice are held at once
        with lock:
            features = model.preprocess(list(texts[start : start + 1024]), prompt=prompt)
        lengths[start : start + 1024] = sequence_lengths(features).numpy()
    return lengths


def sequence_lengths(features: dict[str, torch.Tensor]) -> torch.Tensor:
    """Tokens of each text in a preprocessed batch: padded rows (``attention_mask``), or one row of texts laid
    end to end for flash-attention's variable-length kernels (sentence-transformers drops the padding there;
    ``cu_seq_lens_q`` holds the offsets)."""
    if "attention_mask" in features:
        return features["attention_mask"].sum(dim=1)
    if "cu_seq_lens_q" in features:
        return features["cu_seq_lens_q"].diff()
    ids = features["input_ids"]
    return torch.full((ids.shape[0],), ids.shape[1])


def _release_cached_memory() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@torch.inference_mode()
def encode_texts(
    model: SentenceTransformer,
    texts: Sequence[str],
    *,
    prompt: str | None = None,
    batch_size: int = 32,
    max_batch_tokens: int | None = None,
    limits: BatchLimits | None = None,
    show_progress: bool = False,
    desc: str = "Encoding",
    unit: str = "text",
    max_length: int | None = None,
    progress: tqdm | None = None,
    stats: dict[str, int] | None = None,
) -> np.ndarray:
    """Encode ``texts`` with ``model`` (a tower ending in ``Normalize``) into float32 rows, in input order.

    ``batch_size``: texts per forward pass at most. ``max_batch_tokens``: also at most this many padded
    tokens per pass (texts x the longest one's tokens): short texts go many to a batch, long ones few,
    so an LLM tower's memory use stays flat over a corpus of mixed lengths. ``limits``: both, as an object
    the caller keeps (it replaces ``batch_size``/``max_batch_tokens``). On out-of-memory the batch is
    halved and retried, and the halved limits kept; a single text that does not fit is a ModelError.
    ``progress``: an outer bar to advance instead of drawing one (the index writer's docs/s bar).
    ``stats``: a dict to add the ``truncated`` count to instead of logging it, for callers that encode
    in many calls and report once (the index writer).
    """
    n = len(texts)
    dim = model.get_embedding_dimension()
    if dim is None:  # a tower without a pooling module
        raise ModelError(f"{desc}: the model gives no sentence embedding (no pooling module)")
    out = np.empty((n, dim), dtype=np.float32)
    if n == 0:
        return out
    limits = limits if limits is not None else BatchLimits(batch_size, max_batch_tokens)
    if limits.texts < 1:
        raise InputError(f"batch_size must be >= 1, got {limits.texts}")
    if limits.tokens is not None and limits.tokens < 1:
        raise InputError(f"max_batch_tokens must be >= 1, got {limits.tokens}")
    model.eval()
    device = model.device
    lock = _tokenizer_lock(model)
    if limits.tokens is None:  # characters stand in for tokens: no tokenisation pass just to sort
        lengths = np.fromiter((len(t) for t in texts), dtype=np.int64, count=n)
    else:
        lengths = _token_lengths(model, texts, prompt, lock)
    order = np.argsort(-lengths, kind="stable")
    batches = Batches(order, lengths, limits)
    limit = max_length or model.max_seq_length
    truncated = 0
    bar_cm = (
        tqdm(total=n, desc=desc, unit=unit, disable=not show_progress, dynamic_ncols=True)
        if progress is None
        else nullcontext(progress)
    )
    with bar_cm as bar:
        for idx in batches:
            with lock:
                features = model.preprocess([texts[i] for i in idx], prompt=prompt)
            lengths_in_batch = sequence_lengths(features)
            padded = int(lengths_in_batch.max())  # what each text of the batch is padded to
            try:
                emb = model(batch_to_device(features, device))["sentence_embedding"]
            except OOM_ERRORS:
                emb = None  # handled below, outside the except block: its traceback holds the batch's tensors
            if emb is None:
                features = {}
                _release_cached_memory()
                if len(idx) == 1:
                    raise ModelError(
                        f"{desc}: out of memory on {device} encoding one text of {padded} tokens; lower the "
                        "tower's max length or use a device with more memory"
                    ) from None  # the OOM's traceback holds the batch's tensors: not kept
                smaller = batches.retry_smaller(len(idx), padded)
                logger.warning(
                    "%s: out of memory at %d texts x %d tokens; retrying with %d", desc, len(idx), padded, smaller
                )
                continue
            if limit:
                truncated += int((lengths_in_batch >= limit).sum())
            if not torch.isfinite(emb).all():
                bad = sorted(int(idx[j]) for j in torch.nonzero(~torch.isfinite(emb).all(dim=1)).flatten().tolist())
                raise ModelError(
                    f"{desc}: the model produced non-finite embeddings for input(s) {bad[:5]} "
                    "(fp16 overflow? load the model with dtype float32 or bfloat16)"
                )
            out[idx] = emb.float().cpu().numpy()
            bar.update(len(idx))
    if stats is not None:
        stats["truncated"] = stats.get("truncated", 0) + truncated
    elif truncated:
        logger.warning("%s: %d of %d texts reached max_length=%s tokens and were truncated", desc, truncated, n, limit)
    return out
