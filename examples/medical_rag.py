"""Medical RAG with CARE: index a corpus, retrieve, build a grounded prompt with numbered citations, answer.

    care-retriever quickstart                       # once: trains the miniature model this example uses
    python examples/medical_rag.py "高血压患者饮食要注意什么？"
    python examples/medical_rag.py --framework haystack --corpus my.jsonl --model models/care "..."

Steps (one function each, top to bottom): ``index_and_retrieve`` (plain care-retriever, Haystack or
LangChain: the same model, the same FAISS folder format, the same hits), ``build_prompt`` (numbered
passages, answer only from them, cite [n]), ``generate`` (any OpenAI-compatible chat endpoint when
OPENAI_BASE_URL and CARE_LLM_MODEL are set, OPENAI_API_KEY if it needs one; otherwise an offline
extractive answer quoting the best sentence of each top passage with its citation).
Demo data and output are not medical advice (仅供演示，不构成医疗建议).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

QUICKSTART_MODEL = Path("care-quickstart/model")  # where `care-retriever quickstart` leaves its model
SAMPLE_CORPUS = Path(__file__).resolve().parents[1] / "care_retriever" / "data" / "sample" / "corpus.jsonl"
DEFAULT_QUESTION = "高血压患者在饮食上需要注意什么？"


@dataclass
class Passage:
    id: str
    title: str
    text: str
    score: float


def index_and_retrieve(framework: str, model: str, corpus: Path, store: Path, question: str, k: int) -> list[Passage]:
    """Encode ``corpus`` into a FAISS folder with the document tower, then retrieve with the query tower."""
    from care_retriever import read_corpus

    docs = list(read_corpus(corpus))
    if framework == "haystack":
        os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")  # offline demo: no usage pings
        from haystack import Document, Pipeline
        from haystack.components.writers import DocumentWriter
        from haystack.document_stores.types import DuplicatePolicy

        from care_retriever.integrations.haystack import (
            CareDocumentEmbedder,
            CareFaissDocumentStore,
            CareFaissEmbeddingRetriever,
            CareTextEmbedder,
        )

        faiss_store = CareFaissDocumentStore(str(store), model=model)
        indexing = Pipeline()
        indexing.add_component("embed", CareDocumentEmbedder(model, progress_bar=False))
        indexing.add_component("write", DocumentWriter(faiss_store, policy=DuplicatePolicy.OVERWRITE))
        indexing.connect("embed.documents", "write.documents")
        haystack_docs = [Document(id=d.id, content=d.text, meta={**d.metadata, "title": d.title}) for d in docs]
        indexing.run({"embed": {"documents": haystack_docs}})
        query = Pipeline()
        query.add_component("embed", CareTextEmbedder(model))
        query.add_component("retrieve", CareFaissEmbeddingRetriever(faiss_store, top_k=k))
        query.connect("embed.embedding", "retrieve.query_embedding")
        found = query.run({"embed": {"text": question}})["retrieve"]["documents"]
        return [Passage(d.id, d.meta.get("title", ""), d.content or "", d.score or 0.0) for d in found]
    if framework == "langchain":
        from langchain_core.documents import Document

        from care_retriever.integrations.langchain import CareEmbeddings, CareVectorStore

        lc_docs = [Document(id=d.id, page_content=d.text, metadata={**d.metadata, "title": d.title}) for d in docs]
        vectors = CareVectorStore.from_documents(lc_docs, CareEmbeddings(model=model), store=f"faiss:{store}")
        found = vectors.similarity_search_with_score(question, k=k)
        return [Passage(d.id or "", d.metadata.get("title", ""), d.page_content, s) for d, s in found]
    from care_retriever import AsymmetricEmbedder, CareRetriever, DocumentStoreWriter

    embedder = AsymmetricEmbedder.from_pretrained(model)  # both towers: this process indexes, then searches
    DocumentStoreWriter(embedder, f"faiss:{store}", show_progress=False).write(docs)
    hits = CareRetriever(f"faiss:{store}", embedder).search(question, top_k=k)
    return [Passage(h.id, h.title, h.text, h.score) for h in hits]


def build_prompt(question: str, passages: list[Passage]) -> str:
    """A grounded prompt: numbered sources, answer only from them, cite every claim as [n]."""
    sources = "\n".join(
        f"[{n}] {p.title}：{p.text}" if p.title else f"[{n}] {p.text}" for n, p in enumerate(passages, 1)
    )
    return (
        "你是医学信息助手。只根据下面编号的资料回答问题，每句话后用 [编号] 标注出处；"
        "资料不足以回答时直接说明。回答仅供参考，不构成医疗建议。\n\n"
        f"资料：\n{sources}\n\n问题：{question}\n回答："
    )


def generate(prompt: str, question: str, passages: list[Passage]) -> str:
    """The LLM's answer if an OpenAI-compatible endpoint is configured, else an extractive one."""
    base, model = os.environ.get("OPENAI_BASE_URL"), os.environ.get("CARE_LLM_MODEL")
    if base and model:
        try:
            return chat_completion(base, model, os.environ.get("OPENAI_API_KEY"), prompt)
        except (OSError, ValueError, KeyError) as exc:
            print(f"warning: LLM call failed ({exc}); falling back to the extractive answer", file=sys.stderr)
    return extractive_answer(question, passages)


def chat_completion(base_url: str, model: str, api_key: str | None, prompt: str) -> str:
    """One plain-HTTP call to ``{base_url}/chat/completions`` (OpenAI, vLLM, llama.cpp, Ollama, ...)."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "temperature": 0}
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    request = urllib.request.Request(f"{base_url.rstrip('/')}/chat/completions", json.dumps(body).encode(), headers)
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())["choices"][0]["message"]["content"].strip()


def extractive_answer(question: str, passages: list[Passage], max_quotes: int = 3) -> str:
    """Quote, from each top passage, the sentence sharing most character bigrams with the question."""
    wanted = {question[i : i + 2] for i in range(len(question) - 1)}
    lines = []
    for n, passage in enumerate(passages[:max_quotes], 1):
        sentences = [s for s in re.split(r"(?<=[。！？!?；;])", passage.text) if s.strip()] or [passage.text]
        best = max(sentences, key=lambda s: len(wanted & {s[i : i + 2] for i in range(len(s) - 1)}))
        lines.append(f"- {best.strip()} [{n}]")
    return "根据检索到的资料（离线摘录，仅供参考，不构成医疗建议）：\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("question", nargs="?", default=DEFAULT_QUESTION)
    parser.add_argument("--model", help=f"CARE model folder (default: {QUICKSTART_MODEL} if it exists)")
    parser.add_argument("--corpus", type=Path, default=SAMPLE_CORPUS, help="JSONL / BEIR folder / text corpus")
    parser.add_argument("--framework", choices=["care", "haystack", "langchain"], default="care")
    parser.add_argument("--store", type=Path, help="FAISS folder to (re)use (default: a temporary one)")
    parser.add_argument("--top-k", type=int, default=3)
    args = parser.parse_args(argv)
    model = args.model or (str(QUICKSTART_MODEL) if QUICKSTART_MODEL.is_dir() else None)
    if model is None:
        print("error: no model: run `care-retriever quickstart` (it writes care-quickstart/model) "
              "or pass --model DIR", file=sys.stderr)  # fmt: skip
        return 2
    from care_retriever.errors import CareError

    with tempfile.TemporaryDirectory(prefix="medical-rag-") as tmp:
        try:
            passages = index_and_retrieve(args.framework, model, args.corpus, args.store or Path(tmp) / "store",
                                          args.question, args.top_k)  # fmt: skip
        except CareError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    prompt = build_prompt(args.question, passages)
    print(f"问题：{args.question}\n\n检索结果（{args.framework}）：")
    for n, p in enumerate(passages, 1):
        print(f"  [{n}] {p.score:.3f}  {p.id}  {p.title}")
    print(f"\n回答：\n{generate(prompt, args.question, passages)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
