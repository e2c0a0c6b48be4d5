"""Frozen-teacher cache for Stage I: document-tower embeddings computed once, memory-mapped.

In Stage I the document tower (a 4B-8B LLM in the paper) is frozen, so its embedding of a text
never changes; recomputing it every step would make the LLM forward pass the cost of Stage I.
The cache encodes each distinct teacher text once into a float32 ``numpy.memmap`` on disk and the
loss reads rows by index, so memory stays flat however many texts there are and a second run (or
a resumed one) with the same document tower and texts reuses the file.

Files: ``<dir>/<key>.f32`` (rows, raw float32) and ``<dir>/<key>.json`` (shape, fingerprint). The
key hashes the document space fingerprint, the tower's max length and the texts, so a changed
tower or data set never reads a stale cache. The forward pass that encoded the rows (packed or padded,
compiled or eager: care_retriever.runtime.forward, decided as ``index`` decides it) is not part of the key: it
changes how the rows are computed, not what they are (packed = padded to cosine >= 0.9999, as a batch size or a
batch's neighbours change the last bits of a padded pass), so a cache written one way is reused the other way
rather than recomputed. The ``.json`` records the forward that wrote the rows, and a reuse logs it, so rows of
one path read under another are said, not silent. Files are written under a temporary name and renamed,
so a killed run leaves no half-written cache behind. Under torchrun the ranks share the encoding
(each its slice, then rank 0 assembles the file).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm.auto import tqdm

from care_retriever.training.tower_forward import describe, half_dtype

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

    from care_retriever.model.embedder import AsymmetricEmbedder

logger = logging.getLogger("care_retriever")


@dataclass
class TeacherCache:
    path: Path
    vectors: np.memmap
    reused: bool
    # how the document tower's forward pass ran when it wrote the rows (ForwardState.to_dict(); rank 0's under
    # torchrun); a reused cache's as recorded, None for a cache written before it was recorded
    forward: dict[str, Any] | None = None

    def __len__(self) -> int:
        return int(self.vectors.shape[0])


def cache_key(space_fingerprint: str, max_length: int, texts: list[str]) -> str:
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{space_fingerprint};{max_length};{len(texts)};".encode())
    for text in texts:
        digest.update(text.encode("utf-8"))
        digest.update(b"\x00")
    return digest.hexdigest()


def build_teacher_cache(
    embedder: AsymmetricEmbedder,
    texts: list[str],
    cache_dir: str | os.PathLike[str],
    *,
    batch_size: int = 64,
    show_progress: bool = True,
    dtype: Any = None,
    fingerprint: str | None = None,
    full_width: bool = False,
    forward: str = "auto",
    compile: str = "auto",
) -> TeacherCache:
    """Return the memory-mapped document-tower embeddings of ``texts`` (row i = text i).

    ``embedder`` is an :class:`~care_retriever.model.embedder.AsymmetricEmbedder`; its document tower
    must stay frozen for as long as the cache is used. ``dtype``: the training precision; bf16/fp16
    encode under autocast, as the frozen tower runs in training (the rows are stored in float32).

    Under torchrun every rank calls this: each encodes its share of the texts (every ``world``-th of
    them in length order, so the shares cost the same) into a part file; rank 0 assembles the cache
    from the parts; every rank then maps the finished file.

    ``full_width``: each row is the embedding normalised at the tower's native width, then sliced to the
    shared dim (norm below 1: the CARE authors' MSE target) instead of the model's renormalised slice.

    ``fingerprint``: the document space fingerprint of the tower as it is in memory, where the caller
    knows it (the runner computes it once per tower state: hashing a 4B tower's weights takes tens of
    seconds); None hashes the weights now.

    ``forward`` (auto | packed | padded) and ``compile`` (auto | on | off): the frozen tower's forward pass, set
    up for the encoding by :func:`care_retriever.runtime.forward.document_forward` (the index path's decision) and
    undone after it; logged once and returned as the cache's ``forward``.
    """
    from care_retriever.training.distributed import (
        PartWriter,
        barrier,
        my_share,
        rank,
        read_parts,
        remove_parts,
        world_size,
    )

    directory = Path(cache_dir)
    directory.mkdir(parents=True, exist_ok=True)
    max_length = int(embedder.document_model.max_seq_length or 0)
    fingerprint = fingerprint or _fingerprint(embedder)
    # The rows of a bf16/fp16 pass differ from fp32's by far more than batch or forward path change them, so the
    # precision is part of what the cache holds: a run in another precision encodes its own rows.
    space = fingerprint + (";full-width" if full_width else "") + f";{_precision(dtype)}"
    key = cache_key(space, max_length, texts)
    data, meta = directory / f"{key}.f32", directory / f"{key}.json"
    shape = (len(texts), embedder.dim)
    # Every rank looks before any rank can write: the parts are assembled only after a barrier all pass.
    if _complete(data, meta, shape):
        recorded = json.loads(meta.read_text("utf-8")).get("forward")
        recorded = recorded if isinstance(recorded, dict) else None
        written = describe(recorded) if recorded else "forward not recorded"
        logger.info("Stage I: reusing the teacher cache %s (%d texts, encoded %s)", data, shape[0], written)
        vectors = np.memmap(data, dtype=np.float32, mode="r", shape=shape)
        return TeacherCache(data, vectors, reused=True, forward=recorded)
    order = np.argsort([-len(t) for t in texts], kind="stable")
    mine = my_share(order)
    tmp = data.with_name(f".{data.name}.{os.getpid()}.tmp")
    # One process writes rows straight into the cache; several write their share into a part file each.
    part = PartWriter(directory, key, len(mine), shape[1]) if world_size() > 1 else None
    out = np.memmap(tmp, dtype=np.float32, mode="w+", shape=shape) if part is None else None
    model = _full_width_model(embedder) if full_width else embedder.document_model
    was_training = model.training
    from care_retriever.model.encoding import encode_texts
    from care_retriever.runtime.forward import document_forward

    with (
        document_forward(model, forward, compile, compute_dtype=half_dtype(dtype)) as state,
        tqdm(
            total=len(mine), desc="Stage I: caching teacher embeddings", unit="text", disable=not show_progress
        ) as bar,
        autocast(model.device, dtype),
    ):
        logger.info("Stage I: the teacher cache's document tower forward: %s", describe(state.to_dict()))
        for start in range(0, len(mine), 4096):
            idx = mine[start : start + 4096]
            rows = encode_texts(
                model, [texts[i] for i in idx], prompt=embedder.config.document_prompt, batch_size=batch_size
            )[:, : shape[1]]
            if out is not None:
                out[idx] = rows
            elif part is not None and part.rows is not None:
                part.rows[start : start + len(idx)] = rows
            bar.update(len(idx))
    model.train(was_training)
    if part is not None:
        part.close()
        barrier()
        if rank() == 0:
            out = read_parts(directory, key, order, np.memmap(tmp, dtype=np.float32, mode="w+", shape=shape))
    if rank() == 0:
        assert out is not None  # rank 0 wrote the rows itself, or assembled the parts above
        out.flush()
        del out
        os.replace(tmp, data)
        record = {"shape": list(shape), "space_fingerprint": fingerprint, "max_length": max_length}
        meta.write_text(json.dumps({**record, "forward": state.to_dict()}))
        remove_parts(directory, key)
    barrier()  # the cache is complete before any rank maps it
    vectors = np.memmap(data, dtype=np.float32, mode="r", shape=shape)
    return TeacherCache(data, vectors, reused=False, forward=state.to_dict())


def _complete(data: Path, meta: Path, shape: tuple[int, int]) -> bool:
    if not (data.is_file() and meta.is_file()):
        return False
    info = json.loads(meta.read_text("utf-8"))
    return tuple(info.get("shape", ())) == shape and data.stat().st_size == shape[0] * shape[1] * 4


def _precision(dtype: Any) -> str:
    """The precision the rows are computed in: the autocast dtype (bf16/fp16), else the tower's own (fp32)."""
    import torch

    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")


def autocast(device: Any, dtype: Any) -> contextlib.AbstractContextManager:
    """Autocast to ``dtype`` (bf16/fp16) on ``device``; nothing for fp32 or None."""
    import torch

    if dtype not in (torch.bfloat16, torch.float16):
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)


def _full_width_model(embedder: AsymmetricEmbedder) -> SentenceTransformer:
    """The document tower without its Matryoshka truncation: its modules up to pooling, then ``Normalize``."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling

    modules = []
    for module in embedder.tower("document").modules:
        modules.append(module)
        if isinstance(module, Pooling):
            break
    return SentenceTransformer(modules=[*modules, Normalize()], device=str(embedder.device))


def _fingerprint(embedder: AsymmetricEmbedder) -> str:
    """The document space as it is now in memory (a stage may have changed it since loading)."""
    return embedder.document_space(embedder.hash_document_weights())
