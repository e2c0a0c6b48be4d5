"""Large-index simulation: N synthetic unit vectors straight into the vector engines (no encoder).

    python -m benchmarks.large_index                       # 1M x 768, FAISS flat + HNSW + Qdrant local
    python -m benchmarks.large_index --n 100000 --backends flat,hnsw,ivfpq,qdrant

Measures, per engine: build time, memory (anonymous RSS added by the build: the vectors themselves sit
in a memory-mapped file, so only what the engine allocates is counted), single-query latency p50/p99,
batch throughput, and recall@10 against exact search. Each engine runs in its own process so that
memory is measured cleanly. Data: unit vectors around ``--clusters`` random centres (real embeddings
are clustered; uniform random high-dimensional vectors have no near neighbours and make any ANN index
look broken); queries are noisy copies of random database vectors. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

BACKENDS = ("flat", "hnsw", "ivfpq", "qdrant")


def rss_anon() -> int:
    """Anonymous resident memory of this process, bytes (file-backed pages of the memmap excluded)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("RssAnon not found in /proc/self/status (Linux only)")


def peak_rss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def generate(path: Path, n: int, dim: int, clusters: int, seed: int, block: int = 65536) -> None:
    """Write ``n`` clustered unit vectors to ``path`` (a .npy file) block by block (bounded memory)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, dim), dtype=np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, dim))
    for start in range(0, n, block):
        size = min(block, n - start)
        x = centres[rng.integers(0, clusters, size)] + 0.6 / np.sqrt(dim) * rng.standard_normal(
            (size, dim), dtype=np.float32
        )
        out[start : start + size] = x / np.linalg.norm(x, axis=1, keepdims=True)
    out.flush()
    del out


def make_queries(data: np.ndarray, count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed + 1)
    base = data[np.sort(rng.choice(len(data), count, replace=False))]
    q = base + 0.3 / np.sqrt(data.shape[1]) * rng.standard_normal(base.shape, dtype=np.float32)
    return (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)


def latency(search_one, queries: np.ndarray) -> tuple[float, float]:
    times = []
    for q in queries:
        t = time.perf_counter()
        search_one(q[None, :])
        times.append(time.perf_counter() - t)
    ms = np.asarray(times) * 1000
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def recall_at(found: np.ndarray, truth: np.ndarray, k: int) -> float:
    return float(np.mean([len(set(f[:k]) & set(t[:k])) / k for f, t in zip(found, truth, strict=True)]))


# ---------------------------------------------------------------------- engines
def run_faiss(kind: str, data: np.ndarray, queries: np.ndarray, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Build once; measure each search setting (``--ef-search`` / ``--nprobe`` lists) on the same index."""
    import faiss

    dim = data.shape[1]
    before = rss_anon()
    t = time.perf_counter()
    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
        params = None
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, args.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = args.ef_construction
    else:  # IVF-PQ: coarse quantiser + product-quantised residual codes (m bytes per vector)
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFPQ(quantizer, dim, args.nlist, args.pq_m, 8, faiss.METRIC_INNER_PRODUCT)
        sample = data[np.random.default_rng(0).choice(len(data), min(len(data), 64 * args.nlist), replace=False)]
        index.train(np.ascontiguousarray(sample))
        del sample  # not part of the index: keep it out of the memory figure
    for start in range(0, len(data), 100_000):
        index.add(np.ascontiguousarray(data[start : start + 100_000]))
    build = time.perf_counter() - t
    memory = rss_anon() - before

    if kind == "flat":
        variants: list[tuple[str, Any]] = [("exact", None)]
    elif kind == "hnsw":
        variants = [
            (f"M={args.hnsw_m} efC={args.ef_construction} efS={ef}", faiss.SearchParametersHNSW(efSearch=ef))
            for ef in _ints(args.ef_search)
        ]
    else:
        variants = [
            (f"nlist={args.nlist} m={args.pq_m}x8bit nprobe={n}", faiss.SearchParametersIVF(nprobe=n))
            for n in _ints(args.nprobe)
        ]
    results = []
    for settings, params in variants:

        def search(q: np.ndarray, k: int = args.k, params: Any = params) -> np.ndarray:
            return index.search(q, k, params=params)[1] if params is not None else index.search(q, k)[1]

        p50, p99 = latency(search, queries[: args.latency_queries])
        t = time.perf_counter()
        found = search(queries)
        qps = len(queries) / (time.perf_counter() - t)
        results.append(
            {
                "build_s": build,
                "memory_bytes": memory,
                "p50_ms": p50,
                "p99_ms": p99,
                "batch_qps": qps,
                "found": found.tolist(),
                "settings": settings,
            }
        )
    return results


def _ints(text: str) -> list[int]:
    return [int(x) for x in str(text).split(",") if x.strip()]


def run_qdrant(data: np.ndarray, queries: np.ndarray, args: argparse.Namespace) -> list[dict[str, Any]]:
    import warnings

    from qdrant_client import QdrantClient, models

    warnings.filterwarnings("ignore", message=".*Local mode is not recommended.*")
    before = rss_anon()
    t = time.perf_counter()
    client = QdrantClient(location=":memory:")
    client.create_collection(
        "bench", vectors_config=models.VectorParams(size=data.shape[1], distance=models.Distance.COSINE)
    )
    step = 5_000  # the client takes Python lists: keep the transient list small
    for start in range(0, len(data), step):
        block = np.ascontiguousarray(data[start : start + step])
        client.upsert(
            "bench", models.Batch(ids=list(range(start, start + len(block))), vectors=block.tolist()), wait=True
        )
    build = time.perf_counter() - t
    memory = rss_anon() - before

    def search(q: np.ndarray, k: int = args.k) -> list[list[int]]:
        requests = [models.QueryRequest(query=v.tolist(), limit=k) for v in q]
        return [[p.id for p in r.points] for r in client.query_batch_points("bench", requests)]

    # Local mode scans every vector in numpy per query: time only --qdrant-queries of them.
    subset = queries[: args.qdrant_queries]
    p50, p99 = latency(search, subset[: args.latency_queries])
    t = time.perf_counter()
    found = search(subset)
    qps = len(subset) / (time.perf_counter() - t)
    return [
        {
            "build_s": build,
            "memory_bytes": memory,
            "p50_ms": p50,
            "p99_ms": p99,
            "batch_qps": qps,
            "found": found,
            "settings": f"local mode (:memory:), exact numpy scan, {len(subset)} queries",
        }
    ]


# ---------------------------------------------------------------------- driver
def worker(args: argparse.Namespace) -> None:
    data = np.load(args.data, mmap_mode="r")
    queries = make_queries(data, args.queries, args.seed)
    if args.threads:
        import faiss

        faiss.omp_set_num_threads(args.threads)
    if args.worker == "qdrant":
        results = run_qdrant(data, queries, args)
    else:
        results = run_faiss(args.worker, data, queries, args)
    for result in results:
        result["peak_rss_bytes"] = peak_rss()
    Path(args.result).write_text(json.dumps(results))


def estimate_bytes(kind: str, n: int, dim: int, args: argparse.Namespace) -> float:
    """What the data structures need by construction, for comparison with the measured memory."""
    if kind in ("flat", "qdrant"):
        return n * dim * 4
    if kind == "hnsw":  # vectors + level-0 links (2M ids) + upper levels (M ids on ~1/(M-1) of nodes) + offsets
        m = args.hnsw_m
        return n * (dim * 4 + 2 * m * 4 + m * 4 / (m - 1) + 8 + 4)
    return n * (args.pq_m + 8) + args.nlist * dim * 4  # IVF-PQ: codes + ids + centroids


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="vectors in the index")
    parser.add_argument("--dim", type=int, default=768, help="width (CARE: the query tower's, 768 in the paper)")
    parser.add_argument("--queries", type=int, default=200, help="queries for recall and batch throughput")
    parser.add_argument("--latency-queries", type=int, default=100, help="queries timed one at a time")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--backends", default="flat,hnsw,qdrant", help=f"comma list of {','.join(BACKENDS)}")
    parser.add_argument("--clusters", type=int, default=2000)
    parser.add_argument("--hnsw-m", type=int, default=32)
    parser.add_argument("--ef-construction", type=int, default=40)
    parser.add_argument("--ef-search", default="128", help="HNSW efSearch; a comma list measures each")
    parser.add_argument("--nlist", type=int, default=4096)
    parser.add_argument("--pq-m", type=int, default=96, help="IVF-PQ bytes per vector (divides --dim)")
    parser.add_argument("--nprobe", default="64", help="IVF nprobe; a comma list measures each")
    parser.add_argument("--qdrant-queries", type=int, default=50, help="queries for Qdrant local (slow scans)")
    parser.add_argument("--threads", type=int, default=0, help="FAISS OpenMP threads (0: all cores)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--workdir", type=Path, help="where the vector file goes (default: a temp folder)")
    parser.add_argument("--worker", choices=BACKENDS, help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = sorted(set(backends) - set(BACKENDS))
    if unknown or args.n < args.queries or args.n < 1:
        parser.error(f"unknown backends {unknown}" if unknown else "--n must be >= --queries")
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        data_path = Path(tmp) / "vectors.npy"
        t = time.perf_counter()
        generate(data_path, args.n, args.dim, args.clusters, args.seed)
        print(f"generated {args.n:,} x {args.dim} unit vectors in {time.perf_counter() - t:.1f}s", file=sys.stderr)
        data = np.load(data_path, mmap_mode="r")
        queries = make_queries(data, args.queries, args.seed)
        truth = exact_neighbours(data, queries, args.k)
        del data
        rows = []
        for backend in backends:
            result_path = Path(tmp) / f"{backend}.json"
            cmd = [
                sys.executable,
                __file__,
                "--worker",
                backend,
                "--data",
                str(data_path),
                "--result",
                str(result_path),
                *_forward(args),
            ]
            print(f"running {backend} ...", file=sys.stderr)
            # Passive OpenMP waiting: spinning threads on a busy (shared) machine distort every latency.
            env = {"OMP_WAIT_POLICY": "PASSIVE", **os.environ, "PYTHONWARNINGS": "ignore"}
            done = subprocess.run(cmd, env=env)
            if done.returncode != 0:
                print(f"{backend}: failed (exit {done.returncode})", file=sys.stderr)
                continue
            for result in json.loads(result_path.read_text()):
                found = np.asarray(result.pop("found"))
                result["recall_at_k"] = recall_at(found, truth[: len(found)], args.k)
                result["backend"] = backend
                result["estimate_bytes"] = estimate_bytes(backend, args.n, args.dim, args)
                rows.append(result)
                print(f"{backend}: {_row(result, args)}", file=sys.stderr)
    print(table(rows, args))
    if args.json:
        args.json.write_text(json.dumps({"n": args.n, "dim": args.dim, "results": rows}, indent=2))
    return 0


def exact_neighbours(data: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """Ground truth by blocked exact inner product (bounded memory)."""
    best_s = np.full((len(queries), k), -np.inf, dtype=np.float32)
    best_i = np.zeros((len(queries), k), dtype=np.int64)
    for start in range(0, len(data), 200_000):
        scores = queries @ np.asarray(data[start : start + 200_000]).T
        top = np.argpartition(-scores, min(k, scores.shape[1] - 1), axis=1)[:, :k]
        cand_s = np.concatenate([best_s, np.take_along_axis(scores, top, axis=1)], axis=1)
        cand_i = np.concatenate([best_i, top + start], axis=1)
        order = np.argsort(-cand_s, axis=1, kind="stable")[:, :k]
        best_s, best_i = np.take_along_axis(cand_s, order, axis=1), np.take_along_axis(cand_i, order, axis=1)
    return best_i


def _forward(args: argparse.Namespace) -> list[str]:
    keys = (
        "queries",
        "latency_queries",
        "k",
        "hnsw_m",
        "ef_construction",
        "ef_search",
        "nlist",
        "pq_m",
        "nprobe",
        "threads",
        "seed",
        "qdrant_queries",
    )
    return [x for key in keys for x in (f"--{key.replace('_', '-')}", str(getattr(args, key)))]


def _row(r: dict[str, Any], args: argparse.Namespace) -> str:
    return (
        f"build {r['build_s']:.1f}s, memory {r['memory_bytes'] / 2**20:,.0f} MiB "
        f"(estimate {r['estimate_bytes'] / 2**20:,.0f}), p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, "
        f"{_qps(r['batch_qps'])} q/s batched, recall@{args.k} {r['recall_at_k']:.3f}"
    )


def _qps(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 else f"{value:.2g}"


def table(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    head = (
        f"| engine | settings | build (s) | memory (MiB) | by construction (MiB) | p50 (ms) | p99 (ms) "
        f"| batch q/s | recall@{args.k} |"
    )
    lines = [
        f"{args.n:,} vectors x {args.dim} dims, {args.queries} queries ({args.latency_queries} timed singly), "
        f"{os.cpu_count()} CPU cores",
        "",
        head,
        "|" + "---|" * 9,
    ]
    for r in rows:
        lines.append(
            f"| {r['backend']} | {r['settings']} | {r['build_s']:.1f} | {r['memory_bytes'] / 2**20:,.0f} "
            f"| {r['estimate_bytes'] / 2**20:,.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} "
            f"| {_qps(r['batch_qps'])} | {r['recall_at_k']:.3f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
