"""A LangChain retriever over a CARE index (FAISS or Qdrant), opened without re-encoding.

care-retriever index --model M --corpus corpus.jsonl --store faiss:stores/med
python examples/langchain_retriever.py --model M --store faiss:stores/med "血压高怎么办"
python examples/langchain_retriever.py --model M --store qdrant:stores/q --corpus corpus.jsonl "血压高怎么办"
"""

from __future__ import annotations

import argparse

from langchain_core.documents import Document

from care_retriever import read_corpus
from care_retriever.integrations.langchain import CareEmbeddings, CareVectorStore


def main(argv: list[str] | None = None) -> list[Document]:
    parser = argparse.ArgumentParser(description="Query a CARE store through a LangChain VectorStoreRetriever.")
    parser.add_argument("query")
    parser.add_argument("--model", required=True, help="CARE model folder")
    parser.add_argument("--store", required=True, help="faiss:DIR | qdrant:PATH | qdrant:http://host:6333")
    parser.add_argument("--corpus", help="add this JSONL corpus first (document tower)")
    parser.add_argument("--k", type=int, default=5)
    args = parser.parse_args(argv)
    # embed_query -> query tower, embed_documents -> document tower; each loaded on first use.
    embeddings = CareEmbeddings(model=args.model)
    store = CareVectorStore(args.store, embeddings)
    if args.corpus:
        docs = [
            Document(id=d.id, page_content=d.text, metadata={**d.metadata, "title": d.title})
            for d in read_corpus(args.corpus)
        ]
        store.add_documents(docs)
    retriever = store.as_retriever(search_kwargs={"k": args.k})
    hits = retriever.invoke(args.query)
    for rank, doc in enumerate(hits, 1):
        print(f"{rank:>2}. [{doc.id}]  {doc.metadata.get('title', '')} | {doc.page_content[:60]}")
    store.close()
    return hits


if __name__ == "__main__":
    main()
