"""The encoding loop shared by both towers.

Texts are sorted by length so each batch pads to similar lengths (fewer wasted FLOPs), encoded in
inference mode, and written back in input order. Batches hold at most ``batch_size`` texts and, with
``max_batch_tokens``, at most that many padded tokens; a batch that runs out of GPU memory is halved
and retried (said once per halving). Texts that reach ``max_length`` are counted and reported once
per call instead of once per text.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import weakref
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from sentence_transformers import SentenceTransformer
from tqdm.auto import tqdm

from care_retriever.errors import InputError, ModelError
from care_retriever.model.batch_limits import (
    CUDA_DOCUMENT_BATCH_SIZE,
    DOCUMENT_BATCH_SIZE,
    BatchLimits,
    parse_max_batch_tokens,
)
from care_retriever.model.protocols import check_texts, check_unicode
from care_retriever.model.towers.packed import is_packed, pack_features

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

# Fast tokenizers are not safe to call from several threads at once ("Already borrowed");
# the forward pass is, so only tokenisation is serialised.
_TOKENIZER_LOCKS: dict[int, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def _tokenizer_lock(model: SentenceTransformer) -> threading.Lock:
    with _LOCKS_GUARD:
        return _tokenizer_lock_unguarded(model)


def _tokenizer_lock_unguarded(model: SentenceTransformer) -> threading.Lock:
    return _TOKENIZER_LOCKS.setdefault(id(model), threading.Lock())


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
    """The limits of a run: ``batch_size`` texts (None: :data:`~care_retriever.model.batch_limits.DOCUMENT_BATCH_SIZE`
    on the CPU, :data:`~care_retriever.model.batch_limits.CUDA_DOCUMENT_BATCH_SIZE` on a GPU) and ``max_batch_tokens``
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
    with _tokenizer_lock(model):
        one = model.preprocess([text])
    length = max(1, int(sequence_lengths(one).max()))
    rows = max(1, 4096 // length)
    with _tokenizer_lock(model):
        features = model.preprocess([text] * rows)
    if is_packed(model):  # probed as it will run
        features = pack_features(features)
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    try:
        model(_to_device(features, device))
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


@dataclass
class _Batch:
    """One forward pass's input: the input positions of its texts, their token counts, the tokenised features
    (CPU tensors, pinned on CUDA) and whether they are flattened (flash-attention varlen: no padding)."""

    idx: np.ndarray
    lengths: np.ndarray
    features: dict[str, Any]
    packed: bool
    side: str = "right"  # where the padding is

    @property
    def width(self) -> int:
        return int(self.lengths.max())

    @property
    def cost(self) -> int:
        return batch_cost(self.lengths, self.packed)


# Per tower (weakly held: a tower freed and another built at its address gets neither): the plain backend copy,
# and per prompt whether that backend gave the tower's own ids (checked on the first call's first group; later calls
# trust the verdict, as a call's later groups do, instead of tokenising a group twice per call: the index writer
# calls once per slice).
_BACKENDS: weakref.WeakKeyDictionary[SentenceTransformer, Any] = weakref.WeakKeyDictionary()
_FAST_VERDICTS: weakref.WeakKeyDictionary[SentenceTransformer, dict[str | None, bool]] = weakref.WeakKeyDictionary()


def _plain_backend(model: SentenceTransformer) -> Any:
    """A copy of the tower's Rust tokenizer without padding or truncation, made once per tower and never changed
    (the tokenizer's own keeps whatever padding and truncation its last call set)."""
    with _LOCKS_GUARD:
        if model not in _BACKENDS:
            backend = getattr(getattr(model, "tokenizer", None), "_tokenizer", None)
            copy = None
            if backend is not None and hasattr(backend, "to_str"):
                with _tokenizer_lock_unguarded(model):
                    copy = type(backend).from_str(backend.to_str())
                copy.no_padding()
                copy.no_truncation()
            _BACKENDS[model] = copy
        return _BACKENDS[model]


class _Tokenised:
    """Texts tokenised a group at a time by the tower's own ``preprocess`` (prompt, special tokens, truncation as
    the tower does them) and kept unpadded per text, so any set of them is collated into a batch without
    tokenising again. Where the features are not padded rows (flattened inputs, an unknown layout) each batch is
    preprocessed again instead (``regroup`` False)."""

    def __init__(self, model: SentenceTransformer, texts: Sequence[str], prompt: str | None, lock: threading.Lock):
        self.model, self.texts, self.prompt, self.lock = model, texts, prompt, lock
        tokenizer = getattr(model, "tokenizer", None)
        self.side = getattr(tokenizer, "padding_side", "right") or "right"
        self.pad_id = getattr(tokenizer, "pad_token_id", None) or 0
        # input position -> {key: 1-D tensor | per-text value}, or the token ids from the backend
        self.rows: dict[int, Any] = {}
        self.shared: dict[str, Any] = {}  # values of the whole batch (modality, prompt_length)
        self.token_keys: set[str] = set()  # features with one value per token
        self.regroup = True
        # passes laid out packed (texts end to end, budgeted by their tokens' sum): a tower whose forward packs them
        self.pack = is_packed(model)
        self.packed = self.pack
        # The tokenizer's Rust backend called directly (ids only: no per-text Python objects, no padding), once it
        # gave the tower's own ids for a whole group: None until checked.
        with _LOCKS_GUARD:
            self.fast: bool | None = _FAST_VERDICTS.get(model, {}).get(prompt)
        self._backend: Any = None
        self.limit = getattr(model, "max_seq_length", None)

    def preprocess(self, idx: Sequence[int] | np.ndarray) -> dict[str, Any]:
        with self.lock:
            return self.model.preprocess([self.texts[i] for i in idx], prompt=self.prompt)

    def batch_features(self, idx: Sequence[int] | np.ndarray) -> dict[str, Any]:
        """The features of one pass over the texts at ``idx``, tokenised again (packed where the tower packs)."""
        features = self.preprocess(idx)
        return pack_features(features) if self.pack else features

    def _backend_ids(self, idx: np.ndarray) -> list[list[int]] | None:
        if self._backend is None:
            self._backend = _plain_backend(self.model)
            if self._backend is None:
                return None
        prompt = self.prompt or ""
        texts = [prompt + self.texts[i] for i in idx] if prompt else [self.texts[i] for i in idx]
        # encode_batch_fast (tokenizers >= 0.21): the same ids without the character offsets (about a sixth faster)
        encode = getattr(self._backend, "encode_batch_fast", None) or self._backend.encode_batch
        return [e.ids for e in encode(texts)]

    def add(self, idx: np.ndarray, more: bool = False) -> np.ndarray:
        """Tokenise the texts at ``idx``; return their token counts. ``more``: other groups follow (worth checking
        whether the backend can tokenise them)."""
        if self.fast:
            ids = self._backend_ids(idx)
            lengths = np.fromiter((len(r) for r in ids or ()), dtype=np.int64, count=len(idx))
            # a text that may have been truncated is tokenised by the tower itself (truncation as it does it)
            if ids is not None and not (self.limit and (lengths >= self.limit).any()):
                self.rows.update(zip(idx.tolist(), ids, strict=True))
                return lengths
        features = self.preprocess(idx)
        lengths = sequence_lengths(features).numpy().astype(np.int64)
        if "cu_seq_lens_q" in features and "attention_mask" not in features:
            self.packed, self.regroup = True, False
        if not self.regroup:
            return lengths
        mask = features.get("attention_mask")
        ids = features.get("input_ids")
        if not isinstance(mask, torch.Tensor) or not isinstance(ids, torch.Tensor) or mask.shape != ids.shape:
            self.regroup = False
            return lengths
        n, width = ids.shape
        if bool((mask[:, 0] == 0).any()):
            self.side = "left"
        elif bool((mask[:, -1] == 0).any()):
            self.side = "right"
        per_token, per_text = [], []
        for key, value in features.items():
            if isinstance(value, torch.Tensor) and value.dim() >= 2 and tuple(value.shape[:2]) == (n, width):
                per_token.append(key)
            elif isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == n and n > 1:
                per_text.append(key)
            elif isinstance(value, torch.Tensor) and value.dim() >= 1:
                self.regroup = False  # a layout this does not know: preprocess each batch as it comes
                return lengths
            else:
                self.shared[key] = value
        self.token_keys.update(per_token)
        for j, i in enumerate(idx.tolist()):
            length = int(lengths[j])
            cut = slice(width - length, width) if self.side == "left" else slice(0, length)
            row = {key: features[key][j, cut] for key in per_token}
            row.update({key: features[key][j] for key in per_text})
            self.rows[i] = row
        if self.fast is None and more:
            self.fast = self._backend_agrees(idx, per_token, per_text)
            with _LOCKS_GUARD:
                _FAST_VERDICTS.setdefault(self.model, {})[self.prompt] = self.fast
        return lengths

    def _backend_ids_agree(self, idx: np.ndarray) -> bool:
        ids = self._backend_ids(idx)
        # texts the tower truncated are left out: a group holding one is tokenised by the tower (see add)
        return ids is not None and all(
            ids[j] == row.tolist()
            for j, i in enumerate(idx.tolist())
            if not (self.limit and len(row := self.rows[i]["input_ids"]) >= self.limit)
        )

    def _backend_agrees(self, idx: np.ndarray, per_token: list[str], per_text: list[str]) -> bool:
        """Whether the backend's ids are the tower's own for this group (prompt, special tokens, no truncation
        here), with nothing beside the ids and their mask to collate."""
        if per_text or set(per_token) != {"input_ids", "attention_mask"}:
            return False
        if set(self.shared) - {"modality", "prompt_length"}:
            return False
        try:
            return self._backend_ids_agree(idx)
        except Exception:  # a backend that does not work this way: the tower's preprocess it is
            return False

    def collate(self, idx: np.ndarray, lengths: np.ndarray, pin: bool) -> _Batch:
        if not self.regroup:
            features = self.batch_features(idx)
        else:
            rows = [self.rows.pop(i) for i in idx.tolist()]
            features = dict(self.shared)
            if all(isinstance(r, list) for r in rows):  # ids from the backend: padded here, in numpy
                width = int(lengths.max())
                ids = np.full((len(rows), width), self.pad_id, dtype=np.int64)
                positions = np.arange(width)
                if self.side == "left":
                    for j, r in enumerate(rows):
                        ids[j, width - len(r) :] = r
                    mask = positions[None, :] >= (width - lengths)[:, None]
                else:
                    for j, r in enumerate(rows):
                        ids[j, : len(r)] = r
                    mask = positions[None, :] < lengths[:, None]
                features["input_ids"] = torch.from_numpy(ids)
                features["attention_mask"] = torch.from_numpy(mask.astype(np.int64))
                rows = []
            rows = [
                {"input_ids": torch.tensor(r), "attention_mask": torch.ones(len(r), dtype=torch.int64)}
                if isinstance(r, list)
                else r
                for r in rows
            ]
            for key in rows[0] if rows else ():
                if key in self.token_keys:
                    pad = self.pad_id if key == "input_ids" else 0
                    features[key] = torch.nn.utils.rnn.pad_sequence(
                        [r[key] for r in rows], batch_first=True, padding_value=pad, padding_side=self.side
                    )
                else:
                    features[key] = torch.stack([r[key] for r in rows])
        if self.pack and "attention_mask" in features:
            features = pack_features(features)
        if pin:
            features = {k: v.pin_memory() if isinstance(v, torch.Tensor) else v for k, v in features.items()}
        return _Batch(idx, lengths, features, self.packed, self.side)


# Texts tokenised at once ahead of the forward passes (a group's padded ids are held together): at most this many
# texts or characters.
GROUP_TEXTS = 2048
GROUP_CHARS = 1 << 18


def _planned_batches(
    tokens: _Tokenised, order: np.ndarray, chars: np.ndarray, limits: BatchLimits, pin: bool
) -> Iterator[_Batch]:
    """Batches over the texts in ``order`` (longest first by characters), tokenised a group at a time: each group
    and the texts left over from the one before are sorted by their token counts and cut into batches within
    ``limits``; the last, possibly part-filled, batch of a group waits for the next one."""
    pool_idx = np.empty(0, dtype=np.int64)
    pool_len = np.empty(0, dtype=np.int64)
    pos, n = 0, len(order)
    while pos < n:
        end, total = pos, 0
        while end < n and end - pos < GROUP_TEXTS and (end == pos or total + chars[order[end]] <= GROUP_CHARS):
            total += int(chars[order[end]])
            end += 1
        group = order[pos:end]
        pos = end
        pool_idx = np.concatenate([pool_idx, group])
        pool_len = np.concatenate([pool_len, tokens.add(group, more=pos < n)])
        by_tokens = np.argsort(-pool_len, kind="stable")
        cuts = list(Batches(by_tokens, pool_len, limits, packed=tokens.packed))
        keep = cuts[-1] if pos < n else np.empty(0, dtype=np.int64)
        for cut in cuts if pos >= n else cuts[:-1]:
            yield tokens.collate(pool_idx[cut], pool_len[cut], pin)
        pool_idx, pool_len = pool_idx[keep], pool_len[keep]


class _Prefetcher:
    """Runs an iterator in a background thread, ``depth`` items ahead (tokenising and collating the next batches
    while the tower runs the current one). Exceptions are raised in the consumer; ``close`` stops the thread."""

    _END = object()

    def __init__(self, items: Iterator[Any], depth: int = 2) -> None:
        self._items = items
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="care-encoding-prefetch", daemon=True)
        self._thread.start()

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            for item in self._items:
                if not self._put(item):
                    return
        except BaseException as exc:  # handed to the consumer, raised there
            self._put(_Raised(exc))
            return
        self._put(self._END)

    def __iter__(self) -> Iterator[Any]:
        while True:
            item = self._queue.get()
            if item is self._END:
                return
            if isinstance(item, _Raised):
                raise item.exc
            yield item

    def close(self) -> None:
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._queue.get_nowait()
            except queue.Empty:
                self._thread.join(timeout=0.05)


@dataclass
class _Raised:
    exc: BaseException


def _split(batch: _Batch, limits: BatchLimits, tokens: _Tokenised) -> list[_Batch]:
    """``batch`` cut into consecutive parts within ``limits`` (after an out-of-memory error lowered them)."""
    parts = []
    for cut in Batches(np.arange(len(batch.idx)), batch.lengths, limits, packed=batch.packed):
        idx, lengths = batch.idx[cut], batch.lengths[cut]
        if batch.packed or not tokens.regroup:  # not padded rows: tokenised again
            parts.append(_Batch(idx, lengths, tokens.batch_features(idx), batch.packed, batch.side))
            continue
        width = int(lengths.max())
        n, full = len(batch.idx), batch.width
        cols = slice(full - width, full) if batch.side == "left" else slice(0, width)
        features: dict[str, Any] = {}
        for key, value in batch.features.items():
            if isinstance(value, torch.Tensor) and value.dim() >= 2 and tuple(value.shape[:2]) == (n, full):
                features[key] = value[cut[0] : cut[-1] + 1, cols]
            elif isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == n:
                features[key] = value[cut[0] : cut[-1] + 1]
            else:
                features[key] = value
        parts.append(_Batch(idx, lengths, features, batch.packed, batch.side))
    return parts


def _to_device(features: dict[str, Any], device: torch.device) -> dict[str, Any]:
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
    lock = _tokenizer_lock(model)
    chars = np.fromiter((len(t) for t in texts), dtype=np.int64, count=n)
    order = np.argsort(-chars, kind="stable")
    tokens = _Tokenised(model, texts, prompt, lock)
    planned = _planned_batches(tokens, order, chars, limits, pin=on_cuda)
    source: Iterator[_Batch] | _Prefetcher = _Prefetcher(planned) if prefetch and n > limits.texts else planned
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
                        work.extendleft(reversed(_split(batch, limits, tokens)))
                        continue
                    try:
                        emb = model(_to_device(batch.features, device))["sentence_embedding"]
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
                        work.extendleft(reversed(_split(batch, limits, tokens)))
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
        if isinstance(source, _Prefetcher):
            source.close()
    if stats is not None:
        for key, value in counts.items():
            stats[key] = stats.get(key, 0) + value
    elif counts["truncated"]:
        logger.warning(
            "%s: %d of %d texts reached max_length=%s tokens and were truncated", desc, counts["truncated"], n, limit
        )
    return out
