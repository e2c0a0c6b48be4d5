"""The encoding loop shared by both towers.

Texts are sorted by length so each batch pads to similar lengths (fewer wasted FLOPs), encoded in
inference mode, and written back in input order. Texts that reach ``max_length`` are counted and
reported once per call instead of once per text.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from contextlib import nullcontext

import numpy as np
import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.util import batch_to_device
from tqdm.auto import tqdm

from care_retriever.encoding_checks import check_texts, check_unicode
from care_retriever.errors import InputError, ModelError

__all__ = ["check_texts", "check_unicode", "encode_texts", "logger"]

logger = logging.getLogger("care_retriever")

# Fast tokenizers are not safe to call from several threads at once ("Already borrowed");
# the forward pass is, so only tokenisation is serialised.
_TOKENIZER_LOCKS: dict[int, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def _tokenizer_lock(model: SentenceTransformer) -> threading.Lock:
    with _LOCKS_GUARD:
        return _TOKENIZER_LOCKS.setdefault(id(model), threading.Lock())


@torch.inference_mode()
def encode_texts(
    model: SentenceTransformer,
    texts: Sequence[str],
    *,
    prompt: str | None = None,
    batch_size: int = 32,
    show_progress: bool = False,
    desc: str = "Encoding",
    unit: str = "text",
    max_length: int | None = None,
    progress: tqdm | None = None,
    stats: dict[str, int] | None = None,
) -> np.ndarray:
    """Encode ``texts`` with ``model`` (a tower ending in ``Normalize``) into float32 rows.

    ``progress``: an outer bar to advance instead of drawing one (the index writer's docs/s bar).
    ``stats``: a dict to add the ``truncated`` count to instead of logging it, for callers that encode
    in many calls and report once (the index writer).
    """
    n = len(texts)
    dim = model.get_embedding_dimension()
    out = np.empty((n, dim), dtype=np.float32)
    if n == 0:
        return out
    if batch_size < 1:
        raise InputError(f"batch_size must be >= 1, got {batch_size}")
    model.eval()
    device = model.device
    order = np.argsort([-len(t) for t in texts], kind="stable")
    limit = max_length or model.max_seq_length
    truncated = 0
    lock = _tokenizer_lock(model)
    own_bar = progress is None
    bar_cm = (
        tqdm(total=n, desc=desc, unit=unit, disable=not show_progress, dynamic_ncols=True)
        if own_bar
        else nullcontext(progress)
    )
    with bar_cm as bar:
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            with lock:
                features = model.preprocess([texts[i] for i in idx], prompt=prompt)
            if limit and "attention_mask" in features and features["attention_mask"].shape[1] >= limit:
                truncated += int((features["attention_mask"].sum(dim=1) >= limit).sum())
            features = batch_to_device(features, device)
            emb = model(features)["sentence_embedding"]
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
