"""The settings ``benchmarks.quantization`` compares and how a FAISS store of each is configured: shared by its
synthetic part (:mod:`benchmarks.quantization_synthetic`) and its dev-task part (:mod:`benchmarks.quantization_tasks`),
so that both measure the same stores.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from care_retriever.stores.config import FaissIndexConfig, IndexType, Quantize

REPO = Path(__file__).resolve().parents[1]

SETTINGS = ("none", "sq8", "binary", "pq")
TASKS = ("kuake-qtr-retrieval", "im-qa-retrieval")
CHUNK = 100_000  # documents upserted at a time


def store_options(setting: str, args: argparse.Namespace, dim: int) -> FaissIndexConfig:
    # PQ at 8 dimensions a byte unless --pq-m says otherwise: the store's default 96 bytes at 768 dims, and the
    # same 1/32 of float32 for a smaller model (96 does not divide 32 or 256).
    return FaissIndexConfig(
        index_type=IndexType.FLAT,
        pq_m=args.pq_m or max(1, dim // 8),
        quantize=None if setting == "none" else Quantize(setting),
    )
