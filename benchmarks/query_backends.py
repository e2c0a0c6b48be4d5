"""Query backends side by side (issue 15): torch fp32 vs ONNX Runtime fp32 / int8 (and OpenVINO when exported).

One run, one machine, the same ``base``-preset query tower (random weights, gte-multilingual-base
shape) and the same realistic queries (dev questions of im-qa-retrieval, else kuake-qtr-retrieval,
from ``/work/shared/data``; the shipped sample's queries when neither is there). Every latency goes
end to end through the project's own search path: ``CareRetriever.search`` over a small FAISS store
(tokenisation, pooling, normalisation and the store lookup included).

- batch-1 p50 / p99 and batch-32 throughput per backend; the backends take turns query by query
  (rotating which goes first), so load from other processes on a shared machine hits all alike.
- search-process peak RSS (``os.wait4``) and cold start (process start to the first printed result)
  of the real CLI ``care-retriever search --backend torch|onnx``, alternating torch / onnx runs.
- optional ``--ndcg-model``: nDCG@10 of a *trained* model on kuake-qtr-retrieval, torch query tower
  vs the int8 export, with the same document vectors (the torch document tower, computed once).

Writes its section of docs/benchmarks.md (between the ``query_backends`` markers) unless ``--no-write``.
Usage: ``nice python benchmarks/query_backends.py [--ndcg-model DIR] [--ndcg-queries N]``
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

from core_common import CLI, REPO, SAMPLE, machine_line, model_dir, table, verdict
from core_memory import build_store

SHARED_TASKS = Path(os.environ.get("CARE_SHARED_DATA", "/work/shared/data")) / "tasks"
DOC = REPO / "docs" / "benchmarks.md"
BEGIN, END = "<!-- query_backends:begin -->", "<!-- query_backends:end -->"
P50_TARGET = 0.2  # int8 batch-1 p50 / torch fp32 p50
PROCESS_TARGET = 0.5  # onnx search process / torch search process (peak RSS, cold start)


def realistic_queries(n: int) -> tuple[list[str], str]:
    for task in ("im-qa-retrieval", "kuake-qtr-retrieval"):
        path = SHARED_TASKS / task / "queries.jsonl"
        if path.is_file():
            rows = [json.loads(line)["text"] for line in path.open(encoding="utf-8") if line.strip()]
            return [rows[i % len(rows)] for i in range(n)], f"{task} queries ({len(rows)} distinct)"
    rows = [json.loads(line)["text"] for line in (SAMPLE / "queries.jsonl").open(encoding="utf-8") if line.strip()]
    return [rows[i % len(rows)] for i in range(n)], "the shipped sample's queries (shared data absent)"


def ensure_exports(model: Path) -> list[str]:
    """Export the query tower (ONNX fp32 + int8, and OpenVINO where installed) with the project's exporter."""
    notes = []
    subprocess.run(
        [*CLI, "export", "--model", str(model), "--backend", "onnx", "--quantize", "int8"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    try:
        import openvino  # noqa: F401
    except ImportError:
        notes.append("OpenVINO: not measured (openvino is not installed in this environment)")
        return notes
    proc = subprocess.run(
        [*CLI, "export", "--model", str(model), "--backend", "openvino", "--quantize", "int8"],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        notes.append(f"OpenVINO: not measured (export failed: {proc.stderr.strip().splitlines()[-1:]})")
    return notes


def load_variants(model: Path, store: str) -> dict[str, Any]:
    """Retrievers over the same store, one per backend, each through ``CareRetriever``."""
    from care_retriever.backends import load_query_embedder
    from care_retriever.backends.layout import ONNX_FP32, ONNX_INT8, find_export
    from care_retriever.retriever import CareRetriever

    variants = {
        "torch fp32": load_query_embedder(model, "torch", device="cpu"),
        "onnx fp32": load_query_embedder(model, "onnx", onnx_file=ONNX_FP32),
        "onnx int8": load_query_embedder(model, "onnx", onnx_file=ONNX_INT8),
    }
    if "openvino" in _backends() and find_export(model, "openvino") is not None:
        variants["openvino int8"] = load_query_embedder(model, "openvino")
    return {name: CareRetriever(store, embedder) for name, embedder in variants.items()}


def _backends() -> tuple[str, ...]:
    from care_retriever.backends.layout import EXPORT_BACKENDS

    return tuple(EXPORT_BACKENDS)


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


def latency_rows(retrievers: dict[str, Any], queries: list[str], batch_rounds: int) -> tuple[list[list[str]], float]:
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
    ratio = statistics.median(singles["onnx int8"]) / base
    return rows, ratio


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


def process_rows(model: Path, store: str, query: str, repeats: int) -> tuple[list[list[str]], float, float]:
    argv = {
        b: [*CLI, "search", "--model", str(model), "--store", store, "--backend", b, "--json", "--top-k", "10", query]
        for b in ("torch", "onnx")
    }
    for b in argv:  # one discarded run each: the page cache then holds both sides' files
        process_run(argv[b])
    runs: dict[str, list[tuple[float, float]]] = {b: [] for b in argv}
    for r in range(repeats):
        for b in ("torch", "onnx") if r % 2 == 0 else ("onnx", "torch"):
            runs[b].append(process_run(argv[b]))
    med = {b: (statistics.median(t for t, _ in v), statistics.median(m for _, m in v)) for b, v in runs.items()}
    cold, rss = med["onnx"][0] / med["torch"][0], med["onnx"][1] / med["torch"][1]
    rows = [
        [
            f"`care-retriever search --backend {b}`",
            f"{med[b][0]:.2f}",
            f"{med[b][0] / med['torch'][0]:.3f}",
            f"{med[b][1]:.0f}",
            f"{med[b][1] / med['torch'][1]:.3f}",
        ]
        for b in argv
    ]
    return rows, cold, rss


def ndcg_rows(model: Path, n_queries: int | None) -> tuple[list[list[str]], str]:
    """nDCG@10 on kuake-qtr-retrieval: the torch query tower vs the int8 export, same document vectors."""
    import numpy as np

    from care_retriever.backends import load_query_embedder
    from care_retriever.backends.layout import ONNX_FP32, ONNX_INT8
    from care_retriever.embedder import AsymmetricEmbedder
    from care_retriever.evaluation.metrics import retrieval_metrics

    task = SHARED_TASKS / "kuake-qtr-retrieval"
    subprocess.run(
        [*CLI, "export", "--model", str(model), "--backend", "onnx", "--quantize", "int8"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    qrels: dict[str, dict[str, int]] = {}
    with (task / "qrels" / "test.tsv").open(encoding="utf-8") as fh:
        next(fh)
        for line in fh:
            qid, did, score = line.rstrip("\n").split("\t")
            qrels.setdefault(qid, {})[did] = int(score)
    queries = {r["_id"]: r["text"] for r in map(json.loads, (task / "queries.jsonl").open(encoding="utf-8"))}
    qids = [q for q in queries if q in qrels][: n_queries or None]
    qrels = {q: qrels[q] for q in qids}
    from care_retriever.corpus import read_corpus

    docs = list(read_corpus(task / "corpus.jsonl"))
    doc_ids = [d.id for d in docs]
    texts = [d.embedding_text() for d in docs]  # the one definition of what the document tower sees
    torch_model = AsymmetricEmbedder.from_pretrained(model, load="both", device="cpu")
    doc_vecs = torch_model.embed_documents(texts, batch_size=64, show_progress=True)
    rows = []
    scores = {}
    for name, embedder in (
        ("torch fp32", torch_model),
        ("onnx fp32", load_query_embedder(model, "onnx", onnx_file=ONNX_FP32)),
        ("onnx int8", load_query_embedder(model, "onnx", onnx_file=ONNX_INT8)),
    ):
        q_vecs = embedder.embed_queries([queries[q] for q in qids])
        sims = q_vecs @ doc_vecs.T
        top = np.argsort(-sims, axis=1)[:, :100]
        run = {q: {doc_ids[j]: float(sims[i, j]) for j in top[i]} for i, q in enumerate(qids)}
        scores[name] = retrieval_metrics(qrels, run)["ndcg@10"]
        rows.append([name, f"{scores[name]:.4f}", f"{scores[name] - scores['torch fp32']:+.4f}"])
    return rows, f"{len(qids)} judged queries of {len(queries)}, {len(docs)} documents"


def write_section(text: str) -> None:
    doc = DOC.read_text("utf-8")
    block = f"{BEGIN}\n{text.rstrip()}\n{END}"
    if BEGIN in doc and END in doc:
        doc = doc[: doc.index(BEGIN)] + block + doc[doc.index(END) + len(END) :]
    else:
        doc = doc.rstrip() + "\n\n" + block + "\n"
    DOC.write_text(doc, "utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="base")
    parser.add_argument("--queries", type=int, default=200, help="batch-1 queries per backend")
    parser.add_argument("--batch-rounds", type=int, default=10, help="batch-32 searches per backend")
    parser.add_argument("--process-repeats", type=int, default=4, help="cold-start runs per backend")
    parser.add_argument("--ndcg-model", type=Path, help="a trained CARE model for the nDCG@10 comparison")
    parser.add_argument("--ndcg-queries", type=int, help="judged queries to use (default: all)")
    parser.add_argument("--store", help="reuse a store this model built (default: index 8 documents now)")
    parser.add_argument("--no-export", action="store_true", help="use the model folder's existing exports")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()

    model = model_dir(args.preset)
    notes = [] if args.no_export else ensure_exports(model)
    queries, source = realistic_queries(args.queries)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="care-qb-store-") as tmp:
        store = args.store or build_store(model, Path(tmp), 8)
        retrievers = load_variants(model, store)
        if "openvino int8" not in retrievers and not any(n.startswith("OpenVINO") for n in notes):
            notes.append(
                "OpenVINO: not measured (the search path has no openvino backend in this build: "
                "`openvino` 2026.4 + `nncf` 3.4 install without downgrading torch/transformers/"
                "sentence-transformers, but the backend was not written in this session)"
            )
        lat_rows, p50_ratio = latency_rows(retrievers, queries, args.batch_rounds)
        print(table(["backend", "p50 ms", "p99 ms", "ratio", "batch-32 q/s"], lat_rows), flush=True)
        for r in retrievers.values():
            r.close()
        del retrievers
        proc_rows, cold, rss = process_rows(model, store, queries[0], args.process_repeats)
    load_after = os.getloadavg()[0]
    mean_chars = statistics.mean(len(q) for q in queries)
    out = [
        f"### (j) Query backends: torch vs ONNX Runtime (`{args.preset}` preset query tower, random weights)",
        "",
        f"Generated by `benchmarks/query_backends.py`. Queries: {len(queries)} from {source}, "
        f"{mean_chars:.1f} characters on average. Each call is `CareRetriever.search` (top 10) over an 8-document "
        "FAISS store, so tokenisation, pooling, normalisation and the lookup are included; the backends take "
        "turns query by query.",
        "",
        table(
            ["backend", "batch-1 p50 ms", "batch-1 p99 ms", "p50 ratio to torch fp32", "batch-32 queries/s"], lat_rows
        ),
        "",
        f"Target: onnx int8 batch-1 p50 <= {P50_TARGET}x torch fp32: **{verdict(p50_ratio <= P50_TARGET)}** "
        f"(ratio {p50_ratio:.3f}).",
        "",
        f"Search process ({args.process_repeats} runs each, alternating, medians; first runs discarded so both "
        "sides' files are in the page cache):",
        "",
        table(["process", "cold start s (to first result)", "ratio", "peak RSS MiB", "ratio"], proc_rows),
        "",
        f"Targets: torch-free search process cold start <= {PROCESS_TARGET}x: **{verdict(cold <= PROCESS_TARGET)}** "
        f"({cold:.3f}); peak RSS <= {PROCESS_TARGET}x: **{verdict(rss <= PROCESS_TARGET)}** ({rss:.3f}).",
    ]
    if args.ndcg_model:
        rows, what = ndcg_rows(args.ndcg_model, args.ndcg_queries)
        out += [
            "",
            f"nDCG@10 on kuake-qtr-retrieval ({what}), model `{args.ndcg_model.name}` "
            "(the quickstart model), same document vectors for every row:",
            "",
            table(["query tower", "nDCG@10", "delta to torch"], rows),
        ]
    out += [
        "",
        *(f"{n}." for n in notes),
        f"Machine: {machine_line()}; load average {load_before:.1f} before, {load_after:.1f} after (shared "
        "machine: absolute times are indicative, ratios are side by side).",
    ]
    text = "\n".join(out)
    print(text)
    if not args.no_write:
        write_section(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
