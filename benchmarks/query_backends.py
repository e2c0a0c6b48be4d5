"""Query backends side by side: torch fp32 vs ONNX Runtime fp32 / int8 vs OpenVINO fp32 / int8.

One run, one machine, the same ``base``-preset query tower (random weights, gte-multilingual-base
shape) and the same realistic queries (dev questions of im-qa-retrieval, else kuake-qtr-retrieval,
from ``/work/shared/data``; the shipped sample's queries when neither is there). Every latency goes
end to end through the project's own search path: ``CareRetriever.search`` over a small FAISS store
(tokenisation, pooling, normalisation and the store lookup included).

- batch-1 p50 / p99 and batch-32 throughput per backend; the backends take turns query by query
  (rotating which goes first), so load from other processes on a shared machine hits all alike.
- search-process peak RSS (``os.wait4``) and cold start (process start to the first printed result)
  of the real CLI ``care-retriever search --backend torch|onnx|openvino``, the backends taking turns.
- optional ``--ndcg-model``: nDCG@10 of a *trained* model on kuake-qtr-retrieval, its torch query
  tower vs each export, with the same document vectors for every row (computed once on torch: the
  document tower, or with ``--ndcg-documents query`` the query tower itself, for a model whose only
  trained tower is the query tower, e.g. a Stage 0 query checkpoint).

Writes its section of docs/benchmarks.md (between the ``query_backends`` markers) unless ``--no-write``.
Usage: ``nice python -m benchmarks.query_backends [--ndcg-model DIR [--ndcg-documents query]]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.core_common import CLI, REPO, SAMPLE, machine_line, model_dir, table, verdict
from benchmarks.core_memory import build_store
from benchmarks.marked_sections import write_marked

SHARED_TASKS = Path(os.environ.get("CARE_SHARED_DATA", "/work/shared/data")) / "tasks"
DOC = REPO / "docs" / "benchmarks.md"
P50_TARGET = 0.2  # int8 batch-1 p50 / torch fp32 p50
PROCESS_TARGET = 0.5  # onnx search process / torch search process (peak RSS, cold start)
NDCG_TOLERANCE = 0.005  # |nDCG@10 of an export - nDCG@10 of torch fp32|


def realistic_queries(n: int) -> tuple[list[str], str]:
    for task in ("im-qa-retrieval", "kuake-qtr-retrieval"):
        path = SHARED_TASKS / task / "queries.jsonl"
        if path.is_file():
            rows = [json.loads(line)["text"] for line in path.open(encoding="utf-8") if line.strip()]
            return [rows[i % len(rows)] for i in range(n)], f"{task} queries ({len(rows)} distinct)"
    rows = [json.loads(line)["text"] for line in (SAMPLE / "queries.jsonl").open(encoding="utf-8") if line.strip()]
    return [rows[i % len(rows)] for i in range(n)], "the shipped sample's queries (shared data absent)"


def openvino_installed() -> bool:
    try:
        import nncf  # noqa: F401
        import openvino  # noqa: F401
    except ImportError:
        return False
    return True


def ensure_exports(model: Path) -> list[str]:
    """Export the query tower (ONNX and, where installed, OpenVINO; fp32 + int8) with the project's exporter."""
    notes = []
    backends = ["onnx"] if not openvino_installed() else ["onnx", "openvino"]
    if "openvino" not in backends:
        notes.append("OpenVINO: not measured (openvino / nncf are not installed in this environment)")
    for backend in backends:
        subprocess.run(
            [*CLI, "export", "--model", str(model), "--backend", backend, "--quantize", "int8"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return notes


def export_variants(model: Path) -> dict[str, tuple[str, dict[str, str]]]:
    """Row name -> (backend, file option) for every exported file of ``model``."""
    from care_retriever.search.backends.layout import BACKEND_FILES, find_export

    out: dict[str, tuple[str, dict[str, str]]] = {}
    for backend, option in (("onnx", "onnx_file"), ("openvino", "openvino_file")):
        record = find_export(model, backend)
        if record is None:
            continue
        for quant in ("none", "int8"):
            name = BACKEND_FILES[backend][quant]
            if name in record.files:
                out[f"{backend} {'fp32' if quant == 'none' else 'int8'}"] = (backend, {option: name})
    return out


def load_variants(model: Path, store: str) -> dict[str, Any]:
    """Retrievers over the same store, one per backend and file, each through ``CareRetriever``."""
    from care_retriever.search.backends import load_query_embedder
    from care_retriever.search.retriever import CareRetriever

    variants = {"torch fp32": load_query_embedder(model, "torch", device="cpu")}
    for name, (backend, option) in export_variants(model).items():
        variants[name] = load_query_embedder(model, backend, **option)
    return {name: CareRetriever(store, embedder) for name, embedder in variants.items()}


def interleaved(calls: dict[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    """Seconds per call; each round runs every variant once, the first one rotating."""
    names = list(calls)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            calls[name]()
            times[name].append(time.perf_counter() - start)
    return times


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def latency_rows(retrievers: dict[str, Any], queries: list[str], batch_rounds: int) -> list[list[str]]:
    for retriever in retrievers.values():  # warm-up: first calls pay one-off allocations
        for q in queries[:5]:
            retriever.search(q, top_k=10)
    singles: dict[str, list[float]] = {n: [] for n in retrievers}
    for q in queries:
        got = interleaved({n: (lambda r=r, q=q: r.search(q, top_k=10)) for n, r in retrievers.items()}, 1)
        for n, t in got.items():
            singles[n] += t
    batches = [queries[(i * 32) % len(queries) :][:32] for i in range(batch_rounds)]
    batches = [b if len(b) == 32 else (b + queries)[:32] for b in batches]
    batch_times: dict[str, list[float]] = {n: [] for n in retrievers}
    for batch in batches:
        got = interleaved({n: (lambda r=r, b=batch: r.search(b, top_k=10)) for n, r in retrievers.items()}, 1)
        for n, t in got.items():
            batch_times[n] += t
    base = statistics.median(singles["torch fp32"])
    rows = []
    for name in retrievers:
        p50 = statistics.median(singles[name])
        rows.append(
            [
                name,
                f"{p50 * 1e3:.2f}",
                f"{percentile(singles[name], 0.99) * 1e3:.2f}",
                f"{p50 / base:.3f}",
                f"{32 / statistics.median(batch_times[name]):.1f}",
            ]
        )
    return rows


FIRST_LINE = (
    "import os, subprocess, sys, time\n"
    "start = time.perf_counter()\n"
    "proc = subprocess.Popen(sys.argv[2:], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)\n"
    "line = proc.stdout.readline()\n"
    "first = time.perf_counter() - start\n"
    "proc.stdout.read()\n"
    "_, status, usage = os.wait4(proc.pid, 0)\n"
    "assert line and status == 0, (line, status)\n"
    "open(sys.argv[1], 'w').write(f'{first} {usage.ru_maxrss}')\n"
)


def process_run(argv: list[str]) -> tuple[float, float]:
    """(seconds to the first printed result, peak RSS MiB) of one fresh process."""
    with tempfile.TemporaryDirectory(prefix="care-qb-") as tmp:
        report = Path(tmp) / "report"
        subprocess.run([sys.executable, "-c", FIRST_LINE, str(report), *argv], check=True)
        first, rss_kib = report.read_text().split()
    return float(first), int(rss_kib) / 1024


def process_rows(
    model: Path, store: str, query: str, repeats: int, backends: list[str]
) -> tuple[list[list[str]], dict[str, tuple[float, float]]]:
    argv = {
        b: [*CLI, "search", "--model", str(model), "--store", store, "--backend", b, "--json", "--top-k", "10", query]
        for b in backends
    }
    for b in argv:  # one discarded run each: the page cache then holds every side's files
        process_run(argv[b])
    runs: dict[str, list[tuple[float, float]]] = {b: [] for b in argv}
    for r in range(repeats):
        for b in backends[r % len(backends) :] + backends[: r % len(backends)]:
            runs[b].append(process_run(argv[b]))
    med = {b: (statistics.median(t for t, _ in v), statistics.median(m for _, m in v)) for b, v in runs.items()}
    ratios = {b: (med[b][0] / med["torch"][0], med[b][1] / med["torch"][1]) for b in backends}
    rows = [
        [
            f"`care-retriever search --backend {b}`",
            f"{med[b][0]:.2f}",
            f"{ratios[b][0]:.3f}",
            f"{med[b][1]:.0f}",
            f"{ratios[b][1]:.3f}",
        ]
        for b in backends
    ]
    return rows, ratios


def ndcg_rows(model: Path, n_queries: int | None, documents: str, export: bool) -> tuple[list[list[str]], str]:
    """nDCG@10 on kuake-qtr-retrieval: the torch query tower vs each export, same document vectors."""
    import numpy as np

    from care_retriever.evaluation.metrics import retrieval_metrics
    from care_retriever.evaluation.tasks import load_task
    from care_retriever.model.embedder import AsymmetricEmbedder
    from care_retriever.search.backends import load_query_embedder

    task = load_task(SHARED_TASKS / "kuake-qtr-retrieval")
    for backend in ["onnx", *(["openvino"] if openvino_installed() else [])] if export else []:
        subprocess.run(
            [*CLI, "export", "--model", str(model), "--backend", backend, "--quantize", "int8"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    qids = task.query_ids[: n_queries or None]
    qrels = {q: task.qrels[q] for q in qids}
    torch_model = AsymmetricEmbedder.from_pretrained(model, load="both", device="cpu")
    if documents == "query":  # a query-tower-only checkpoint: the documents go through the same tower
        doc_vecs = torch_model.embed_queries(task.corpus_texts, batch_size=64, show_progress=True)
    else:
        doc_vecs = torch_model.embed_documents(task.corpus_texts, batch_size=64, show_progress=True)
    embedders: dict[str, Any] = {"torch fp32": torch_model}
    for name, (backend, option) in export_variants(model).items():
        embedders[name] = load_query_embedder(model, backend, **option)
    rows = []
    scores: dict[str, float] = {}
    for name, embedder in embedders.items():
        q_vecs = embedder.embed_queries([task.queries[q] for q in qids], instruction=task.instruction)
        sims = q_vecs @ doc_vecs.T
        top = np.argsort(-sims, axis=1)[:, :100]
        run = {q: {task.corpus_ids[j]: float(sims[i, j]) for j in top[i]} for i, q in enumerate(qids)}
        scores[name] = retrieval_metrics(qrels, run, relevance_level=task.relevance_level)["ndcg@10"]
        delta = scores[name] - scores["torch fp32"]
        rows.append([name, f"{scores[name]:.4f}", f"{delta:+.4f}", verdict(abs(delta) <= NDCG_TOLERANCE)])
    side = "the query tower (Stage 0 checkpoint)" if documents == "query" else "the document tower"
    return rows, f"{len(qids)} judged queries, {len(task.corpus_ids)} documents embedded once by {side} on torch"


def load_line() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.1f} / {five:.1f} / {fifteen:.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="base")
    parser.add_argument("--queries", type=int, default=200, help="batch-1 queries per backend")
    parser.add_argument("--batch-rounds", type=int, default=10, help="batch-32 searches per backend")
    parser.add_argument("--process-repeats", type=int, default=4, help="cold-start runs per backend")
    parser.add_argument("--ndcg-model", type=Path, help="a trained CARE model for the nDCG@10 comparison")
    parser.add_argument("--ndcg-model-note", default="", help="what that model is, for the table's caption")
    parser.add_argument(
        "--ndcg-documents",
        choices=("document", "query"),
        default="document",
        help="tower that embeds the corpus (query: a query-tower-only checkpoint)",
    )
    parser.add_argument("--ndcg-queries", type=int, help="judged queries to use (default: all)")
    parser.add_argument("--store", help="reuse a store this model built (default: index 8 documents now)")
    parser.add_argument("--no-export", action="store_true", help="use the model folder's existing exports")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()

    model = model_dir(args.preset)
    notes = [] if args.no_export else ensure_exports(model)
    queries, source = realistic_queries(args.queries)
    load_before = load_line()
    with tempfile.TemporaryDirectory(prefix="care-qb-store-") as tmp:
        store = args.store or build_store(model, Path(tmp), 8)
        retrievers = load_variants(model, store)
        if not any(n.startswith("openvino") for n in retrievers) and not notes:
            notes.append(f"OpenVINO: not measured (no openvino export in {model})")
        lat_rows = latency_rows(retrievers, queries, args.batch_rounds)
        print(table(["backend", "p50 ms", "p99 ms", "ratio", "batch-32 q/s"], lat_rows), flush=True)
        backends = ["torch", *dict.fromkeys(n.split()[0] for n in retrievers if n != "torch fp32")]
        for r in retrievers.values():
            r.close()
        del retrievers
        proc_rows, ratios = process_rows(model, store, queries[0], args.process_repeats, backends)
        print(table(["process", "cold s", "ratio", "RSS MiB", "ratio"], proc_rows), flush=True)
    load_after = load_line()
    mean_chars = statistics.mean(len(q) for q in queries)
    ratio_of = {row[0]: float(row[3]) for row in lat_rows}
    p50_lines = [
        f"- {name} batch-1 p50 <= {P50_TARGET}x torch fp32: **{verdict(ratio_of[name] <= P50_TARGET)}** "
        f"({ratio_of[name]:.3f})"
        for name in ratio_of
        if name.endswith("int8")
    ]
    process_lines = [
        f"- `--backend {b}`: cold start <= {PROCESS_TARGET}x: **{verdict(cold <= PROCESS_TARGET)}** ({cold:.3f}); "
        f"peak RSS <= {PROCESS_TARGET}x: **{verdict(rss <= PROCESS_TARGET)}** ({rss:.3f})"
        for b, (cold, rss) in ratios.items()
        if b != "torch"
    ]
    out = [
        f"### (j) Query backends: torch vs ONNX Runtime vs OpenVINO (`{args.preset}` preset query tower, "
        f"random weights; load average {load_before} at the start)",
        "",
        f"Generated by `python -m benchmarks.query_backends`. Queries: {len(queries)} from {source}, "
        f"{mean_chars:.1f} characters on average. Each call is `CareRetriever.search` (top 10) over an 8-document "
        "FAISS store, so tokenisation, pooling, normalisation and the lookup are included; the backends take "
        "turns query by query. int8: ONNX Runtime dynamic quantisation; OpenVINO nncf weight compression (int8 "
        "weights, fp32 activations), as `care-retriever export --quantize int8` writes them.",
        "",
        table(
            ["backend", "batch-1 p50 ms", "batch-1 p99 ms", "p50 ratio to torch fp32", "batch-32 queries/s"], lat_rows
        ),
        "",
        "Target (checked for onnx int8; openvino shown alike):",
        *p50_lines,
        "",
        f"Search process ({args.process_repeats} runs each, backends taking turns, medians; first runs discarded so "
        "every side's files are in the page cache; the exports keep their weights in external files that the "
        "runtimes memory-map):",
        "",
        table(["process", "cold start s (to first result)", "ratio", "peak RSS MiB", "ratio"], proc_rows),
        "",
        "Targets, torch-free search process against the torch one:",
        *process_lines,
    ]
    if args.ndcg_model:
        rows, what = ndcg_rows(args.ndcg_model, args.ndcg_queries, args.ndcg_documents, not args.no_export)
        note = f" ({args.ndcg_model_note})" if args.ndcg_model_note else ""
        out += [
            "",
            f"nDCG@10 on kuake-qtr-retrieval ({what}); model `{args.ndcg_model.name}`{note}. "
            f"Target: every export within {NDCG_TOLERANCE} of torch fp32.",
            "",
            table(["query tower", "nDCG@10", "delta to torch fp32", f"within {NDCG_TOLERANCE}"], rows),
        ]
    out += [
        "",
        *(f"{n}." for n in notes),
        f"Machine: {machine_line()}; load average (1 / 5 / 15 min) {load_before} before, {load_after} after "
        "(shared machine, a 2-hour training run beside it: absolute times are indicative, ratios are side by side).",
    ]
    text = "\n".join(out)
    print(text)
    if not args.no_write:
        write_marked(DOC, "query_backends", text, add=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
