"""The dev-task part of ``benchmarks.quantization``: each task's corpus encoded once by a tower pair (a random-weight
one of a preset, or a saved CARE model), stored with each setting; nDCG@10 against the task's qrels and overlap@10
with the exact ranking, and the rows merged with those of earlier runs.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.quantization_settings import CHUNK, SETTINGS, store_options


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
    from care_retriever.model.scratch import build_random_towers

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
