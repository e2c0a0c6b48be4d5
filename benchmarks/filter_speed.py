"""How fast and how exact are filtered searches run inside each engine, against the widening post-filter they replace?
N synthetic unit vectors with a ``bucket`` field; range filters matching 50%, 25%, 5%, 0.5% and 0.05% of the
documents (25%: a graph search on Edge, whose full scan covers up to 10 MB of vectors); FAISS flat / HNSW / sq8 /
IVF and Qdrant Edge HNSW / int8 through the product's stores. For each: the plan a FAISS store chose
(:mod:`care_retriever.stores.faiss.filter_plan`), queries/s (one query a call) and recall@10 against
exact filtered search (numpy over the matching rows); beside it the widening path (search 10 unfiltered, keep the
hits whose metadata match, widen x4 until 10 match or the store is exhausted). The first filtered search on the
field builds its index (FAISS: a temp SQLite index per field, read by a selective filter); it is timed apart, as
``first_filter_s``.

The vectors are clustered like real embeddings (:func:`benchmarks.large_index.generate`: unit vectors around
``--clusters`` random centres) and the queries are noisy copies of stored rows (:func:`~benchmarks.large_index.
make_queries`): uniform random vectors have no near neighbours, and on them any ANN index looks broken. A row's
``bucket`` is its number modulo 20,000, independent of its cluster, so every filter keeps the same share of each
cluster.

    python -m benchmarks.filter_speed --n 100000 [--json] [--workdir DIR] [--engines "faiss flat,edge hnsw"]
    python -m benchmarks.filter_speed --report DIR/results.jsonl   # rewrite docs/filters.md's measured table

With ``--workdir`` each engine's store is kept in ``DIR/n{N}-d{dim}-c{clusters}/`` and reused by later runs (a
store that does not hold N documents is rebuilt), and every measured row is appended to ``DIR/results.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.large_index import generate, make_queries
from benchmarks.marked_sections import write_marked
from care_retriever.documents import Document
from care_retriever.stores import open_store
from care_retriever.stores.base import Hit, VectorStore
from care_retriever.stores.config import FaissIndexConfig, QdrantCollectionConfig
from care_retriever.stores.filter_matching import matches
from care_retriever.stores.filters import parse_filters

BUCKETS = 20_000
SELECTIVITIES = (0.5, 0.25, 0.05, 0.005, 0.0005)
TOP_K = 10
DOC = Path(__file__).resolve().parents[1] / "docs" / "filters.md"
ENGINES: dict[str, tuple[str, Any]] = {
    "faiss flat": ("faiss", FaissIndexConfig()),
    "faiss hnsw": ("faiss", FaissIndexConfig(index_type="hnsw")),
    "faiss sq8": ("faiss", FaissIndexConfig(quantize="sq8")),
    "faiss ivf": ("faiss", FaissIndexConfig(index_type="ivf")),
    "edge hnsw": ("qdrant", QdrantCollectionConfig()),
    "edge int8": ("qdrant", QdrantCollectionConfig(quantize="sq8")),
}


def clustered(n: int, dim: int, clusters: int, queries: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` stored unit vectors around ``clusters`` centres and ``queries`` noisy copies of stored rows."""
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp) / "vectors.npy", n, dim, clusters, seed=0)
        vectors = np.load(Path(tmp) / "vectors.npy")
    return vectors, make_queries(vectors, queries, seed=0)


def _build(kind: str, config: Any, folder: Path, vectors: np.ndarray) -> VectorStore:
    store = open_store(f"{kind}:{folder}")
    store.prepare(vectors.shape[1], "synthetic", "synthetic", config)
    for start in range(0, len(vectors), 5000):
        rows = range(start, min(start + 5000, len(vectors)))
        store.upsert(
            [Document(f"d{i}", "x", metadata={"bucket": i % BUCKETS}) for i in rows], vectors[rows[0] : rows[-1] + 1]
        )
    store.finalize()
    return store


def _reused_or_built(kind: str, config: Any, folder: Path, vectors: np.ndarray) -> tuple[VectorStore, float | None]:
    """The store kept in ``folder`` if it holds every vector (build time None), else one built there now, then
    opened again (searched as a reader opens it)."""
    if folder.exists():
        try:
            store = open_store(f"{kind}:{folder}")
            if store.count() == len(vectors):
                return store, None
            store.close()
        except Exception as exc:  # a build killed part way: rebuilt below
            print(f"{folder}: rebuilding ({exc})", file=sys.stderr)
        shutil.rmtree(folder)
    start = time.perf_counter()
    _build(kind, config, folder, vectors).close()
    built = time.perf_counter() - start
    return open_store(f"{kind}:{folder}"), built  # searched as a reader opens it


def _widening(store: VectorStore, query: np.ndarray, filters: dict[str, Any], total: int) -> list[Hit]:
    node, k = parse_filters(filters), TOP_K
    while True:
        hits = store.search(query, k)[0]
        kept = [h for h in hits if matches(node, h.metadata)]
        if len(kept) >= TOP_K or len(hits) < k or k >= total:
            return kept[:TOP_K]
        k = min(total, k * 4)


def _plan(store: VectorStore, filters: dict[str, Any]) -> str:
    """The plan a FAISS store chose for ``filters`` (:mod:`care_retriever.stores.faiss.filter_plan`); Qdrant
    plans inside the engine: ''."""
    plan = getattr(store, "filter_plan", None)
    return "" if plan is None else plan(filters, TOP_K).value


def _measure(
    search: Callable[[np.ndarray], list[Hit]], queries: np.ndarray, truth: list[set[str]], budget: float
) -> dict[str, float]:
    found, done, start = 0, 0, time.perf_counter()
    for query, want in zip(queries, truth, strict=True):
        hits = search(query[None, :])
        found += len({h.id for h in hits} & want)
        done += 1
        if time.perf_counter() - start > budget:
            break
    elapsed = time.perf_counter() - start
    wanted = sum(len(t) for t in truth[:done])
    return {"qps": done / elapsed, "recall": found / wanted if wanted else 1.0, "queries": done}


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        info = Path("/proc/cpuinfo").read_text("utf-8").splitlines()
        names = [line.split(":", 1)[1].strip() for line in info if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {cpu}"


def _table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| engine | matching | plan | in-engine q/s | recall@10 | widening q/s | widening recall@10 | first filter s "
        "| load |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['engine']} | {r['selectivity']:.2%} ({r['matching']}) | {r.get('plan', '')} | {r['qps']} | "
            f"{r['recall']} | "
            f"{r['widening_qps']} | {r['widening_recall']} | {r.get('first_filter_s', '')} | {r.get('load', '')} |"
        )
    return "\n".join(lines)


def _data(row: dict[str, Any]) -> str:
    """The data a row was measured on (rows written before the data was clustered hold no ``data`` entry)."""
    return row.get("data", "uniform random unit vectors (no near neighbours: an ANN index's recall is low on them)")


def _section(n: int, rows: list[dict[str, Any]]) -> str:
    """One N's table (the latest row of each engine and selectivity) and the machine, data, commands and dates."""
    latest = {(r["engine"], r["selectivity"]): r for r in rows}
    order = list(ENGINES)
    kept = sorted(latest.values(), key=lambda r: (order.index(r["engine"]), -r["selectivity"]))
    commands = sorted({f"`{r['command']}` ({r['date']})" for r in kept})
    missing = [name for name in ENGINES if name not in {r["engine"] for r in kept}]
    absent = f" Not measured at this N: {', '.join(missing)}." if missing else ""
    return (
        f"N={n:,} stored vectors (dim {kept[0]['dim']}; {_data(kept[0])}), on {kept[0]['machine']}; load = the "
        "1-minute load average while measuring (the cores are shared, so q/s are low bounds). Produced by "
        + "; ".join(commands)
        + f".{absent}\n\n"
        + _table(kept)
    )


def report(results: Path) -> str:
    """Rewrite docs/filters.md's measured tables from a results file (one table per N and data, the largest N
    first), with the machine, data, dates, loads and commands that produced them."""
    lines = [json.loads(line) for line in results.read_text("utf-8").splitlines() if line.strip()]
    groups = sorted({(r["n"], _data(r)) for r in lines}, key=lambda g: -g[0])
    text = "\n\n".join(_section(n, [r for r in lines if (r["n"], _data(r)) == (n, data)]) for n, data in groups)
    write_marked(DOC, "filter_speed", text, add=True)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100_000, help="stored vectors")
    parser.add_argument(
        "--dim",
        type=int,
        default=128,
        help="vector width (default 128: 1M vectors and their five stores build in minutes on two cores; what a "
        "filter costs, selecting the ids and restricting the search to them, does not grow with the width)",
    )
    parser.add_argument("--clusters", type=int, default=2000, help="centres the stored vectors gather around")
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--budget", type=float, default=10.0, help="seconds at most per measured cell")
    parser.add_argument("--engines", default=",".join(ENGINES), help="comma-separated: " + ", ".join(ENGINES))
    parser.add_argument("--json", action="store_true", help="one JSON line per measured row, then the table")
    parser.add_argument("--workdir", type=Path, help="keep (and reuse) the stores and results.jsonl here")
    parser.add_argument("--report", type=Path, help="rewrite docs/filters.md's table from this results.jsonl")
    args = parser.parse_args(argv)
    if args.report:
        print(report(args.report))
        return 0
    command = shlex.join(["python", "-m", "benchmarks.filter_speed", *(argv if argv is not None else sys.argv[1:])])
    vectors, queries = clustered(args.n, args.dim, args.clusters, args.queries)
    buckets = np.arange(args.n) % BUCKETS  # by row number: independent of the clusters
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        base = args.workdir / f"n{args.n}-d{args.dim}-c{args.clusters}" if args.workdir else Path(tmp)
        for name in args.engines.split(","):
            kind, config = ENGINES[name]
            store, build = _reused_or_built(kind, config, base / name.replace(" ", "-"), vectors)
            # the field's index is built by the first filtered search that reads it (on FAISS a selective one: a
            # widened search reads its candidates' metadata only), timed apart from the measured cells
            start = time.perf_counter()
            store.search(queries[:1], TOP_K, {"field": "meta.bucket", "operator": "<", "value": 1})
            first = time.perf_counter() - start
            for fraction in SELECTIVITIES:
                bound = max(1, round(BUCKETS * fraction))
                filters = {"field": "meta.bucket", "operator": "<", "value": bound}
                allowed = np.flatnonzero(buckets < bound)
                scores = queries @ vectors[allowed].T
                top = np.argsort(-scores, axis=1)[:, :TOP_K]
                truth = [{f"d{allowed[j]}" for j in row} for row in top]
                load = os.getloadavg()[0]
                pushed = _measure(lambda q: store.search(q, TOP_K, filters)[0], queries, truth, args.budget)  # noqa: B023
                widened = _measure(lambda q: _widening(store, q, filters, args.n), queries, truth, args.budget)  # noqa: B023
                row = {
                    "n": args.n,
                    "dim": args.dim,
                    "data": f"clustered: {args.clusters:,} centres, queries are noisy copies of stored rows",
                    "engine": name,
                    "selectivity": fraction,
                    "matching": len(allowed),
                    "plan": _plan(store, filters),
                    "build_s": None if build is None else round(build, 1),
                    "first_filter_s": round(first, 2),
                    "qps": round(pushed["qps"], 1),
                    "recall": round(pushed["recall"], 4),
                    "queries": pushed["queries"],
                    "widening_qps": round(widened["qps"], 2),
                    "widening_recall": round(widened["recall"], 4),
                    "widening_queries": widened["queries"],
                    "load": round((load + os.getloadavg()[0]) / 2, 1),
                    "machine": _machine(),
                    "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
                    "command": command,
                }
                rows.append(row)
                if args.json:
                    print(json.dumps(row), flush=True)
                if args.workdir:
                    with open(args.workdir / "results.jsonl", "a", encoding="utf-8") as fh:
                        fh.write(json.dumps(row) + "\n")
            store.close()
    print(f"N={args.n} dim={args.dim}, recall@{TOP_K} against exact filtered search")
    print(_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
