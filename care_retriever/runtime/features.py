"""What one forward pass's input is, read the same way everywhere: the tokens of each text in a preprocessed batch
(:func:`sequence_lengths`), its tensors moved to the tower's device (:func:`to_device`), and the lock that serialises
a tower's tokenizer (:func:`tokenizer_lock`)."""

from __future__ import annotations

import threading
from typing import Any

import torch
from sentence_transformers import SentenceTransformer

# Fast tokenizers are not safe to call from several threads at once ("Already borrowed");
# the forward pass is, so only tokenisation is serialised.
_TOKENIZER_LOCKS: dict[int, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def tokenizer_lock(model: SentenceTransformer) -> threading.Lock:
    """The one lock of ``model``'s tokenizer (per tower, made on first use)."""
    with _LOCKS_GUARD:
        return _TOKENIZER_LOCKS.setdefault(id(model), threading.Lock())


def to_device(features: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """``features``' tensors on ``device``."""
    non_blocking = device.type == "cuda"  # from pinned memory: the copy overlaps the work already queued
    return {
        k: v.to(device, non_blocking=non_blocking) if isinstance(v, torch.Tensor) else v for k, v in features.items()
    }


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
