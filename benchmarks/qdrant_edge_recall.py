"""Qdrant Edge (``qdrant:PATH``) at its defaults against exact search on real dev queries: the kuake-qtr corpus
encoded once by the ``tiny`` tower (random weights, tokenizers trained offline on the corpus) into an exact FAISS
store, copied into an Edge store with nothing re-encoded (``copy_store``), and the dev queries searched in both.

    python -m benchmarks.qdrant_edge_recall            # prints a Markdown table; quoted in benchmarks/results/scale.md

A tower this small gives narrow vectors, which Edge would search by brute force below its indexing threshold
(10,000 KB); the Edge copy sets ``indexing_threshold`` to 1 KB so its HNSW graph is built and searched, and the
table reports what the engine built. ``$CARE_SHARED_DATA`` (default /work/shared/data) holds the task.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

SHARED = Path(os.environ.get("CARE_SHARED_DATA") or "/work/shared/data")
TASK = SHARED / "tasks" / "kuake-qtr-retrieval"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", type=Path, default=TASK)
    parser.add_argument("--top-k", type=int, default=10)
    args = parser.parse_args(argv)
    if not (args.task / "corpus.jsonl").is_file():
        print(f"{args.task}: task not found (set CARE_SHARED_DATA)")
        return 0

    from care_retriever import DocumentStoreWriter, read_corpus
    from care_retriever.documents import iter_jsonl
    from care_retriever.model.scratch import init_from_scratch
    from care_retriever.stores import open_store
    from care_retriever.stores.config import QdrantCollectionConfig
    from care_retriever.stores.copying import copy_store

    corpus = args.task / "corpus.jsonl"
    queries = [row["text"] for _, row in iter_jsonl(args.task / "queries.jsonl")]
    with tempfile.TemporaryDirectory() as work:
        embedder = init_from_scratch("tiny", [corpus])
        exact, edge = f"faiss:{work}/exact", f"qdrant:{work}/edge"
        started = time.perf_counter()
        writer = DocumentStoreWriter(embedder, exact, show_progress=False, sparse=False)
        writer.write(read_corpus(corpus, skip_invalid=True))
        encoded = time.perf_counter() - started
        vectors = embedder.embed_queries(queries)
        exact_store = open_store(exact, create=False)
        truth = [[h.id for h in hits] for hits in exact_store.search(vectors, args.top_k, payload=False)]
        exact_store.close()
        rows, built, copied = [], {}, 0.0
        # Edge's own search ef is its ef_construct (100); the store's default when none is recorded is 512
        for name, ef in (("Edge, defaults (ef 512)", None), ("Edge, ef 100 (the engine's own)", 100)):
            started = time.perf_counter()
            target = f"{edge}-{ef or 'default'}"
            copy_store(exact, target, index=QdrantCollectionConfig(indexing_threshold=1, ef_search=ef), sparse=False)
            copied = time.perf_counter() - started
            edge_store = open_store(target, create=False)
            built = edge_store.collection_settings()
            started = time.perf_counter()
            found = [[h.id for h in edge_store.search(v[None, :], args.top_k, payload=False)[0]] for v in vectors]
            per_query = (time.perf_counter() - started) / len(queries)
            edge_store.close()
            overlap = [len(set(t) & set(f)) / max(len(t), 1) for t, f in zip(truth, found, strict=True)]
            rows.append((name, float(np.mean(overlap)), per_query * 1000))
    print(f"kuake-qtr: {len(queries)} dev queries, {embedder.dim}-d tiny tower")
    print(f"encode into exact FAISS {encoded:.1f} s; copy into Edge (incl. optimize) {copied:.1f} s")
    print(f"engine built: {built}")
    print(f"| store | recall@{args.top_k} vs exact | ms/query |")
    print("|---|---|---|")
    for name, value, ms in rows:
        print(f"| {name} | {value:.3f} | {ms:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
