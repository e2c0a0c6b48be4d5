"""Which compressed codes the large profile keeps in RAM: how often the exact top 10 of a query are among the best
K candidates of IVF + PQ codes (what rescoring K candidates from ``vectors.f32`` then recovers), at 10M x 768.

    nohup flock /work/heavy.lock python -m benchmarks.large_codes --work /work/runs/pqexp --n 10000000 &

Data and queries: :mod:`benchmarks.store_10m`'s (generated chunk by chunk; the exact top 10 by streaming every
chunk, kept as ``truth.npy`` under ``--work`` and reused). One coarse quantizer (k-means of ``nlist`` lists, trained
on the first ``train_size`` rows as the store trains) is shared by every kind of code, so only the codes differ;
each chunk is assigned to its lists once. Searches visit ``nprobe`` lists (the profile's 16) from one thread.
Prints the table (and with ``--json`` one JSON line); the result is kept in
benchmarks/results/store_10m/codes-NxDIM.json and the table written into benchmarks/results/scale.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from benchmarks.marked_sections import write_marked
from benchmarks.store_10m import CHUNK, Chunks, chunks, phase_truth

RESULTS = Path(__file__).resolve().parent / "results" / "store_10m"
DOC = Path(__file__).resolve().parent / "results" / "scale.md"
CANDIDATES = (100, 200, 300, 500, 1000, 2000)
# (name, sub-quantizers a vector, bits each, fast scan): a byte per 8 dims, a byte per 4, and 4-bit codes of
# 2 dims each scanned with SIMD (the same bytes as a byte per 4)
KINDS = (("pq96x8", 96, 8, False), ("pq192x8", 192, 8, False), ("pq384x4fs", 384, 4, True))


def build(n: int, dim: int, nlist: int, train_size: int) -> dict[str, faiss.IndexIVF]:
    generate = Chunks(n, dim)
    sample = generate(0)[:train_size].copy()
    kmeans = faiss.Kmeans(dim, nlist, niter=20, seed=1)
    kmeans.train(sample)
    quantizer = faiss.IndexFlatIP(dim)
    quantizer.add(kmeans.centroids)
    ip = faiss.METRIC_INNER_PRODUCT
    indexes: dict[str, faiss.IndexIVF] = {}
    for name, m, bits, fast in KINDS:
        kind = faiss.IndexIVFPQFastScan if fast else faiss.IndexIVFPQ
        indexes[name] = kind(quantizer, dim, nlist, m, bits, ip)
        indexes[name].train(sample)  # the codebooks: the shared quantizer is trained already
    for c in chunks(n):
        x = generate(c)
        ids = np.arange(c * CHUNK, c * CHUNK + len(x), dtype=np.int64)
        _, assigned = quantizer.search(x, 1)
        assigned = np.ascontiguousarray(assigned.ravel())  # kept alive: swig_ptr holds no reference
        for name, _m, _bits, fast in KINDS:
            if fast:  # fast-scan lists pack codes in blocks: added through their own path
                indexes[name].add_with_ids(x, ids)
            else:
                index = indexes[name]
                index.add_core(len(x), faiss.swig_ptr(x), faiss.swig_ptr(ids), faiss.swig_ptr(assigned))
    return indexes


def measure(index: faiss.IndexIVF, queries: np.ndarray, truth: np.ndarray, nprobe: int) -> dict[str, Any]:
    index.nprobe = nprobe
    out = {}
    for k in CANDIDATES:
        started = time.perf_counter()
        _, found = index.search(queries, k)
        seconds = time.perf_counter() - started
        held = [len(set(f.tolist()) & set(t.tolist())) / truth.shape[1] for f, t in zip(found, truth, strict=True)]
        out[str(k)] = {"recall": float(np.mean(held)), "ms_per_query_1thread": 1000 * seconds / len(queries)}
    return out


def table(result: dict[str, Any]) -> str:
    lines = [
        f"Measured on {result['cores']} CPU cores (shared, load {result['load'][0]:.1f} to {result['load'][1]:.1f}) "
        f"by `{result['command']}`, {result['date']}: {result['n']:,} x {result['dim']}, {result['queries']} "
        f"queries, nlist {result['nlist']}, nprobe {result['nprobe']}."
        + (f" {result['note']}" if "note" in result else ""),
        "",
        "| codes | bytes a vector | " + " | ".join(f"exact top 10 among best {k}" for k in CANDIDATES) + " |",
        "|---|---|" + "---|" * len(CANDIDATES),
    ]
    for name, m, bits, _fast in KINDS:
        cells = [f"{r['recall']:.3f} ({r['ms_per_query_1thread']:.1f} ms)" for r in result["kinds"][name].values()]
        lines.append(f"| {name} | {m * bits // 8} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("(ms: one thread's search time a query for that many candidates, codes only, before rescoring)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True, help="queries and exact neighbours (outside the repo)")
    parser.add_argument("--n", type=int, default=10_000_000)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--nlist", type=int, default=2048)
    parser.add_argument("--nprobe", type=int, default=16)
    parser.add_argument("--train-size", type=int, default=81_920)
    parser.add_argument("--json", action="store_true", help="also print one JSON line")
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0]
    if not (args.work / "truth.npy").is_file():
        phase_truth(args.work, args.n, args.dim, 10)
    queries, truth = np.load(args.work / "queries.npy"), np.load(args.work / "truth.npy")
    indexes = build(args.n, args.dim, args.nlist, args.train_size)
    faiss.omp_set_num_threads(1)
    result: dict[str, Any] = {
        "n": args.n,
        "dim": args.dim,
        "nlist": args.nlist,
        "nprobe": args.nprobe,
        "queries": len(queries),
        "cores": os.cpu_count(),
        "kinds": {name: measure(index, queries, truth, args.nprobe) for name, index in indexes.items()},
        "load": [load, os.getloadavg()[0]],
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m benchmarks.large_codes " + shlex.join(argv if argv is not None else sys.argv[1:]),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"codes-{args.n}x{args.dim}.json").write_text(json.dumps(result, indent=1) + "\n")
    text = table(result)
    if not args.no_write:
        write_marked(DOC, "large_codes", text, add=True, after="store_10m")
    print(text)
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
