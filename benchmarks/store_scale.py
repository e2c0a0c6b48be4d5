"""Every store kind side by side, through the product's stores: FAISS (flat, HNSW, sq8), Qdrant Edge (HNSW, int8)
and qdrant-client's local mode (the ``qdrant:PATH`` store of earlier releases), on the same vectors.

    python -m benchmarks.store_scale --work /work/runs/scale --n 100000 --kuake      # 100k synthetic + kuake-qtr
    nohup python -m benchmarks.store_scale --work /work/runs/scale --n 1000000 &     # resumable: re-run to go on

Datasets: ``--n`` synthetic unit vectors of ``--dim`` dims (clustered, with noisy copies of rows as queries:
:mod:`benchmarks.large_index`'s generator), and with ``--kuake`` the kuake-qtr corpus encoded once by the ``tiny``
tower (random weights, tokenizers trained on the corpus) with its dev queries. Each is written once under
``--work/data`` with its exact neighbours (inner product over unit vectors, by blocks, in numpy).

Each (dataset, kind) cell runs in its own process (:mod:`benchmarks.store_scale_cell`): build time (writes +
``finalize``: whatever index build or optimize the store does before it serves), size on disk (``du``), peak RSS,
queries per second from 1 and 8 client threads (one query per call), recall@10 against the exact neighbours. A
finished cell's result is kept under ``--work/results`` and a re-run skips it; a cell past ``--cell-budget`` seconds
is stopped and recorded as such (the phase and the points written by then), never extrapolated. The table is
written into benchmarks/results/scale.md between its markers after every cell.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.large_index import exact_neighbours, generate, make_queries
from benchmarks.marked_sections import write_marked
from benchmarks.store_scale_cell import KINDS

DOC = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "scale.md"
SECTION = "store_scale"  # <!-- store_scale:start --> ... <!-- store_scale:end --> of --docs
SHARED = Path(os.environ.get("CARE_SHARED_DATA") or "/work/shared/data")
KUAKE = SHARED / "tasks" / "kuake-qtr-retrieval"


# ---------------------------------------------------------------------------------------------------- datasets
def synthetic_dataset(work: Path, n: int, dim: int, queries: int, k: int, seed: int = 0) -> Path:
    """``n`` x ``dim`` clustered unit vectors, noisy copies of ``queries`` of them, and their exact neighbours."""
    folder = work / "data" / f"synthetic-{n}x{dim}"
    if (folder / "truth.npy").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / "vectors.partial.npy"
    generate(partial, n, dim, clusters=2000, seed=seed)
    partial.rename(folder / "vectors.npy")
    data = np.load(folder / "vectors.npy", mmap_mode="r")
    asked = make_queries(data, queries, seed)
    np.save(folder / "queries.npy", asked)
    np.save(folder / "truth.npy", exact_neighbours(data, asked, k))
    return folder


def kuake_dataset(work: Path, task: Path, k: int, model: Path | None = None) -> Path:
    """The kuake-qtr corpus and dev queries encoded once by the ``tiny`` tower (random weights) or by a trained
    CARE ``model`` (whose query and document vectors share one space, as the random tower's do not), ids and
    texts kept."""
    folder = work / "data" / ("kuake-qtr-tiny" if model is None else f"kuake-qtr-{model.resolve().parent.name}")
    if (folder / "truth.npy").is_file():
        return folder
    from care_retriever import read_corpus
    from care_retriever.documents import iter_jsonl
    from care_retriever.model.embedder import AsymmetricEmbedder
    from care_retriever.model.scratch import init_from_scratch

    folder.mkdir(parents=True, exist_ok=True)
    if model is None:
        embedder = init_from_scratch("tiny", [task / "corpus.jsonl"])
    else:
        embedder = AsymmetricEmbedder.from_pretrained(str(model), device="cpu")
    documents = list(read_corpus(task / "corpus.jsonl", skip_invalid=True))
    vectors = embedder.embed_documents([d.text for d in documents])
    asked = embedder.embed_queries([row["text"] for _, row in iter_jsonl(task / "queries.jsonl")])
    with open(folder / "docs.jsonl", "w", encoding="utf-8") as fh:
        for document in documents:
            fh.write(json.dumps({"id": document.id, "text": document.text}, ensure_ascii=False) + "\n")
    np.save(folder / "vectors.npy", vectors.astype(np.float32))
    np.save(folder / "queries.npy", asked.astype(np.float32))
    np.save(folder / "truth.npy", exact_neighbours(vectors, asked, k))
    return folder


def dataset_ids(dataset: Path) -> list[str]:
    """Row ``i``'s document id (the cell's rule: ``docs.jsonl``'s ids, else ``d{i}``)."""
    docs = dataset / "docs.jsonl"
    if docs.is_file():
        return [json.loads(line)["id"] for line in docs.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [f"d{i}" for i in range(np.load(dataset / "vectors.npy", mmap_mode="r").shape[0])]


def recall_against(found: list[list[str] | None], truth: np.ndarray, ids: list[str], k: int) -> tuple[float, int]:
    """Mean recall@k of the queries answered against the exact neighbours (row indices), and how many were."""
    scores = [
        len(set(hits[:k]) & {ids[int(row)] for row in exact[:k]}) / k
        for hits, exact in zip(found, truth, strict=True)
        if hits is not None
    ]
    return (float(np.mean(scores)) if scores else float("nan")), len(scores)


# ---------------------------------------------------------------------------------------------------- cells
def run_cell_process(dataset: Path, kind: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The cell in its own process, stopped at ``--cell-budget`` seconds; its result with recall added."""
    name = f"{dataset.name}--{kind}"
    store, progress = work / "stores" / name, work / "progress" / f"{name}.json"
    raw = work / "progress" / f"{name}.result.json"
    shutil.rmtree(store, ignore_errors=True)  # an interrupted cell starts again from nothing
    progress.parent.mkdir(parents=True, exist_ok=True)
    progress.unlink(missing_ok=True)
    raw.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "benchmarks.store_scale_cell", "--kind", kind, "--dataset", str(dataset)]
    cmd += ["--store", str(store), "--result", str(raw), "--progress", str(progress), "--k", str(args.k)]
    cmd += ["--min-search-s", str(args.min_search_s), "--max-search-s", str(args.max_search_s)]
    # Passive OpenMP waiting: spinning threads on a shared machine distort every rate (as benchmarks.large_index).
    env = {"OMP_WAIT_POLICY": "PASSIVE", **os.environ, "PYTHONWARNINGS": "ignore"}
    load_start, started = os.getloadavg(), time.perf_counter()
    log = work / "progress" / f"{name}.log"
    with open(log, "w") as errors:
        child = subprocess.Popen(cmd, env=env, cwd=Path(__file__).resolve().parent.parent, stderr=errors)
    try:
        code = child.wait(timeout=args.cell_budget)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        code = None
    elapsed = time.perf_counter() - started
    if code == 0:
        result: dict[str, Any] = json.loads(raw.read_text())
        raw.unlink()
        found = result.pop("found")
        result["recall"], result["recall_queries"] = recall_against(
            found, np.load(dataset / "truth.npy"), dataset_ids(dataset), args.k
        )
    else:
        last = json.loads(progress.read_text()) if progress.is_file() else {"phase": "start", "points": 0}
        tail = (log.read_text(errors="replace").strip().splitlines() or [""])[-1][:200]
        why = f"stopped by the {args.cell_budget:.0f} s budget" if code is None else f"failed (exit {code}: {tail})"
        result = {"kind": kind, "label": KINDS[kind].label, "stopped": why, "phase": last["phase"]}
        result.update(points=last["points"], stopped_after_s=elapsed, load_start=list(load_start))
        result.update(load_end=list(os.getloadavg()), cores=os.cpu_count())
    result["dataset"] = dataset.name
    result["date"] = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    result["command"] = "python -m benchmarks.store_scale " + shlex.join(sys.argv[1:])
    shutil.rmtree(store, ignore_errors=True)  # 1M-row stores are gigabytes each: one on disk at a time
    return result


# ---------------------------------------------------------------------------------------------------- the table
def _mib(value: float) -> str:
    return f"{value / 2**20:,.0f}"


def _rate(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 else f"{value:.2g}"


def _built(result: dict[str, Any]) -> str:
    index = result.get("index", {})
    if "indexed_vectors" in index:
        kinds = sorted({f"{s['index']}/{s['quantization']}" for s in index.get("segment_indexes", [])})
        return (
            f"{index['indexed_vectors']:,} of {index['points']:,} indexed, {index['segments']} segments "
            f"({', '.join(kinds)}), ef_search {index.get('ef_search') or 'default'}"
        )
    if result["kind"] == "local-mode":
        return "exact numpy scan"
    shown = ("type", "m", "ef_construction", "ef_search") if index.get("type") == "hnsw" else ("type",)
    shown += ("quantize", "oversample")
    return ", ".join(f"{key} {index[key]}" for key in shown if index.get(key) not in (None, "none"))


def row(result: dict[str, Any]) -> str:
    load = f"{result['load_start'][0]:.1f} / {result['load_end'][0]:.1f}"
    if "stopped" in result:
        return (
            f"| {result['dataset']} | {result['label']} | {result['stopped']} after {result['stopped_after_s']:,.0f} s "
            f"(phase: {result['phase']}, {result['points']:,} points written) | | | | | | | {load} |"
        )
    one, eight = result["search_1"], result["search_8"]
    return (
        f"| {result['dataset']} | {result['label']} | {result['build_s']:,.1f} ({result['upsert_s']:,.1f}) "
        f"| {_mib(result['disk_bytes'])} | {_mib(result['peak_rss_bytes'])} | {_mib(result['rss_serving_bytes'])} "
        f"| {_rate(one['qps'])} | {_rate(eight['qps'])} | {result['recall']:.3f} ({result['recall_queries']}) "
        f"| {_built(result)} | {load} |"
    )


def table(results: list[dict[str, Any]], k: int, unrun: str = "not run yet") -> str:
    """The Markdown table; a kind with no result for a dataset that has some is a row saying ``unrun``."""
    commands = sorted({r["command"] for r in results})
    dates = sorted(r["date"] for r in results)
    rows = []
    for dataset in dict.fromkeys(r["dataset"] for r in results):
        done = {r["kind"]: r for r in results if r["dataset"] == dataset}
        for kind, spec in KINDS.items():
            rows.append(row(done[kind]) if kind in done else f"| {dataset} | {spec.label} | {unrun} |" + " |" * 8)
    lines = [
        f"Measured {dates[0]} to {dates[-1]} on {results[0]['cores']} CPU cores (shared: the load average at each "
        "cell's start and end is in its row), by:",
        "",
        *[f"    {c}" for c in commands],
        "",
        f"| dataset | store | build s (writes s) | disk MiB | peak RSS MiB | RSS serving MiB | q/s, 1 thread "
        f"| q/s, 8 threads | recall@{k} vs exact (queries) | what was built | load avg start / end |",
        "|" + "---|" * 11,
        *rows,
    ]
    return "\n".join(lines) + "\n"


def collected(work: Path) -> list[dict[str, Any]]:
    order = list(KINDS)

    def key(r: dict[str, Any]) -> tuple[int, str, int]:
        size = int(m.group(1)) if (m := re.match(r"synthetic-(\d+)", r["dataset"])) else 0
        return size, r["dataset"], order.index(r["kind"])

    return sorted((json.loads(p.read_text()) for p in (work / "results").glob("*/*.json")), key=key)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True, help="datasets, results and stores (outside the repo)")
    parser.add_argument("--n", default="", help="synthetic sizes, comma-separated (e.g. 100000,1000000)")
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--queries", type=int, default=500, help="synthetic queries")
    parser.add_argument("--kuake", action="store_true", help="also the kuake-qtr corpus with the tiny tower")
    parser.add_argument("--task", type=Path, default=KUAKE)
    parser.add_argument(
        "--kuake-model", type=Path, default=None, help="with --kuake: encode it with this trained model instead"
    )
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated: {', '.join(KINDS)}")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--cell-budget", type=float, default=1800.0, help="seconds before a cell is stopped")
    parser.add_argument("--min-search-s", type=float, default=5.0, help="each search pass runs at least this long")
    parser.add_argument("--max-search-s", type=float, default=60.0, help="and stops here (recall: queries answered)")
    parser.add_argument("--retry-stopped", action="store_true", help="run again the cells stopped or failed before")
    parser.add_argument("--docs", type=Path, default=DOC, help="the doc whose section is written")
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    parser.add_argument("--not-run", metavar="REASON", help="run nothing: write the table, cells not run saying why")
    args = parser.parse_args(argv)
    kinds = [x.strip() for x in args.kinds.split(",") if x.strip()]
    if unknown := sorted(set(kinds) - set(KINDS)):
        parser.error(f"unknown kinds {unknown}; choose from {', '.join(KINDS)}")
    work = args.work.resolve()
    if args.not_run:
        write_marked(args.docs, SECTION, table(collected(work), args.k, f"not run: {args.not_run}"))
        return 0
    datasets = [synthetic_dataset(work, int(n), args.dim, args.queries, args.k) for n in args.n.split(",") if n]
    if args.kuake:
        if not (args.task / "corpus.jsonl").is_file():
            parser.error(f"{args.task}: task not found (set CARE_SHARED_DATA)")
        datasets.insert(1 if datasets else 0, kuake_dataset(work, args.task, args.k, args.kuake_model))
    for dataset in datasets:
        for kind in kinds:
            saved = work / "results" / dataset.name / f"{kind}.json"
            if saved.is_file() and not (args.retry_stopped and "stopped" in json.loads(saved.read_text())):
                print(f"{dataset.name} {kind}: done before, skipped", file=sys.stderr)
                continue
            print(f"{dataset.name} {kind}: running ...", file=sys.stderr, flush=True)
            result = run_cell_process(dataset, kind, work, args)
            saved.parent.mkdir(parents=True, exist_ok=True)
            saved.write_text(json.dumps(result, indent=1))
            print(row(result), file=sys.stderr, flush=True)
            if not args.no_write:
                write_marked(args.docs, SECTION, table(collected(work), args.k))
    print(table(collected(work), args.k))
    return 0


if __name__ == "__main__":
    sys.exit(main())
