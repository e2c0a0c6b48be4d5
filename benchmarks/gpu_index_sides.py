"""The sides of ``benchmarks.gpu_index``: ``care-retriever index`` (the writer into FAISS, one forward pass of the
document tower per side) and sentence-transformers' ``encode_document`` (at the benchmark's batch, its defaults and
its best settings), each run once on a list of documents; the tokens each computes."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from benchmarks.gpu_index_tower import PeakMemory, sync


def token_lengths(model: Any, texts: list[str], prompt: str | None) -> list[int]:
    from care_retriever.runtime.features import sequence_lengths

    lengths: list[int] = []
    for start in range(0, len(texts), 1024):
        lengths += sequence_lengths(model.preprocess(texts[start : start + 1024], prompt=prompt)).tolist()
    return lengths


def st_padding(texts: list[str], lengths: list[int], batch_size: int) -> int:
    """Tokens sentence-transformers' batches compute: sorted by characters over the whole input, padded to each
    batch's longest (its own ``_inference``)."""
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    return sum(
        len(batch) * max(lengths[i] for i in batch)
        for batch in (order[s : s + batch_size] for s in range(0, len(order), batch_size))
    )


def tower_copy(embedder: Any) -> Any:
    """A model over a fresh copy of ``embedder``'s document tower: each side sets its own forward pass up (packed,
    compiled, FP8) on a tower of its own, from the same weights."""
    import copy
    import dataclasses

    tower = embedder.tower("document")
    return embedder.with_tower("document", dataclasses.replace(tower, modules=copy.deepcopy(list(tower.modules))))


def run_st(embedder: Any, texts: list[str], batch_size: int, device: str) -> dict[str, float]:
    model = embedder.document_model
    prompt = embedder.config.document_prompt
    kwargs = {"prompt": prompt} if prompt else {}
    with PeakMemory(device) as memory:
        sync(device)
        start = time.perf_counter()
        model.encode_document(texts, batch_size=batch_size, normalize_embeddings=True, **kwargs)
        sync(device)
        seconds = time.perf_counter() - start
    return {"seconds": seconds, "peak_bytes": memory.peak}


def run_index(
    embedder: Any, docs: list[Any], batch_size: int, device: str, folder: Path, **encode: Any
) -> dict[str, Any]:
    from care_retriever.indexing.config import EncodeConfig
    from care_retriever.indexing.writer import DocumentStoreWriter

    # the BM25 side is not encoding: off, as the module docstring says (the writer's default is on)
    config = EncodeConfig(batch_size=batch_size, **encode)
    writer = DocumentStoreWriter(embedder, f"faiss:{folder}", encode=config, show_progress=False, sparse=False)
    with PeakMemory(device) as memory:
        sync(device)
        report = writer.write(docs)
        sync(device)
    writer.store.close()
    return {
        "seconds": report.seconds,
        "peak_bytes": memory.peak,
        "tokens": report.tokens,
        "padded_tokens": report.padded_tokens,
        "max_batch_tokens": writer.limits.tokens,
    }


# The sides of a corpus's rows. `index` sides: the writer with these EncodeConfig fields (``forward``, ``compile``,
# ``dtype``), each on a copy of the tower; `auto` is the command's default. sentence-transformers' sides:
# ``encode_document`` at the benchmark's batch, at its own defaults (batch 32), and at the best a user could set (its
# ``compile(dynamic=True)`` and the largest batch that fits, from ``--st-best-batch`` down, halved on out-of-memory).
INDEX_SIDES: dict[str, dict[str, str]] = {
    "index": {},
    "index padded": {"forward": "padded", "compile": "off"},
    "index padded+compiled": {"forward": "padded", "compile": "on"},
    "index packed": {"forward": "packed", "compile": "off"},
    "index packed+compiled": {"forward": "packed", "compile": "on"},
    "index fp8": {"dtype": "fp8", "compile": "on"},
    # the model's own RMSNorm code where `index` fuses it (eager layers on CUDA): what the fused kernel gains
    "index own norms": {"norms": "eager"},
}
ST_SIDES = ("encode_document", "encode_document defaults", "encode_document best")
ST_DEFAULT_BATCH = 32


def cannot_run(label: str, device: str) -> str | None:
    """Why a side does not run on ``device``, or None."""
    from care_retriever.runtime.fp8 import fp8_refusal

    if "fp8" in label:
        return fp8_refusal(device)
    return None


def st_best(embedder: Any, texts: list[str], batch: int, device: str) -> tuple[Any, int, float]:
    """sentence-transformers at its best settings: its own compile and the largest batch that fits (from ``batch``,
    halved on out-of-memory); returns the model, the batch and the seconds of the first (compiling) call."""
    import torch

    from care_retriever.runtime.batch_sizing import OOM_ERRORS

    model = tower_copy(embedder)
    model.document_model.compile(dynamic=True)
    longest = sorted(texts, key=len)[-batch:]
    while True:
        try:
            start = time.perf_counter()
            run_st(model, longest, batch, device)  # the longest texts: the batch that fits them fits every batch
            return model, batch, time.perf_counter() - start
        except OOM_ERRORS:
            if batch <= 1:
                raise
            batch //= 2
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
