"""Haystack pipelines over CARE: index with the document tower, query with the query tower.

care-retriever index --model M --corpus corpus.jsonl --store faiss:stores/med   # or --corpus below
python examples/haystack_pipeline.py --model M --store faiss:stores/med "血压高怎么办"   # or the folder: stores/med
python examples/haystack_pipeline.py --model M --store stores/new --corpus corpus.jsonl "血压高怎么办"
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")  # offline: no usage pings

from haystack import Document, Pipeline
from haystack.components.writers import DocumentWriter
from haystack.document_stores.types import DuplicatePolicy
from haystack_integrations.components.embedders.care_retriever import CareDocumentEmbedder, CareTextEmbedder
from haystack_integrations.components.retrievers.care_retriever import CareFaissEmbeddingRetriever
from haystack_integrations.document_stores.care_retriever import CareFaissDocumentStore

from care_retriever import read_corpus
from care_retriever.errors import CareError


def main(argv: list[str] | None = None) -> list[Document]:
    parser = argparse.ArgumentParser(description="Index (optional) and query a CARE FAISS store with Haystack.")
    parser.add_argument("query")
    parser.add_argument("--model", required=True, help="CARE model folder")
    parser.add_argument(
        "--store", required=True, help="faiss:DIR (the spec `care-retriever index` takes) or the FAISS folder"
    )
    parser.add_argument("--corpus", help="index this JSONL corpus first")
    parser.add_argument("--top-k", type=int, default=5)
    args = parser.parse_args(argv)
    try:
        store = CareFaissDocumentStore(args.store, model=args.model)  # a qdrant: spec is refused in one line
    except CareError as exc:
        parser.exit(2, f"error: {exc}\n")
    if not args.corpus and store.count_documents() == 0:  # an empty answer would look like "nothing matched"
        parser.exit(2, f"error: {args.store}: the store holds no documents (index a corpus first, or pass --corpus)\n")
    if args.corpus:  # document tower -> store
        docs = [
            Document(id=d.id, content=d.text, meta={**d.metadata, "title": d.title}) for d in read_corpus(args.corpus)
        ]
        indexing = Pipeline()
        indexing.add_component("embedder", CareDocumentEmbedder(args.model))
        indexing.add_component("writer", DocumentWriter(store, policy=DuplicatePolicy.OVERWRITE))
        indexing.connect("embedder.documents", "writer.documents")
        indexing.run({"embedder": {"documents": docs}})
    query = Pipeline()  # query tower -> retriever; the document tower is never loaded here
    query.add_component("embedder", CareTextEmbedder(args.model))
    query.add_component("retriever", CareFaissEmbeddingRetriever(store, top_k=args.top_k))
    query.connect("embedder.embedding", "retriever.query_embedding")
    hits = query.run({"embedder": {"text": args.query}})["retriever"]["documents"]
    for rank, doc in enumerate(hits, 1):
        print(f"{rank:>2}. {doc.score:.4f}  [{doc.id}]  {doc.meta.get('title', '')} | {(doc.content or '')[:60]}")
    return hits


if __name__ == "__main__":
    main()
