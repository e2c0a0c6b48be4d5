"""The encoding loop shared by both towers.

Texts are sorted by length so each batch pads to similar lengths (fewer wasted FLOPs), encoded in
inference mode, and written back in input order. Batches hold at most ``batch_size`` texts and, with
``max_batch_tokens``, at most that many padded tokens; a batch that runs out of GPU memory is halved
and retried (said once per halving). Texts that reach ``max_length`` are counted and reported once
per call instead of once per text.
"""

import logging
import os
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import nullcontext

import numpy as np
import torch
from sentence_transformers import SentenceTransformer
from tqdm.auto import tqdm

from care_retriever.errors import InputError, ModelError
from care_retriever.model.text_checks import check_texts, check_unicode
from care_retriever.runtime.batch_limits import BatchLimits
from care_retriever.runtime.batch_sizing import OOM_ERRORS, auto_batch_limits, halve_limits, measure_token_budget
from care_retriever.runtime.features import to_device, tokenizer_lock
from care_retriever.runtime.prefetch import Prefetcher
from care_retriever.runtime.tokenised import PassInput, TokenisedTexts, planned_passes, split_pass

# the encoding loop's face: what callers took from it before its parts had modules of their own
__all__ = [
    "BatchLimits",
    "auto_batch_limits",
    "check_texts",
    "check_unicode",
    "encode_texts",
    "logger",
    "measure_token_budget",
]

logger = logging.getLogger("care_retriever")


def _release_cached_memory() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# Vectors of this many texts are kept on the device and copied back in one transfer.
COPY_BACK_ROWS = 8192


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
    prefetch: bool | None = None,
) -> np.ndarray:
    """Encode ``texts`` with ``model`` (a tower ending in ``Normalize``) into float32 rows, in input order.

    ``batch_size``: texts per forward pass at most. ``max_batch_tokens``: also at most this many padded
    tokens per pass (texts x the longest one's tokens; the sum of the texts' tokens where the tower takes
    flattened inputs): short texts go many to a batch, long ones few, so an LLM tower's memory use stays flat
    over a corpus of mixed lengths; a text longer than the budget goes alone. ``limits``: both, as an object
    the caller keeps (it replaces ``batch_size``/``max_batch_tokens``). On out-of-memory the batch is
    halved and retried, and the halved limits kept; a single text that does not fit is a ModelError.
    ``progress``: an outer bar to advance instead of drawing one (the index writer's docs/s bar).
    ``stats``: a dict to add counts to instead of logging the truncation count, for callers that encode in many
    calls and report once (the index writer): ``truncated``, ``tokens`` (the texts' own), ``padded_tokens``
    (what the forward passes computed), ``batches``.
    ``prefetch``: tokenise the next batches in a background thread while the tower runs (default: where the
    tower is not on the CPU, or where torch's threads leave a CPU core free).

    Texts are taken longest first by characters and tokenised a group at a time; each group is sorted by its
    token counts before it is cut into batches, so a batch pads little. On CUDA the batches are pinned and
    copied without blocking, and the vectors stay on the device until they are copied back in bulk.
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
    device = torch.device(model.device)
    on_cuda = device.type == "cuda"
    if prefetch is None:  # on the CPU only where torch leaves a core free for it
        prefetch = device.type != "cpu" or torch.get_num_threads() < (os.cpu_count() or 1)
    lock = tokenizer_lock(model)
    chars = np.fromiter((len(t) for t in texts), dtype=np.int64, count=n)
    order = np.argsort(-chars, kind="stable")
    tokens = TokenisedTexts(model, texts, prompt, lock)
    planned = planned_passes(tokens, order, chars, limits, pin=on_cuda)
    source: Iterator[PassInput] | Prefetcher = Prefetcher(planned) if prefetch and n > limits.texts else planned
    limit = max_length or model.max_seq_length
    counts = {"truncated": 0, "tokens": 0, "padded_tokens": 0, "batches": 0}
    on_device: list[tuple[np.ndarray, torch.Tensor]] = []  # (positions, vectors) not yet copied back
    held = 0

    def copy_back() -> None:
        nonlocal held
        if not on_device:
            return
        idx = np.concatenate([i for i, _ in on_device])
        rows = torch.cat([v for _, v in on_device]).float().cpu().numpy()
        on_device.clear()
        held = 0
        store(idx, rows)

    def store(idx: np.ndarray, rows: np.ndarray) -> None:
        finite = np.isfinite(rows).all(axis=1)
        if not finite.all():
            bad = sorted(int(i) for i in idx[~finite])
            raise ModelError(
                f"{desc}: the model produced non-finite embeddings for input(s) {bad[:5]} "
                "(fp16 overflow? load the model with dtype float32 or bfloat16)"
            )
        out[idx] = rows

    bar_cm = (
        tqdm(total=n, desc=desc, unit=unit, disable=not show_progress, dynamic_ncols=True)
        if progress is None
        else nullcontext(progress)
    )
    try:
        with bar_cm as bar:
            for planned_batch in source:
                work = deque([planned_batch])
                while work:
                    batch = work.popleft()
                    over = len(batch.idx) > limits.texts or (limits.tokens is not None and batch.cost > limits.tokens)
                    if over and len(batch.idx) > 1:  # planned before an out-of-memory error lowered the limits
                        work.extendleft(reversed(split_pass(batch, limits, tokens)))
                        continue
                    try:
                        emb = model(to_device(batch.features, device))["sentence_embedding"]
                    except OOM_ERRORS:
                        emb = None  # handled below, outside the except block: its traceback holds the batch's tensors
                    if emb is None:
                        _release_cached_memory()
                        if len(batch.idx) == 1:
                            raise ModelError(
                                f"{desc}: out of memory on {device} encoding one text of {batch.width} tokens; lower "
                                "the tower's max length or use a device with more memory"
                            ) from None  # the OOM's traceback holds the batch's tensors: not kept
                        smaller = halve_limits(limits, len(batch.idx), batch.width)
                        logger.warning(
                            "%s: out of memory at %d texts x %d tokens; retrying with %d",
                            desc,
                            len(batch.idx),
                            batch.width,
                            smaller,
                        )
                        work.extendleft(reversed(split_pass(batch, limits, tokens)))
                        continue
                    if limit:
                        counts["truncated"] += int((batch.lengths >= limit).sum())
                    counts["tokens"] += int(batch.lengths.sum())
                    counts["padded_tokens"] += batch.cost
                    counts["batches"] += 1
                    if on_cuda:  # no synchronisation per batch: the vectors are copied back in bulk
                        on_device.append((batch.idx, emb.detach()))
                        held += len(batch.idx)
                        if held >= COPY_BACK_ROWS:
                            copy_back()
                    else:
                        store(batch.idx, emb.float().cpu().numpy())
                    bar.update(len(batch.idx))
            copy_back()
    finally:
        if isinstance(source, Prefetcher):
            source.close()
    if stats is not None:
        for key, value in counts.items():
            stats[key] = stats.get(key, 0) + value
    elif counts["truncated"]:
        logger.warning(
            "%s: %d of %d texts reached max_length=%s tokens and were truncated", desc, counts["truncated"], n, limit
        )
    return out
