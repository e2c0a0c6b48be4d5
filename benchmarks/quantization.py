"""Compressed stored vectors with rescoring, side by side: FAISS store with quantize none | sq8 | binary | pq.

    python benchmarks/quantization.py --n 1000000                 # synthetic 1M x 768 + the dev tasks
    python benchmarks/quantization.py --n 100000 --skip-tasks     # a quick synthetic run

Synthetic part (memory, latency, recall): ``--n`` clustered unit vectors (benchmarks/large_index.py's
generator) written through the real ``FaissStore`` (docstore, vector file, checksums: what
``care-retriever index`` writes), one process per setting. Measured per setting: index build time
(upserts + publish), bytes per document in RAM (anonymous memory added by reading index.faiss whole:
the flat vectors or the codes) and on disk (every file of the store), batch-1 p50/p99 of
``store.search`` (rescoring included), recall@10 and recall@100 against exact search, and recall@10
at other ``oversample`` values (search-time override) to choose the defaults.

Dev-task part (quality): each task's corpus encoded once by a random-weight tower pair of the ``base``
preset (768 dims; ``--document-layers`` shortens its decoder so that 36k documents encode on a CPU),
stored with each setting; nDCG@10 against the task's qrels and overlap@10 with the exact ranking.

Writes ``--json`` (default docs/quantization.json) and the marked section of docs/scale.md. A part
that is skipped keeps its previous results from the JSON (each row says when it was measured).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from large_index import exact_neighbours, generate, make_queries  # noqa: E402

SETTINGS = ("none", "sq8", "binary", "pq")
TASKS = ("kuake-qtr-retrieval", "im-qa-retrieval")
START, END = "<!-- quantization:start -->", "<!-- quantization:end -->"
CHUNK = 100_000


def store_options(setting: str, args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {"type": "flat", "pq_m": args.pq_m}
    if setting != "none":
        options["quantize"] = setting
    return options


def dir_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def build_store(folder: Path, vectors: np.ndarray, options: dict[str, Any], fingerprint: str) -> float:
    """Write ``vectors`` (ids = row numbers) into a new FAISS store; seconds taken, publish included."""
    from care_retriever.corpus import Document
    from care_retriever.stores.faiss import FaissStore

    start = time.perf_counter()
    store = FaissStore(folder)
    store.prepare(vectors.shape[1], fingerprint, fingerprint, options)
    for i in range(0, len(vectors), CHUNK):
        block = np.ascontiguousarray(vectors[i : i + CHUNK], dtype=np.float32)
        store.upsert([Document(id=str(j), text=str(j)) for j in range(i, i + len(block))], block)
    store.finalize()
    store.close()
    return time.perf_counter() - start


def search_ids(store: Any, queries: np.ndarray, k: int) -> np.ndarray:
    rows = store.search(queries, k, payload=False)
    out = np.full((len(queries), k), -1, dtype=np.int64)
    for i, row in enumerate(rows):
        out[i, : len(row)] = [int(h.id) for h in row]
    return out


def recall(found: np.ndarray, truth: np.ndarray, k: int) -> float:
    return float(np.mean([len(set(f[:k]) & set(t[:k])) / k for f, t in zip(found, truth, strict=True)]))


# ---------------------------------------------------------------------- synthetic worker
RAM_PROBE = """
import sys, faiss
sys.path.insert(0, {here!r})
from large_index import rss_anon
before = rss_anon()
index = faiss.read_index({path!r})
print(rss_anon() - before)
"""


def index_ram(path: Path) -> int:
    """Anonymous memory a fresh process adds by reading ``path`` whole (what a searching process holds): not
    measured in the building process, whose freed memory the reader would reuse."""
    code = RAM_PROBE.format(here=str(HERE), path=str(path))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(done.stdout.split()[-1])


def synthetic_worker(args: argparse.Namespace) -> None:
    from care_retriever.stores.faiss import INDEX, FaissStore

    data = np.load(args.data, mmap_mode="r")
    queries = make_queries(data, args.queries, args.seed)
    truth = np.load(args.truth)
    folder = Path(args.workdir_store)
    build = build_store(folder, data, store_options(args.worker, args), "synthetic")
    ram = index_ram(folder / INDEX)
    result: dict[str, Any] = {
        "setting": args.worker,
        "n": len(data),
        "build_s": build,
        "ram_bytes_per_doc": ram / len(data),
        "index_file_bytes_per_doc": (folder / INDEX).stat().st_size / len(data),
        "disk_bytes_per_doc": dir_bytes(folder) / len(data),
    }
    store = FaissStore(folder)
    result["oversample"] = store.require_manifest().index.get("oversample")
    for q in queries[:5]:  # warm: a flat store's mapped vectors are read into the page cache once
        store.search(q[None, :], 10, payload=False)
    times = []
    for q in queries[: args.latency_queries]:
        t = time.perf_counter()
        store.search(q[None, :], 10, payload=False)
        times.append((time.perf_counter() - t) * 1000)
    result["p50_ms"], result["p99_ms"] = float(np.percentile(times, 50)), float(np.percentile(times, 99))
    result["recall_at_10"] = recall(search_ids(store, queries, 10), truth, 10)
    result["recall_at_100"] = recall(search_ids(store, queries, 100), truth, 100)
    if args.worker != "none":
        sweep = {}
        for value in [float(x) for x in args.oversample_sweep.split(",") if x.strip()]:
            store.oversample = value
            t = time.perf_counter()
            found = search_ids(store, queries, 10)
            sweep[f"{value:g}"] = {
                "recall_at_10": recall(found, truth, 10),
                "batch_ms_per_query": (time.perf_counter() - t) * 1000 / len(queries),
            }
        result["oversample_sweep"] = sweep
    store.close()
    Path(args.result).write_text(json.dumps(result))


def run_synthetic(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    data_path = tmp / "vectors.npy"
    t = time.perf_counter()
    generate(data_path, args.n, args.dim, args.clusters, args.seed)
    print(f"generated {args.n:,} x {args.dim} in {time.perf_counter() - t:.0f}s", file=sys.stderr)
    data = np.load(data_path, mmap_mode="r")
    truth = exact_neighbours(data, make_queries(data, args.queries, args.seed), 100)
    del data
    np.save(tmp / "truth.npy", truth)
    rows = []
    for setting in args.settings.split(","):
        result_path = tmp / f"{setting}.json"
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            setting,
            "--data",
            str(data_path),
            "--truth",
            str(tmp / "truth.npy"),
        ]
        cmd += ["--result", str(result_path), "--workdir-store", str(tmp / f"store-{setting}")]
        cmd += [
            "--queries",
            str(args.queries),
            "--latency-queries",
            str(args.latency_queries),
            "--seed",
            str(args.seed),
        ]
        cmd += ["--pq-m", str(args.pq_m), "--oversample-sweep", args.oversample_sweep]
        print(f"synthetic: {setting} ...", file=sys.stderr)
        env = {"OMP_WAIT_POLICY": "PASSIVE", **os.environ, "PYTHONWARNINGS": "ignore"}
        if subprocess.run(cmd, env=env).returncode != 0:
            print(f"{setting}: failed", file=sys.stderr)
            continue
        row = json.loads(result_path.read_text())
        print(json.dumps({k: v for k, v in row.items() if k != "oversample_sweep"}), file=sys.stderr)
        rows.append(row)
        subprocess.run(["rm", "-rf", str(tmp / f"store-{setting}")], check=False)  # disk: one store at a time
    return {
        "n": args.n,
        "dim": args.dim,
        "queries": args.queries,
        "latency_queries": args.latency_queries,
        "clusters": args.clusters,
        "measured": time.strftime("%Y-%m-%d"),
        "cpu_cores": os.cpu_count(),
        "rows": rows,
    }


# ---------------------------------------------------------------------- dev tasks
def read_task(folder: Path) -> tuple[list[Any], dict[str, str], dict[str, dict[str, int]]]:
    from care_retriever.corpus import read_corpus

    docs = list(read_corpus(folder / "corpus.jsonl", skip_invalid=True))  # a few titles are empty
    queries = {}
    for line in (folder / "queries.jsonl").read_text("utf-8").splitlines():
        row = json.loads(line)
        queries[str(row["_id"])] = row["text"]
    qrels: dict[str, dict[str, int]] = {}
    for line in (folder / "qrels" / "test.tsv").read_text("utf-8").splitlines()[1:]:
        qid, did, score = line.split("\t")
        if int(score) > 0:
            qrels.setdefault(qid, {})[did] = int(score)
    return docs, {q: t for q, t in queries.items() if q in qrels}, qrels


def ndcg_at_10(ranked: list[str], rels: dict[str, int]) -> float:
    dcg = sum(rels.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranked[:10]))
    ideal = sum(r / math.log2(i + 2) for i, r in enumerate(sorted(rels.values(), reverse=True)[:10]))
    return dcg / ideal if ideal else 0.0


def task_scores(
    found: list[list[str]], exact: list[list[str]] | None, qids: list[str], qrels: dict[str, dict[str, int]]
) -> dict[str, float | None]:
    """nDCG@10 of ``found`` and its overlap@10 with the exact ranking."""
    ndcg = float(np.mean([ndcg_at_10(r, qrels[q]) for r, q in zip(found, qids, strict=True)]))
    if exact is None:
        return {"ndcg_at_10": ndcg, "overlap_at_10_with_exact": None}
    overlap = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found, exact, strict=True)]))
    return {"ndcg_at_10": ndcg, "overlap_at_10_with_exact": overlap}


def build_model(args: argparse.Namespace, texts: list[str], out: Path) -> Any:
    from care_retriever.embedder import AsymmetricEmbedder
    from care_retriever.towers.scratch import build_random_towers

    overrides = {"num_hidden_layers": args.document_layers} if args.document_layers else None
    q_dir, d_dir = build_random_towers(args.preset, texts, out, seed=args.seed, document_config=overrides)
    return AsymmetricEmbedder.from_towers(str(q_dir), str(d_dir), dtype="fp32")


def run_tasks(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    import torch

    from care_retriever.stores.faiss import FaissStore

    torch.manual_seed(args.seed)
    tasks = [(name, args.data_root / name) for name in args.tasks.split(",")]
    loaded = {name: read_task(folder) for name, folder in tasks if folder.is_dir()}
    if not loaded:
        print(f"no dev task under {args.data_root}: skipped", file=sys.stderr)
        return {}
    texts = [d.embedding_text() for docs, _, _ in loaded.values() for d in docs]
    texts += [q for _, queries, _ in loaded.values() for q in queries.values()]
    embedder = build_model(args, texts, tmp / "model")
    model_name = f"random {args.preset}" + (
        f", decoder cut to {args.document_layers} layers" if args.document_layers else ""
    )
    out: dict[str, Any] = {"model": model_name, "dim": embedder.dim, "measured": time.strftime("%Y-%m-%d"), "tasks": {}}
    for name, (docs, queries, qrels) in loaded.items():
        cache = args.cache / f"{name}-{args.preset}-{args.document_layers}-{args.seed}.npy"
        if cache.exists():
            doc_vecs = np.load(cache)
            # the cache must come from this very model (random towers rebuilt from the same seed and texts)
            check = embedder.embed_documents([d.embedding_text() for d in docs[:8]])
            if not np.allclose(check, doc_vecs[:8], atol=1e-4):
                raise SystemExit(f"{cache}: encoded by another model; remove it")
        else:
            t = time.perf_counter()
            doc_vecs = embedder.embed_documents([d.embedding_text() for d in docs], batch_size=32, show_progress=True)
            print(f"{name}: {len(docs)} documents encoded in {time.perf_counter() - t:.0f}s", file=sys.stderr)
            args.cache.mkdir(parents=True, exist_ok=True)
            np.save(cache, doc_vecs)
        qids = list(queries)
        q_vecs = embedder.embed_queries([queries[q] for q in qids])
        rows, exact = [], None
        for setting in args.settings.split(","):
            folder = tmp / f"{name}-{setting}"
            from care_retriever.corpus import Document

            store = FaissStore(folder)
            store.prepare(doc_vecs.shape[1], "task", "task", store_options(setting, args))
            store.upsert([Document(id=d.id, text=d.text) for d in docs], doc_vecs)
            store.finalize()
            ranked = [[h.id for h in row] for row in store.search(q_vecs, 10, payload=False)]
            exact = ranked if setting == "none" else exact

            row = {"setting": setting, **task_scores(ranked, exact, qids, qrels)}
            row["oversample"] = store.require_manifest().index.get("oversample")
            if setting != "none":
                row["oversample_sweep"] = {}
                for value in [float(x) for x in args.oversample_sweep.split(",") if x.strip()]:
                    store.oversample = value
                    found = [[h.id for h in r] for r in store.search(q_vecs, 10, payload=False)]
                    row["oversample_sweep"][f"{value:g}"] = task_scores(found, exact, qids, qrels)
            store.close()
            rows.append(row)
            print(f"{name} {setting}: {rows[-1]}", file=sys.stderr)
        out["tasks"][name] = {"documents": len(docs), "queries": len(qids), "rows": rows}
    return out


# ---------------------------------------------------------------------- report
def render(result: dict[str, Any]) -> str:
    lines = [START, ""]
    syn = result.get("synthetic")
    if syn and syn.get("rows"):
        base = next((r for r in syn["rows"] if r["setting"] == "none"), None)
        lines += [
            f"Synthetic: {syn['n']:,} clustered unit vectors x {syn['dim']} dims through `FaissStore` (flat index), "
            f"{syn['queries']} queries ({syn['latency_queries']} timed one at a time), {syn['cpu_cores']} shared "
            f"CPU cores, measured {syn['measured']}.",
            "",
            "| quantize | oversample | RAM B/doc | RAM vs flat | disk B/doc | build (s) | p50 (ms) | p99 (ms) "
            "| recall@10 | recall@100 |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in syn["rows"]:
            ratio = (
                f"1/{base['ram_bytes_per_doc'] / r['ram_bytes_per_doc']:.1f}"
                if base and r["ram_bytes_per_doc"] > 0
                else "-"
            )
            lines.append(
                f"| {r['setting']} | {r['oversample'] or '-'} | {r['ram_bytes_per_doc']:,.0f} | {ratio} "
                f"| {r['disk_bytes_per_doc']:,.0f} | {r['build_s']:.0f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} "
                f"| {r['recall_at_10']:.4f} | {r['recall_at_100']:.4f} |"
            )
        sweeps = [r for r in syn["rows"] if r.get("oversample_sweep")]
        if sweeps:
            values = list(sweeps[0]["oversample_sweep"])
            lines += ["", "recall@10 by search-time `oversample` (same builds):", ""]
            lines += ["| quantize | " + " | ".join(values) + " |", "|---|" + "---|" * len(values)]
            for r in sweeps:
                cells = [f"{r['oversample_sweep'][v]['recall_at_10']:.4f}" for v in values]
                lines.append(f"| {r['setting']} | " + " | ".join(cells) + " |")
    dev = result.get("dev")
    if dev and dev.get("tasks"):
        names = list(dev["tasks"])
        lines += [
            "",
            f"Dev tasks: nDCG@10 with a {dev['model']} tower pair ({dev['dim']} dims), measured {dev['measured']}; "
            "in brackets, overlap@10 with the exact ranking.",
            "",
            "| quantize | " + " | ".join(f"{n} ({dev['tasks'][n]['documents']:,} docs)" for n in names) + " |",
            "|---|" + "---|" * len(names),
        ]
        settings = [r["setting"] for r in dev["tasks"][names[0]]["rows"]]
        for s in settings:
            cells = []
            for n in names:
                row = next(r for r in dev["tasks"][n]["rows"] if r["setting"] == s)
                extra = (
                    f" ({row['overlap_at_10_with_exact']:.3f})" if row["overlap_at_10_with_exact"] is not None else ""
                )
                cells.append(f"{row['ndcg_at_10']:.4f}{extra}")
            lines.append(f"| {s} | " + " | ".join(cells) + " |")
        swept = [(n, r) for n in names for r in dev["tasks"][n]["rows"] if r.get("oversample_sweep")]
        if swept:
            values = list(swept[0][1]["oversample_sweep"])
            lines += ["", "overlap@10 with the exact ranking by search-time `oversample` (same stores):", ""]
            lines += ["| task | quantize | " + " | ".join(values) + " |", "|---|---|" + "---|" * len(values)]
            for n, r in swept:
                cells = [f"{r['oversample_sweep'][v]['overlap_at_10_with_exact']:.4f}" for v in values]
                lines.append(f"| {n} | {r['setting']} | " + " | ".join(cells) + " |")
    if result.get("trained_model"):
        lines += ["", result["trained_model"]]
    commands = [c for part in (syn, dev) if part for c in part.get("commands", [part.get("command")]) if c]
    lines += ["", "Measured by " + " and ".join(f"`{c}`" for c in commands) + ".", "", END]
    return "\n".join(lines)


def write_docs(path: Path, section: str) -> None:
    text = path.read_text("utf-8")
    if START in text and END in text:
        head, rest = text.split(START, 1)
        text = head + section + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text, "utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--latency-queries", type=int, default=100)
    parser.add_argument("--clusters", type=int, default=2000)
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--pq-m", type=int, default=96, help="PQ bytes per vector (divides the dimension)")
    parser.add_argument("--oversample-sweep", default="2,4,10,20,40")
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--data-root", type=Path, default=REPO.parent / "shared" / "data" / "tasks")
    parser.add_argument("--preset", default="base")
    parser.add_argument(
        "--document-layers", type=int, default=2, help="decoder depth of the random tower (0: preset's)"
    )
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "care-quantization-cache")
    parser.add_argument("--skip-synthetic", action="store_true")
    parser.add_argument("--skip-tasks", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=REPO / "docs" / "quantization.json")
    parser.add_argument("--docs", type=Path, default=REPO / "docs" / "scale.md")
    parser.add_argument("--workdir", type=Path, help="scratch folder (default: a temp folder)")
    parser.add_argument("--worker", choices=SETTINGS, help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--truth", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--workdir-store", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        synthetic_worker(args)
        return 0
    unknown = sorted(set(args.settings.split(",")) - set(SETTINGS))
    if unknown:
        parser.error(f"unknown settings {unknown}; choose from {list(SETTINGS)}")
    result = json.loads(args.json.read_text()) if args.json.exists() else {}
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp_name:
        tmp = Path(tmp_name)
        command = "python benchmarks/quantization.py " + " ".join(sys.argv[1:] if argv is None else argv)
        if not args.skip_synthetic:
            fresh = run_synthetic(args, tmp)
            for row in fresh["rows"]:
                row["command"] = command
            old = result.get("synthetic") or {}
            if (old.get("n"), old.get("dim")) == (args.n, args.dim):  # settings not re-run keep their rows
                redone = {r["setting"] for r in fresh["rows"]}
                kept = [r for r in old.get("rows", []) if r["setting"] not in redone]
                order = {name: i for i, name in enumerate(SETTINGS)}
                fresh["rows"] = sorted(kept + fresh["rows"], key=lambda r: order[r["setting"]])
            # the commands whose rows are shown, in order
            fresh["commands"] = list(dict.fromkeys(r.get("command", command) for r in fresh["rows"]))
            result["synthetic"] = fresh
        if not args.skip_tasks:
            result["dev"] = {**run_tasks(args, tmp), "command": command}
            result["trained_model"] = (
                "Trained miniature model: none on the measuring machine (no /root/care-runs), not measured."
                if not Path("/root/care-runs").exists()
                else "Trained miniature model: see /root/care-runs (not measured by this script)."
            )
    args.json.write_text(json.dumps(result, indent=2))
    write_docs(args.docs, render(result))
    print(render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
