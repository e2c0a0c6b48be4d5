"""Compressed stored vectors with rescoring, side by side: FAISS store with quantize none | sq8 | binary | pq.

    python -m benchmarks.quantization --n 1000000                            # synthetic 1M x 768 + the dev tasks
    python -m benchmarks.quantization --n 100000 --skip-tasks                # a quick synthetic run
    python -m benchmarks.quantization --skip-synthetic --model runs/x/final  # the dev tasks, a trained model

Synthetic part (memory, latency, recall): ``--n`` clustered unit vectors (benchmarks/large_index.py's
generator) written through the real ``FaissStore`` (docstore, vector file, checksums: what
``care-retriever index`` writes), one process per setting. Measured per setting: index build time
(upserts + publish), bytes per document in RAM (anonymous memory added by reading index.faiss whole:
the flat vectors or the codes) and on disk (every file of the store), batch-1 p50/p99 of
``store.search`` (rescoring included), recall@10 and recall@100 against exact search, and recall@10
at other ``oversample`` values (search-time override) to choose the defaults.

Dev-task part (quality): each task's corpus encoded once by a tower pair, stored with each setting;
nDCG@10 against the task's qrels and overlap@10 with the exact ranking (the share of the exact top 10
found: recall@10 against exact search). The pair is a random-weight one of the ``base`` preset (768 dims;
``--document-layers`` shortens its decoder so that 36k documents encode on a CPU), or with ``--model`` each
saved CARE model given (its document tower encodes the corpus, its query tower the queries). The random
tower's rows and each model's rows are kept apart in the JSON: a run replaces only what it measured.

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

from benchmarks.large_index import exact_neighbours, generate, make_queries
from care_retriever.stores.config import FaissIndexConfig, IndexType, Quantize

REPO = Path(__file__).resolve().parents[1]

SETTINGS = ("none", "sq8", "binary", "pq")
TASKS = ("kuake-qtr-retrieval", "im-qa-retrieval")
START, END = "<!-- quantization:start -->", "<!-- quantization:end -->"
CHUNK = 100_000


def store_options(setting: str, args: argparse.Namespace, dim: int) -> FaissIndexConfig:
    # PQ at 8 dimensions a byte unless --pq-m says otherwise: the store's default 96 bytes at 768 dims, and the
    # same 1/32 of float32 for a smaller model (96 does not divide 32 or 256).
    return FaissIndexConfig(
        index_type=IndexType.FLAT,
        pq_m=args.pq_m or max(1, dim // 8),
        quantize=None if setting == "none" else Quantize(setting),
    )


def dir_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def build_store(folder: Path, vectors: np.ndarray, options: FaissIndexConfig, fingerprint: str) -> float:
    """Write ``vectors`` (ids = row numbers) into a new FAISS store; seconds taken, publish included."""
    from care_retriever.documents import Document
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
import faiss
from benchmarks.large_index import rss_anon
before = rss_anon()
index = faiss.read_index({path!r})
print(rss_anon() - before)
"""


def index_ram(path: Path) -> int:
    """Anonymous memory a fresh process adds by reading ``path`` whole (what a searching process holds): not
    measured in the building process, whose freed memory the reader would reuse."""
    code = RAM_PROBE.format(path=str(path))
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    return int(done.stdout.split()[-1])


def synthetic_worker(args: argparse.Namespace) -> None:
    from care_retriever.stores.faiss import INDEX, FaissStore

    data = np.load(args.data, mmap_mode="r")
    queries = make_queries(data, args.queries, args.seed)
    truth = np.load(args.truth)
    folder = Path(args.workdir_store)
    build = build_store(folder, data, store_options(args.worker, args, data.shape[1]), "synthetic")
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
            "-m",
            "benchmarks.quantization",
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
        cmd += ["--pq-m", str(args.pq_m or 0), "--oversample-sweep", args.oversample_sweep]
        print(f"synthetic: {setting} ...", file=sys.stderr)
        env = {"OMP_WAIT_POLICY": "PASSIVE", **os.environ, "PYTHONWARNINGS": "ignore"}
        if subprocess.run(cmd, env=env, cwd=REPO).returncode != 0:
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
    from care_retriever.indexing.corpus import read_corpus

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
    from care_retriever.model.embedder import AsymmetricEmbedder
    from care_retriever.model.towers.scratch import build_random_towers

    overrides = {"num_hidden_layers": args.document_layers} if args.document_layers else None
    q_dir, d_dir = build_random_towers(args.preset, texts, out, seed=args.seed, document_config=overrides)
    return AsymmetricEmbedder.from_towers(str(q_dir), str(d_dir), dtype="fp32")


def model_paths(values: list[str]) -> list[str]:
    """``--model`` values, repeated or comma separated, in the order given."""
    return list(dict.fromkeys(p.strip() for v in values for p in v.split(",") if p.strip()))


def recipe_of(model: Path) -> str | None:
    """The recipe a ``care-retriever train`` run folder's ``final`` model came from (its run.json), if any."""
    run = model.resolve().parent / "run.json"
    try:
        info = json.loads(run.read_text("utf-8"))
    except (OSError, ValueError):
        return None
    return f"{info.get('recipe')} ({info.get('source')})" if info.get("recipe") else None


def exact_ranking(q_vecs: np.ndarray, doc_vecs: np.ndarray, ids: list[str], k: int = 10) -> list[list[str]]:
    """Exact top ``k`` by inner product (what every setting's overlap is measured against), in blocks of queries."""
    out: list[list[str]] = []
    for i in range(0, len(q_vecs), 256):
        scores = q_vecs[i : i + 256] @ doc_vecs.T
        top = np.argpartition(-scores, k, axis=1)[:, :k]
        for row, cand in zip(scores, top, strict=True):
            out.append([ids[j] for j in cand[np.argsort(-row[cand], kind="stable")]])
    return out


def encode_corpus(embedder: Any, docs: list[Any], cache: Path) -> np.ndarray:
    """The corpus's document vectors, from ``cache`` when it holds this very model's (checked on 8 documents)."""
    if cache.exists():
        doc_vecs = np.load(cache)
        check = embedder.embed_documents([d.embedding_text() for d in docs[:8]])
        if len(doc_vecs) == len(docs) and np.allclose(check, doc_vecs[:8], atol=1e-4):
            return doc_vecs
        print(f"{cache}: encoded by another model or corpus; encoding again", file=sys.stderr)
    t = time.perf_counter()
    doc_vecs = embedder.embed_documents([d.embedding_text() for d in docs], batch_size=32, show_progress=True)
    print(f"{len(docs)} documents encoded in {time.perf_counter() - t:.0f}s", file=sys.stderr)
    cache.parent.mkdir(parents=True, exist_ok=True)
    np.save(cache, doc_vecs)
    return doc_vecs


def score_settings(
    args: argparse.Namespace,
    tmp: Path,
    name: str,
    task: tuple[list[Any], dict[str, str], dict[str, dict[str, int]]],
    doc_vecs: np.ndarray,
    q_vecs: np.ndarray,
) -> list[dict[str, Any]]:
    """One store per setting over the same vectors: nDCG@10 and overlap@10 with the exact ranking, and the
    overlap at each search-time oversample of ``--oversample-sweep``."""
    from care_retriever.documents import Document
    from care_retriever.stores.faiss import FaissStore

    docs, queries, qrels = task
    qids = list(queries)
    exact = exact_ranking(q_vecs, doc_vecs, [d.id for d in docs])
    rows = []
    for setting in args.settings.split(","):
        folder = tmp / f"{name}-{setting}"
        store = FaissStore(folder)
        options = store_options(setting, args, doc_vecs.shape[1])
        store.prepare(doc_vecs.shape[1], "task", "task", options)
        for i in range(0, len(docs), CHUNK):
            block = docs[i : i + CHUNK]
            store.upsert([Document(id=d.id, text=d.text) for d in block], doc_vecs[i : i + len(block)])
        store.finalize()
        ranked = [[h.id for h in row] for row in store.search(q_vecs, 10, payload=False)]
        row = {"setting": setting, **task_scores(ranked, exact, qids, qrels)}
        row["oversample"] = store.require_manifest().index.get("oversample")
        if setting == "pq":
            row["pq_m"] = options.pq_m
        if setting != "none":
            row["oversample_sweep"] = {}
            for value in [float(x) for x in args.oversample_sweep.split(",") if x.strip()]:
                store.oversample = value
                found = [[h.id for h in r] for r in store.search(q_vecs, 10, payload=False)]
                row["oversample_sweep"][f"{value:g}"] = task_scores(found, exact, qids, qrels)
        store.close()
        subprocess.run(["rm", "-rf", str(folder)], check=False)
        rows.append(row)
        print(f"{name} {setting}: { {k: v for k, v in row.items() if k != 'oversample_sweep'} }", file=sys.stderr)
    return rows


def load_tasks(args: argparse.Namespace) -> dict[str, tuple[list[Any], dict[str, str], dict[str, dict[str, int]]]]:
    tasks = [(name, args.data_root / name) for name in args.tasks.split(",")]
    return {name: read_task(folder) for name, folder in tasks if folder.is_dir()}


def run_tasks(args: argparse.Namespace, tmp: Path, loaded: dict[str, Any]) -> dict[str, Any]:
    """The dev tasks with the random-weight tower pair of ``--preset``."""
    import torch

    torch.manual_seed(args.seed)
    texts = [d.embedding_text() for docs, _, _ in loaded.values() for d in docs]
    texts += [q for _, queries, _ in loaded.values() for q in queries.values()]
    embedder = build_model(args, texts, tmp / "model")
    model_name = f"random {args.preset}" + (
        f", decoder cut to {args.document_layers} layers" if args.document_layers else ""
    )
    out: dict[str, Any] = {"model": model_name, "dim": embedder.dim, "measured": time.strftime("%Y-%m-%d"), "tasks": {}}
    for name, task in loaded.items():
        docs, queries, _ = task
        cache = args.cache / f"{name}-{args.preset}-{args.document_layers}-{args.seed}.npy"
        doc_vecs = encode_corpus(embedder, docs, cache)
        q_vecs = embedder.embed_queries(list(queries.values()))
        rows = score_settings(args, tmp, name, task, doc_vecs, q_vecs)
        out["tasks"][name] = {"documents": len(docs), "queries": len(queries), "rows": rows}
    return out


def run_model(args: argparse.Namespace, tmp: Path, loaded: dict[str, Any], path: str) -> dict[str, Any]:
    """The dev tasks with a saved CARE model: its document tower encodes the corpus, its query tower the queries."""
    import hashlib

    from care_retriever.model.embedder import AsymmetricEmbedder

    embedder = AsymmetricEmbedder.from_pretrained(path, dtype="fp32")
    out: dict[str, Any] = {
        "model": path,
        "recipe": recipe_of(Path(path)),
        "dim": embedder.dim,
        "measured": time.strftime("%Y-%m-%d"),
        "tasks": {},
    }
    key = hashlib.sha1(f"{Path(path).resolve()}|{embedder.space_fingerprint}".encode()).hexdigest()[:12]
    for name, task in loaded.items():
        docs, queries, _ = task
        doc_vecs = encode_corpus(embedder, docs, args.cache / f"{name}-model-{key}.npy")
        q_vecs = embedder.embed_queries(list(queries.values()))
        rows = score_settings(args, tmp, name, task, doc_vecs, q_vecs)
        out["tasks"][name] = {"documents": len(docs), "queries": len(queries), "rows": rows}
    return out


def merge_rows(old: dict[str, Any] | None, fresh: dict[str, Any], command: str) -> dict[str, Any]:
    """``fresh`` with the rows of the settings it did not re-run kept from ``old`` (same model, same tasks); each
    row keeps the command that measured it, and ``commands`` lists those shown."""
    order = {name: i for i, name in enumerate(SETTINGS)}
    for name, task in fresh["tasks"].items():
        for row in task["rows"]:
            row["command"] = command
        if old and old.get("model") == fresh.get("model"):
            redone = {r["setting"] for r in task["rows"]}
            kept = [r for r in old.get("tasks", {}).get(name, {}).get("rows", []) if r["setting"] not in redone]
            for row in kept:
                row.setdefault("command", old.get("command"))
            task["rows"] = sorted(kept + task["rows"], key=lambda r: order[r["setting"]])
    rows = [r for task in fresh["tasks"].values() for r in task["rows"]]
    fresh["commands"] = list(dict.fromkeys(r["command"] for r in rows if r.get("command")))
    return fresh


# ---------------------------------------------------------------------- report
def render_dev(dev: dict[str, Any]) -> list[str]:
    """The dev-task tables of one tower pair: nDCG@10 (overlap@10 with exact) per setting, and the sweep."""
    names = list(dev["tasks"])
    what = (
        f"the tower pair `{dev['model']}`"
        if dev["model"].startswith("random")
        else f"the trained model `{dev['model']}`" + (f" (recipe {dev['recipe']})" if dev.get("recipe") else "")
    )
    lines = [
        "",
        f"Dev tasks: nDCG@10 with {what}, {dev['dim']} dims, measured {dev['measured']}; in brackets, overlap@10 "
        "with the exact ranking (recall@10 against exact search).",
        "",
        "| quantize | " + " | ".join(f"{n} ({dev['tasks'][n]['documents']:,} docs)" for n in names) + " |",
        "|---|" + "---|" * len(names),
    ]
    settings = [r["setting"] for r in dev["tasks"][names[0]]["rows"]]
    for s in settings:
        cells = []
        for n in names:
            row = next(r for r in dev["tasks"][n]["rows"] if r["setting"] == s)
            extra = f" ({row['overlap_at_10_with_exact']:.3f})" if row["overlap_at_10_with_exact"] is not None else ""
            cells.append(f"{row['ndcg_at_10']:.4f}{extra}")
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    swept = [(n, r) for n in names for r in dev["tasks"][n]["rows"] if r.get("oversample_sweep")]
    if swept:
        values = sorted({v for _, r in swept for v in r["oversample_sweep"]}, key=float)
        lines += ["", "overlap@10 with the exact ranking by search-time `oversample` (same stores):", ""]
        lines += ["| task | quantize | " + " | ".join(values) + " |", "|---|---|" + "---|" * len(values)]
        for n, r in swept:
            cells = [
                f"{r['oversample_sweep'][v]['overlap_at_10_with_exact']:.4f}" if v in r["oversample_sweep"] else "-"
                for v in values
            ]
            lines.append(f"| {n} | {r['setting']} | " + " | ".join(cells) + " |")
    return lines


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
            # rows measured by different runs may sweep different values: "-" where a row has none
            values = sorted({v for r in sweeps for v in r["oversample_sweep"]}, key=float)
            lines += ["", "recall@10 by search-time `oversample` (same builds):", ""]
            lines += ["| quantize | " + " | ".join(values) + " |", "|---|" + "---|" * len(values)]
            for r in sweeps:
                sweep = r["oversample_sweep"]
                cells = [f"{sweep[v]['recall_at_10']:.4f}" if v in sweep else "-" for v in values]
                lines.append(f"| {r['setting']} | " + " | ".join(cells) + " |")
    devs = [d for d in (result.get("dev"), *result.get("dev_models", [])) if d and d.get("tasks")]
    for dev in devs:
        lines += render_dev(dev)
    listed = [c for part in (syn, *devs) if part for c in part.get("commands", [part.get("command")]) if c]
    commands = list(dict.fromkeys(listed))
    lines += ["", "Measured by " + " and ".join(f"`{c}`" for c in commands) + ".", "", END]
    return "\n".join(lines)


def write_docs(path: Path, section: str) -> None:
    text = path.read_text("utf-8") if path.exists() else ""
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
    parser.add_argument(
        "--pq-m", type=int, default=0, help="PQ bytes per vector, dividing the dimension (0: dim/8, 96 at 768 dims)"
    )
    parser.add_argument("--oversample-sweep", default="2,4,10,20,40")
    parser.add_argument("--tasks", default=",".join(TASKS))
    shared = Path(os.environ.get("CARE_SHARED_DATA") or REPO.parent / "shared" / "data")
    parser.add_argument("--data-root", type=Path, default=shared / "tasks", help="folder of the dev tasks")
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="PATH",
        help="saved CARE model(s) scored on the dev tasks instead of the random tower (repeatable or comma list)",
    )
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
    models = model_paths(args.model)
    missing = [m for m in models if not (Path(m) / "care_config.json").is_file()]
    if missing:
        parser.error(f"--model: not a saved CARE model folder (no care_config.json): {', '.join(missing)}")
    if models and args.skip_tasks:
        parser.error("--model scores the dev tasks: drop --skip-tasks")
    result = json.loads(args.json.read_text()) if args.json.exists() else {}
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp_name:
        tmp = Path(tmp_name)
        command = "python -m benchmarks.quantization " + " ".join(sys.argv[1:] if argv is None else argv)
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
        # a note of an older version of this script, replaced by the trained models' own rows
        result.pop("trained_model", None)
        loaded = {} if args.skip_tasks else load_tasks(args)
        if not args.skip_tasks and not loaded:
            print(f"no dev task under {args.data_root}: skipped", file=sys.stderr)
        elif loaded and not models:
            result["dev"] = merge_rows(result.get("dev"), run_tasks(args, tmp, loaded), command)
        elif loaded:
            entries = {d["model"]: d for d in result.get("dev_models", [])}
            for path in models:
                entries[path] = merge_rows(entries.get(path), run_model(args, tmp, loaded, path), command)
            result["dev_models"] = list(entries.values())
    args.json.write_text(json.dumps(result, indent=2))
    write_docs(args.docs, render(result))
    print(render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
