"""A hybrid Haystack pipeline over one care-retriever store: CARE dense + BM25, joined by Haystack's RRF.

care-retriever index --model M --corpus corpus.jsonl --store faiss:stores/med   # writes both sides
python examples/haystack_hybrid.py --model M --store faiss:stores/med "血压高怎么办"

The query tower embeds the question for ``CareStoreRetriever`` (dense); ``CareStoreBM25Retriever`` reads the
store's BM25 side with the same text; Haystack's own ``DocumentJoiner(join_mode="reciprocal_rank_fusion")``
fuses the two rankings (its RRF constant is 60 with ranks from 1: the order of
``care-retriever search --mode hybrid --fusion rrf --rrf-k 60``). ``CareStoreRetriever(mode="hybrid")``
does the same in one component with the project's measured defaults (docs/hybrid.md).
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")  # offline: no usage pings

from haystack import Document, Pipeline
from haystack.components.joiners import DocumentJoiner
from haystack_integrations.components.embedders.care_retriever import CareTextEmbedder
from haystack_integrations.components.retrievers.care_retriever import CareStoreBM25Retriever, CareStoreRetriever

CANDIDATES = 100  # each side's depth before fusion, as search --mode hybrid


def build(model: str, store: str, top_k: int) -> Pipeline:
    pipeline = Pipeline()
    pipeline.add_component("embedder", CareTextEmbedder(model))
    pipeline.add_component("dense", CareStoreRetriever(store, model=model, top_k=CANDIDATES))
    pipeline.add_component("bm25", CareStoreBM25Retriever(store, top_k=CANDIDATES))
    pipeline.add_component("joiner", DocumentJoiner(join_mode="reciprocal_rank_fusion", top_k=top_k))
    pipeline.connect("embedder.embedding", "dense.query_embedding")
    pipeline.connect("dense.documents", "joiner.documents")
    pipeline.connect("bm25.documents", "joiner.documents")
    return pipeline


def main(argv: list[str] | None = None) -> list[Document]:
    parser = argparse.ArgumentParser(description="Hybrid (dense + BM25, RRF) search of a care-retriever store.")
    parser.add_argument("query")
    parser.add_argument("--model", required=True, help="CARE model folder")
    parser.add_argument("--store", required=True, help="store spec, e.g. faiss:stores/med")
    parser.add_argument("--top-k", type=int, default=5)
    args = parser.parse_args(argv)
    pipeline = build(args.model, args.store, args.top_k)
    try:
        hits = pipeline.run({"embedder": {"text": args.query}, "bm25": {"query": args.query}})["joiner"]["documents"]
    finally:
        for name in ("dense", "bm25"):  # release the store (Qdrant local mode allows one client per folder)
            pipeline.get_component(name).close()
    for rank, doc in enumerate(hits, 1):
        print(f"{rank:>2}. {doc.score:.4f}  [{doc.id}]  {doc.meta.get('title', '')} | {(doc.content or '')[:60]}")
    return hits


if __name__ == "__main__":
    main()
