"""Texts tokenised ahead of the forward passes and collated into them: a group at a time by the tower's own
``preprocess`` (or its Rust tokenizer called directly, once it gave the tower's own ids), kept unpadded per text
(:class:`TokenisedTexts`), sorted by their token counts and cut into passes within the limits
(:func:`planned_passes`), and a pass cut again after an out-of-memory error (:func:`split_pass`)."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from sentence_transformers import SentenceTransformer

from care_retriever.runtime.batch_limits import BatchLimits
from care_retriever.runtime.batch_sizing import Batches, batch_cost
from care_retriever.runtime.features import sequence_lengths, tokenizer_lock
from care_retriever.runtime.packed import is_packed, pack_features


@dataclass
class PassInput:
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
_CACHE_GUARD = threading.Lock()


def fast_verdict(model: SentenceTransformer, prompt: str | None) -> bool | None:
    """Whether ``model``'s Rust tokenizer, called directly, gave the tower's own ids for texts under ``prompt``
    (None: not checked yet)."""
    with _CACHE_GUARD:
        return _FAST_VERDICTS.get(model, {}).get(prompt)


def plain_backend(model: SentenceTransformer) -> Any:
    """A copy of the tower's Rust tokenizer without padding or truncation, made once per tower and never changed
    (the tokenizer's own keeps whatever padding and truncation its last call set)."""
    lock = tokenizer_lock(model)
    with _CACHE_GUARD:
        if model not in _BACKENDS:
            backend = getattr(getattr(model, "tokenizer", None), "_tokenizer", None)
            copy = None
            if backend is not None and hasattr(backend, "to_str"):
                with lock:
                    copy = type(backend).from_str(backend.to_str())
                copy.no_padding()
                copy.no_truncation()
            _BACKENDS[model] = copy
        return _BACKENDS[model]


class TokenisedTexts:
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
        with _CACHE_GUARD:
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
            self._backend = plain_backend(self.model)
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
            with _CACHE_GUARD:
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

    def collate(self, idx: np.ndarray, lengths: np.ndarray, pin: bool) -> PassInput:
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
        return PassInput(idx, lengths, features, self.packed, self.side)


# Texts tokenised at once ahead of the forward passes (a group's padded ids are held together): at most this many
# texts or characters.
GROUP_TEXTS = 2048
GROUP_CHARS = 1 << 18


def planned_passes(
    tokens: TokenisedTexts, order: np.ndarray, chars: np.ndarray, limits: BatchLimits, pin: bool
) -> Iterator[PassInput]:
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


def split_pass(batch: PassInput, limits: BatchLimits, tokens: TokenisedTexts) -> list[PassInput]:
    """``batch`` cut into consecutive parts within ``limits`` (after an out-of-memory error lowered them)."""
    parts = []
    for cut in Batches(np.arange(len(batch.idx)), batch.lengths, limits, packed=batch.packed):
        idx, lengths = batch.idx[cut], batch.lengths[cut]
        if batch.packed or not tokens.regroup:  # not padded rows: tokenised again
            parts.append(PassInput(idx, lengths, tokens.batch_features(idx), batch.packed, batch.side))
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
        parts.append(PassInput(idx, lengths, features, batch.packed, batch.side))
    return parts
