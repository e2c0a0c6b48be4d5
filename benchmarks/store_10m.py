"""A FAISS store of the ``large`` profile at 10M x 768 on one box: built through the product's store API from
generated vectors fed in chunks, with a Parquet corpus of generated texts, then served, written to and verified.

    python -m benchmarks.store_10m --work /work/runs/large-faiss/100k --n 100000 --json
    nohup flock /work/heavy.lock python -m benchmarks.store_10m --work /work/runs/large-faiss/10m --n 10000000 &

Data: clustered unit vectors (:mod:`benchmarks.large_index`'s model: 2,000 centres, noise of norm 0.6, uniform
rather than normal per component: it is drawn five times faster) generated chunk by
chunk from a seed, so the exact search regenerates them rather than keeping a second copy; ``corpus.parquet`` holds
each row's id and a generated text, written and read one row group at a time (pyarrow). Queries are noisy copies of
rows of a few chunks; their exact neighbours come from streaming every chunk again.

Phases, each in its own process (so each peak RSS is its own), each result kept under ``--work`` and skipped by a
re-run (a killed build resumes from its last checkpoint): ``corpus``, ``build`` (the store's ``prepare`` /
``upsert`` / ``commit`` / ``finalize`` with :func:`care_retriever.stores.profiles.profile_config`'s large settings),
``truth``, ``serve`` (q/s from 1 and 8 client threads, one query a call; recall@10; RSS while serving; a
10-document write), ``verify``. Prints the table (and with ``--json`` one JSON line of named fields); each size's
result is kept in benchmarks/results/store_10m/, and the table of them all is written between the markers of
benchmarks/results/scale.md and docs/reference/store-profiles.md. ``--not-run REASON`` runs nothing and records
the phases done so far, the others with the reason.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.store_scale_cell import disk_bytes, peak_rss, rss_now, search_pass

REPO = Path(__file__).resolve().parent.parent
DOCS = (REPO / "benchmarks" / "results" / "scale.md", REPO / "docs" / "reference" / "store-profiles.md")
RESULTS = Path(__file__).resolve().parent / "results" / "store_10m"  # one JSON result per size
BEGIN, END = "<!-- store_10m:start -->", "<!-- store_10m:end -->"
CLUSTERS, CHUNK, SEED = 2000, 100_000, 7
CHECKPOINT_ROWS = 1_000_000
QUERY_CHUNKS, QUERIES_PER_CHUNK = 8, 25
WORDS = ["高血压", "糖尿病", "冠心病", "肺炎", "胃炎", "头痛", "发热", "咳嗽", "乏力", "失眠", "治疗", "用药"]
WORDS += ["检查", "症状", "诊断", "饮食", "运动", "复查", "指南", "患者"]


# ---------------------------------------------------------------------------------------------------- data
class Chunks:
    """The dataset's rows chunk by chunk, the same on every call (each chunk seeded by its number); one chunk's
    buffers are reused, so generating costs no fresh allocation (a view of them is returned: copy to keep it)."""

    def __init__(self, n: int, dim: int) -> None:
        self.n, self.dim = n, dim
        centre = np.random.default_rng(SEED).standard_normal((CLUSTERS, dim), dtype=np.float32)
        self.centres = centre / np.linalg.norm(centre, axis=1, keepdims=True)
        self._rows = np.empty((CHUNK, dim), dtype=np.float32)
        self._noise = np.empty((CHUNK, dim), dtype=np.float32)

    def __call__(self, index: int) -> np.ndarray:
        size = min(CHUNK, self.n - index * CHUNK)
        rng = np.random.default_rng([SEED, index])
        x, noise = self._rows[:size], self._noise[:size]
        np.take(self.centres, rng.integers(0, CLUSTERS, size), axis=0, out=x)
        # uniform noise of the generator's variance (0.6^2 / dim a component): five times faster to draw than normal
        rng.random(out=noise, dtype=np.float32)
        noise -= 0.5
        noise *= 2 * np.sqrt(3) * 0.6 / np.sqrt(self.dim)
        x += noise
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        return x


def chunks(n: int) -> range:
    return range((n + CHUNK - 1) // CHUNK)


def write_corpus(path: Path, n: int) -> None:
    """``n`` rows (id, text) of generated texts, one row group per chunk."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    partial = path.with_suffix(".partial")
    words = np.asarray(WORDS)
    with pq.ParquetWriter(partial, pa.schema([("id", pa.string()), ("text", pa.string())])) as out:
        for c in chunks(n):
            first, size = c * CHUNK, min(CHUNK, n - c * CHUNK)
            picks = words[np.random.default_rng([SEED, c, 1]).integers(0, len(words), (size, 6))]
            texts = [f"病例 {first + i}：" + "，".join(row) for i, row in enumerate(picks.tolist())]
            ids = [f"d{first + i}" for i in range(size)]
            out.write_table(pa.table({"id": ids, "text": texts}), row_group_size=CHUNK)
    partial.rename(path)


def corpus_batches(path: Path, skip: int) -> Iterator[tuple[int, list[str], list[str]]]:
    """(first row, ids, texts) of each row group from ``skip`` on, read one row group at a time."""
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path)
    first = 0
    for group in range(parquet.num_row_groups):
        rows = parquet.metadata.row_group(group).num_rows
        if first + rows > skip:
            table = parquet.read_row_group(group)
            yield first, table.column("id").to_pylist(), table.column("text").to_pylist()
        first += rows


def query_rows(n: int) -> np.ndarray:
    """The rows the queries copy: a few from each of ``QUERY_CHUNKS`` chunks spread over the dataset."""
    picked = np.linspace(0, len(chunks(n)) - 1, QUERY_CHUNKS).astype(int)
    rng = np.random.default_rng(SEED + 1)
    rows = [c * CHUNK + rng.choice(min(CHUNK, n - c * CHUNK), QUERIES_PER_CHUNK, replace=False) for c in set(picked)]
    return np.sort(np.concatenate(rows))


def make_queries(n: int, dim: int) -> np.ndarray:
    generate, rows = Chunks(n, dim), query_rows(n)
    base = np.concatenate([generate(c)[rows[rows // CHUNK == c] - c * CHUNK] for c in np.unique(rows // CHUNK)])
    noise = np.random.default_rng(SEED + 2).standard_normal(base.shape, dtype=np.float32)
    q = base + (0.3 / np.sqrt(dim)) * noise
    return (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)


# ---------------------------------------------------------------------------------------------------- phases
def phase_build(work: Path, n: int, dim: int) -> dict[str, Any]:
    from care_retriever.documents import Document
    from care_retriever.stores import open_store
    from care_retriever.stores.config import FaissIndexConfig
    from care_retriever.stores.profiles import profile_config

    config = profile_config("large", FaissIndexConfig(), n=n, dim=dim)
    progress = work / "build.progress.json"
    done = json.loads(progress.read_text())["rows"] if progress.is_file() else 0
    load, started = os.getloadavg(), time.perf_counter()
    store = open_store(f"faiss:{work / 'store'}")
    store.prepare(dim, "bench-space", "bench-model", config)  # resumes the last checkpoint of a killed build
    generate, since = Chunks(n, dim), 0
    for first, ids, texts in corpus_batches(work / "corpus.parquet", done):
        vectors = generate(first // CHUNK)
        store.upsert([Document(id=i, text=t) for i, t in zip(ids, texts, strict=True)], vectors)
        since += len(ids)
        if since >= CHECKPOINT_ROWS:
            store.commit()
            progress.write_text(json.dumps({"rows": first + len(ids)}))
            since = 0
    store.finalize()
    build_s = time.perf_counter() - started
    index = dict(store.manifest.index) if store.manifest is not None else {}
    store.close()
    return {
        "build_s": build_s,
        "resumed_from_row": done,
        "build_peak_rss_bytes": peak_rss(),
        "disk_bytes": disk_bytes(work / "store"),
        "index": index,
        "build_load": [list(load), list(os.getloadavg())],
    }


def phase_truth(work: Path, n: int, dim: int, k: int) -> dict[str, Any]:
    """Exact top ``k`` of each query by streaming every chunk again (inner product of unit vectors)."""
    queries, generate = make_queries(n, dim), Chunks(n, dim)
    best_s = np.full((len(queries), k), -np.inf, dtype=np.float32)
    best_i = np.zeros((len(queries), k), dtype=np.int64)
    started = time.perf_counter()
    for c in chunks(n):
        scores = queries @ generate(c).T
        top = np.argpartition(-scores, min(k, scores.shape[1] - 1), axis=1)[:, :k]
        cand_s = np.concatenate([best_s, np.take_along_axis(scores, top, axis=1)], axis=1)
        cand_i = np.concatenate([best_i, top + c * CHUNK], axis=1)
        order = np.argsort(-cand_s, axis=1, kind="stable")[:, :k]
        best_s, best_i = np.take_along_axis(cand_s, order, axis=1), np.take_along_axis(cand_i, order, axis=1)
    np.save(work / "queries.npy", queries)
    np.save(work / "truth.npy", best_i)
    return {"truth_s": time.perf_counter() - started, "queries": len(queries)}


def phase_serve(work: Path, n: int, dim: int, k: int, search_s: tuple[float, float]) -> dict[str, Any]:
    from care_retriever.documents import Document
    from care_retriever.stores import open_store

    queries, truth = np.load(work / "queries.npy"), np.load(work / "truth.npy")
    load, started = os.getloadavg(), time.perf_counter()
    store = open_store(f"faiss:{work / 'store'}")
    out: dict[str, Any] = {"open_s": time.perf_counter() - started}
    for threads in (1, 8):
        cpu = time.process_time()
        measured = search_pass(store, queries, k, threads, *search_s)
        found = measured.pop("found")
        out[f"qps_{threads}"] = measured["qps"]
        # this process's CPU time a query: what the rate would be on idle cores, whatever the machine's load
        out[f"cpu_ms_per_query_{threads}"] = (time.process_time() - cpu) * 1000 / measured["answered"]
        if threads == 1:
            scores = [len(set(f) & {f"d{r}" for r in t}) / k for f, t in zip(found, truth, strict=True) if f]
            out["recall_at_10"], out["recall_queries"] = float(np.mean(scores)), len(scores)
    out["serve_rss_bytes"] = rss_now()
    out["serve_peak_rss_bytes"] = peak_rss()
    # two 10-document writes: the first after opening also reads the index for writing, the next one does not
    for key, first in (("small_write_ms", 0), ("next_small_write_ms", 10)):
        new = Chunks(n, dim)(0)[first : first + 10].copy()
        documents = [Document(id=f"new-{first + i}", text=f"新病例 {first + i}") for i in range(10)]
        started = time.perf_counter()
        with store.transaction():
            store.upsert(documents, new)
        out[key] = (time.perf_counter() - started) * 1000
    store.close()
    out["serve_load"] = [list(load), list(os.getloadavg())]
    return out


def phase_verify(work: Path) -> dict[str, Any]:
    from care_retriever.stores import open_store

    started = time.perf_counter()
    store = open_store(f"faiss:{work / 'store'}", create=False)
    count = store.verify()
    store.close()
    return {"verify_s": time.perf_counter() - started, "verified": count, "verify_peak_rss_bytes": peak_rss()}


PHASES = ("corpus", "build", "truth", "serve", "verify")


def run_phase(name: str, args: argparse.Namespace) -> dict[str, Any]:
    work: Path = args.work
    if name == "corpus":
        started = time.perf_counter()
        write_corpus(work / "corpus.parquet", args.n)
        return {"corpus_s": time.perf_counter() - started, "corpus_bytes": (work / "corpus.parquet").stat().st_size}
    if name == "build":
        return phase_build(work, args.n, args.dim)
    if name == "truth":
        return phase_truth(work, args.n, args.dim, args.k)
    if name == "serve":
        return phase_serve(work, args.n, args.dim, args.k, (args.min_search_s, args.max_search_s))
    return phase_verify(work)


# ---------------------------------------------------------------------------------------------------- the table
def write_section(doc: Path, text: str) -> None:
    """Replace the text between this benchmark's markers in ``doc`` (which must hold them)."""
    from benchmarks.marked_sections import write_marked

    write_marked(doc, "store_10m", text)


def _gib(value: float) -> str:
    return f"{value / 2**30:.1f}"


COLUMNS = (
    "N x dim", "store", "build s", "peak RSS building GiB", "peak RSS serving GiB", "disk GiB", "q/s, 1 thread",
    "q/s, 8 threads", "CPU ms a query, 1 / 8 threads", "recall@10 vs exact (queries)",
    "10-doc write ms, first after opening / next", "verify s (peak RSS GiB)", "load avg build / serve",
)  # fmt: skip


def small_writes(r: dict[str, Any]) -> str:
    """The first 10-document write after opening, and the next where it was measured."""
    nxt = r.get("next_small_write_ms")
    return f"{r['small_write_ms']:,.0f}" + (f" / {nxt:,.0f}" if nxt is not None else " / not measured")


def row(r: dict[str, Any]) -> str:
    """One result's row; a figure of a phase that did not run says why."""
    unrun = f"not run: {r.get('not_run', 'not run yet')}"
    index = r.get("index", {})
    built = ", ".join(
        f"{k} {index[k]}" for k in ("type", "nlist", "nprobe", "quantize", "pq_m", "oversample") if k in index
    )

    def cell(key: str, text: Any) -> str:
        return text(r) if key in r else unrun

    loads = " / ".join(f"{a[0]:.1f}-{b[0]:.1f}" for a, b in (r.get("build_load", []), r.get("serve_load", [])) if a)
    cells = [
        f"{r['n']:,} x {r['dim']}",
        f"FAISS large profile ({built})",
        cell("build_s", lambda r: f"{r['build_s']:,.0f}"),
        cell("build_peak_rss_bytes", lambda r: _gib(r["build_peak_rss_bytes"])),
        cell("serve_peak_rss_bytes", lambda r: _gib(r["serve_peak_rss_bytes"])),
        cell("disk_bytes", lambda r: _gib(r["disk_bytes"])),
        cell("qps_1", lambda r: f"{r['qps_1']:,.0f}"),
        cell("qps_8", lambda r: f"{r['qps_8']:,.0f}"),
        cell("cpu_ms_per_query_1", lambda r: f"{r['cpu_ms_per_query_1']:.1f} / {r['cpu_ms_per_query_8']:.1f}"),
        cell("recall_at_10", lambda r: f"{r['recall_at_10']:.3f} ({r['recall_queries']})"),
        cell("small_write_ms", small_writes),
        cell("verify_s", lambda r: f"{r['verify_s']:,.0f} ({_gib(r['verify_peak_rss_bytes'])})"),
        loads,
    ]
    return "| " + " | ".join(cells) + " |"


def table(results: list[dict[str, Any]]) -> str:
    lines = [f"Measured on {r['cores']} CPU cores (shared) by `{r['command']}`, {r['date']}." for r in results]
    head = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    return "\n".join([*lines, "", *head, *(row(r) for r in results)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True, help="corpus, store and results (outside the repo)")
    parser.add_argument("--n", type=int, default=10_000_000)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--min-search-s", type=float, default=10.0)
    parser.add_argument("--max-search-s", type=float, default=60.0)
    parser.add_argument("--json", action="store_true", help="also print one JSON line of named fields")
    parser.add_argument("--docs", type=Path, nargs="*", default=DOCS, help="the docs whose section is written")
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    parser.add_argument("--not-run", metavar="REASON", help="run nothing: record the phases done, the others why not")
    parser.add_argument("--phase", choices=PHASES, help=argparse.SUPPRESS)  # a child process runs one phase
    args = parser.parse_args(argv)
    args.work = args.work.resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    if args.phase:
        (args.work / f"{args.phase}.json").write_text(json.dumps(run_phase(args.phase, args)))
        return 0
    env = {"OMP_WAIT_POLICY": "PASSIVE", **os.environ, "PYTHONWARNINGS": "ignore"}
    given = [a for a in (argv if argv is not None else sys.argv[1:]) if not a.startswith("--not-run")]
    for name in PHASES if not args.not_run else ():
        if (args.work / f"{name}.json").is_file():
            print(f"{name}: done before, skipped", file=sys.stderr)
            continue
        print(f"{name}: running ...", file=sys.stderr, flush=True)
        cmd = [sys.executable, "-m", "benchmarks.store_10m", *given, "--phase", name]
        subprocess.run(cmd, env=env, cwd=Path(__file__).resolve().parent.parent, check=True)
    result: dict[str, Any] = {"n": args.n, "dim": args.dim, "cores": os.cpu_count()}
    for name in PHASES:
        if (args.work / f"{name}.json").is_file():
            result.update(json.loads((args.work / f"{name}.json").read_text()))
    if args.not_run:
        result["not_run"] = args.not_run
    result["date"] = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    result["command"] = "python -m benchmarks.store_10m " + shlex.join(given)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"store_10m-{args.n}x{args.dim}.json").write_text(json.dumps(result, indent=1) + "\n")
    results = [json.loads(p.read_text()) for p in RESULTS.glob("store_10m-*.json")]
    text = table(sorted(results, key=lambda r: (r["n"], r["dim"])))
    for doc in args.docs if not args.no_write else ():
        write_section(doc, text)
    print(text)
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
