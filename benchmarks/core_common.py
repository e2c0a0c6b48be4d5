"""Shared pieces of the core speed and memory benchmarks: the base-preset model, texts, tables.

The ``base`` preset has the paper's shapes (a ~305M BERT query tower, a Qwen3-0.6B-shaped decoder
document tower) with random weights: right for speed and memory, meaningless for accuracy. It is
built once (``care-retriever init --preset base``) into ``$CARE_BENCH_CACHE`` (default
``/tmp/care-bench``) and reused by every script.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "care_retriever" / "data" / "sample"
CACHE = Path(os.environ.get("CARE_BENCH_CACHE", "/tmp/care-bench"))
CLI = [sys.executable, "-m", "care_retriever.cli.main"]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def model_dir(preset: str = "base") -> Path:
    """A saved random model of ``preset`` (built on first use with the project's own ``init``)."""
    out = CACHE / f"{preset}-model"
    if not (out / "care_config.json").is_file():
        CACHE.mkdir(parents=True, exist_ok=True)
        print(f"building a random '{preset}' model in {out} (once) ...", file=sys.stderr, flush=True)
        subprocess.run(
            [
                *CLI,
                "init",
                str(out),
                "--preset",
                preset,
                "--vocab-from",
                str(SAMPLE / "corpus.jsonl"),
                "--force",
            ],
            check=True,
        )
    return out


def sample_queries(n: int) -> list[str]:
    import json

    texts = [json.loads(line)["text"] for line in (SAMPLE / "queries.jsonl").open(encoding="utf-8") if line.strip()]
    return [texts[i % len(texts)] for i in range(n)]


def sample_documents(n: int) -> list:
    from care_retriever.indexing.corpus import read_corpus

    docs = []
    for doc in read_corpus(SAMPLE / "corpus.jsonl"):
        docs.append(doc)
        if len(docs) == n:
            break
    return docs


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table (also readable as plain text in a terminal)."""

    def cell(v: object) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def machine_line() -> str:
    from care_retriever.evaluation.benchmark import hardware

    hw = hardware()
    load = f", load average {hw['load_average_1m']}" if "load_average_1m" in hw else ""
    return (
        f"{hw['processor']}, {hw['cpu_count']} CPUs, {hw['torch_threads']} torch threads, torch {hw['torch']}"
        f"{load}, {time.strftime('%Y-%m-%d %H:%M')}"
    )
