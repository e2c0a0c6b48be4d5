"""Does ``torch.compile`` of the query tower speed up the CPU query path? Eager vs compiled, side by side.

One run, one process, the same query tower loaded twice through the project's torch backend
(``load_query_embedder(model, "torch")``): one as loaded, one with each encoder layer's ``forward`` compiled
(``torch.compile(..., dynamic=True)``, as the document tower's layers are). Optionally the ONNX Runtime int8
export beside them (``--onnx``), the CPU path the product already offers for query latency. Every call is
``CareRetriever.search`` (top 10) over a small FAISS store, the variants taking turns query by query, so load
from other processes hits all alike. Reported: compile seconds (warm-up passes of several query lengths, timed
on their own), batch-1 p50 / p99, batch-32 queries/s, and the compiled vectors' cosine to the eager ones.

Usage: ``nice python -m benchmarks.query_compile [--preset base] [--queries 200] [--onnx]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.core_common import machine_line, model_dir, table
from benchmarks.core_memory import build_store
from benchmarks.query_backends import (
    ensure_exports,
    export_variants,
    interleaved,
    load_line,
    percentile,
    realistic_queries,
)


def encoder_layers(embedder: Any) -> list[Any]:
    """The transformer layers of the query tower's transformers model (BERT's ``encoder.layer`` or ``layers``)."""
    import torch

    hf = embedder.query_model[0].auto_model
    for owner, name in (
        (getattr(hf, "encoder", None), "layer"),
        (hf, "layers"),
        (getattr(hf, "model", None), "layers"),
    ):
        layers = getattr(owner, name, None)
        if isinstance(layers, torch.nn.ModuleList):
            return list(layers)
    raise SystemExit(f"no encoder layers found in {type(hf).__name__}")


def compile_query_tower(embedder: Any, queries: list[str]) -> float:
    """Compile the layers and run warm-up searches of several lengths and batch sizes; the seconds it took."""
    import torch

    for layer in encoder_layers(embedder):
        layer.forward = torch.compile(layer.forward, dynamic=True)
    start = time.perf_counter()
    by_length = sorted(set(queries), key=len)
    for texts in ([by_length[0]], [by_length[-1]], [by_length[len(by_length) // 2]], by_length[:32], by_length[-3:]):
        embedder.embed_queries(texts)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="base")
    parser.add_argument("--queries", type=int, default=200, help="batch-1 queries per variant")
    parser.add_argument("--batch-rounds", type=int, default=10, help="batch-32 searches per variant")
    parser.add_argument("--onnx", action="store_true", help="add the ONNX int8 export (exported where missing)")
    args = parser.parse_args()

    import numpy as np

    from care_retriever.search.backends import load_query_embedder
    from care_retriever.search.retriever import CareRetriever

    model = model_dir(args.preset)
    if args.onnx and "onnx int8" not in export_variants(model):
        ensure_exports(model)
    queries, source = realistic_queries(args.queries)
    load_before = load_line()
    with tempfile.TemporaryDirectory(prefix="care-qc-store-") as tmp:
        store = build_store(model, Path(tmp), 8)
        eager = load_query_embedder(model, "torch", device="cpu")
        compiled = load_query_embedder(model, "torch", device="cpu")
        compile_seconds = compile_query_tower(compiled, queries)
        print(f"compile (warm-up passes): {compile_seconds:.1f} s", flush=True)
        embedders: dict[str, Any] = {"torch fp32, eager": eager, "torch fp32, compiled": compiled}
        if args.onnx:
            for name, (backend, option) in export_variants(model).items():
                if name == "onnx int8":
                    embedders[name] = load_query_embedder(model, backend, **option)
        sample = sorted(set(queries), key=len)[:64]
        vectors = {name: e.embed_queries(sample) for name, e in embedders.items()}
        cosine = float(np.min(np.sum(vectors["torch fp32, eager"] * vectors["torch fp32, compiled"], axis=1)))
        retrievers = {name: CareRetriever(store, e) for name, e in embedders.items()}
        for r in retrievers.values():  # first calls pay one-off allocations
            for q in queries[:5]:
                r.search(q, top_k=10)
        singles: dict[str, list[float]] = {n: [] for n in retrievers}
        for q in queries:
            for n, t in interleaved(
                {n: (lambda r=r, q=q: r.search(q, top_k=10)) for n, r in retrievers.items()}, 1
            ).items():
                singles[n] += t
        batch_times: dict[str, list[float]] = {n: [] for n in retrievers}
        for i in range(args.batch_rounds):
            batch = (queries[(i * 32) % len(queries) :] + queries)[:32]
            for n, t in interleaved(
                {n: (lambda r=r, b=batch: r.search(b, top_k=10)) for n, r in retrievers.items()}, 1
            ).items():
                batch_times[n] += t
        for r in retrievers.values():
            r.close()
    base = statistics.median(singles["torch fp32, eager"])
    rows = [
        [
            name,
            f"{statistics.median(singles[name]) * 1e3:.2f}",
            f"{percentile(singles[name], 0.99) * 1e3:.2f}",
            f"{statistics.median(singles[name]) / base:.3f}",
            f"{32 / statistics.median(batch_times[name]):.1f}",
            f"{compile_seconds:.1f}" if name.endswith("compiled") else "0",
        ]
        for name in retrievers
    ]
    print(
        f"Query tower compile, `{args.preset}` preset, {len(queries)} queries from {source}; "
        f"load average {load_before} before, {load_line()} after; {machine_line()}"
    )
    headers = ["query tower", "batch-1 p50 ms", "batch-1 p99 ms", "p50 ratio to eager", "batch-32 q/s", "compile s"]
    print(table(headers, rows))
    print(f"compiled vs eager vectors: min cosine {cosine:.7f} over {len(sample)} queries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
