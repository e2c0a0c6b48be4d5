"""Frozen-teacher cache for Stage I: document-tower embeddings computed once, memory-mapped.

In Stage I the document tower (a 4B-8B LLM in the paper) is frozen, so its embedding of a text
never changes; recomputing it every step would make the LLM forward pass the cost of Stage I.
The cache encodes each distinct teacher text once into a float32 ``numpy.memmap`` on disk and the
loss reads rows by index, so memory stays flat however many texts there are and a second run (or
a resumed one) with the same document tower and texts reuses the file.

Files: ``<dir>/<key>.f32`` (rows, raw float32) and ``<dir>/<key>.json`` (shape, fingerprint). The
key hashes the document space fingerprint, the tower's max length and the texts, so a changed
tower or data set never reads a stale cache. Files are written under a temporary name and renamed,
so a killed run leaves no half-written cache behind.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

logger = logging.getLogger("care_retriever")


@dataclass
class TeacherCache:
    path: Path
    vectors: np.memmap
    reused: bool

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
    embedder,
    texts: list[str],
    cache_dir: str | os.PathLike[str],
    *,
    batch_size: int = 64,
    show_progress: bool = True,
) -> TeacherCache:
    """Return the memory-mapped document-tower embeddings of ``texts`` (row i = text i).

    ``embedder`` is an :class:`~care_retriever.embedder.AsymmetricEmbedder`; its document tower
    must stay frozen for as long as the cache is used.
    """
    directory = Path(cache_dir)
    directory.mkdir(parents=True, exist_ok=True)
    max_length = int(embedder.document_model.max_seq_length or 0)
    fingerprint = _fingerprint(embedder)
    key = cache_key(fingerprint, max_length, texts)
    data, meta = directory / f"{key}.f32", directory / f"{key}.json"
    shape = (len(texts), embedder.dim)
    if data.is_file() and meta.is_file():
        info = json.loads(meta.read_text("utf-8"))
        if tuple(info.get("shape", ())) == shape and data.stat().st_size == shape[0] * shape[1] * 4:
            logger.info("Stage I: reusing the teacher cache %s (%d texts)", data, shape[0])
            return TeacherCache(data, np.memmap(data, dtype=np.float32, mode="r", shape=shape), reused=True)
    tmp = data.with_name(f".{data.name}.{os.getpid()}.tmp")
    out = np.memmap(tmp, dtype=np.float32, mode="w+", shape=shape)
    model = embedder.document_model
    was_training = model.training
    order = np.argsort([-len(t) for t in texts], kind="stable")
    with tqdm(
        total=len(texts), desc="Stage I: caching teacher embeddings", unit="text", disable=not show_progress
    ) as bar:
        from care_retriever.encoding import encode_texts

        for start in range(0, len(texts), 4096):
            idx = order[start : start + 4096]
            out[idx] = encode_texts(model, [texts[i] for i in idx], batch_size=batch_size)
            bar.update(len(idx))
    model.train(was_training)
    out.flush()
    del out
    os.replace(tmp, data)
    meta.write_text(json.dumps({"shape": list(shape), "space_fingerprint": fingerprint, "max_length": max_length}))
    return TeacherCache(data, np.memmap(data, dtype=np.float32, mode="r", shape=shape), reused=False)


def _fingerprint(embedder) -> str:
    """The document space as it is now in memory (a stage may have changed it since loading)."""
    embedder.config.space_fingerprint = None  # recomputed from the current weights
    return embedder.space_fingerprint
