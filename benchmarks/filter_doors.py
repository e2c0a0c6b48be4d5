"""The doors of the filter agreement run (:mod:`benchmarks.filter_agreement`), each over the stores it builds: the
Python API (``CareRetriever.search``), the HTTP service (``POST /search`` through FastAPI's ``TestClient``, in
process), LangChain (``CareVectorStore.similarity_search_with_score``) and Haystack (``CareStoreRetriever``; it
opens a store from its spec, so it reads the FAISS folder beside the store the run holds open). A door takes a
query text, filters and ``k``, and gives the ranked ``(id, score)`` pairs it answers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from care_retriever.stores.base import VectorStore

Ranked = list[tuple[str, float]]
Door = Callable[[str, Any, int], Ranked]
TINY_MODEL_SEED = 0


def tiny_model(folder: Path) -> Any:
    """A tiny CARE model with random weights (tokenizers trained on the shipped sample), saved in ``folder``: the
    query tower the text doors encode with; returned loaded."""
    from care_retriever.model.scratch import init_from_scratch

    sample = Path(__file__).resolve().parents[1] / "care_retriever" / "data" / "sample" / "corpus.jsonl"
    embedder = init_from_scratch("tiny", [sample], seed=TINY_MODEL_SEED)
    embedder.save_pretrained(folder)
    return embedder


def _python_door(store: VectorStore, embedder: Any) -> Door:
    from care_retriever.search.retriever import CareRetriever

    retriever = CareRetriever(store, embedder)
    return lambda text, filters, k: [(h.id, h.score) for h in retriever.search(text, k, filters)]


def _service_door(store: VectorStore, embedder: Any, stack: contextlib.ExitStack) -> Door:
    from fastapi.testclient import TestClient

    from care_retriever.search.retriever import CareRetriever
    from care_retriever.search.server import create_app

    client = stack.enter_context(TestClient(create_app(CareRetriever(store, embedder))))

    def search(text: str, filters: Any, k: int) -> Ranked:
        response = client.post("/search", json={"query": text, "top_k": k, "filters": filters})
        if response.status_code != 200:
            raise AssertionError(f"service answered {response.status_code}: {response.text}")
        return [(h["id"], h["score"]) for h in response.json()["results"][0]["hits"]]

    return search


def _langchain_door(store: VectorStore, embedder: Any, model: Path) -> Door:
    from care_retriever.integrations.langchain import CareEmbeddings, CareVectorStore

    view = CareVectorStore(store, CareEmbeddings.from_embedder(embedder, model=str(model)))
    return lambda text, filters, k: [
        (d.id or "", score) for d, score in view.similarity_search_with_score(text, k, filter=filters)
    ]


def _haystack_door(spec: str, embedder: Any, model: Path, stack: contextlib.ExitStack) -> Door:
    from care_retriever.integrations.haystack import CareStoreRetriever

    retriever = CareStoreRetriever(spec, model=str(model))
    stack.callback(retriever.close)

    def search(text: str, filters: Any, k: int) -> Ranked:
        vector = embedder.embed_queries([text])[0].tolist()
        found = retriever.run(query_embedding=vector, filters=filters, top_k=k)["documents"]
        return [(d.id, float(d.score)) for d in found]

    return search


@contextlib.contextmanager
def opened_doors(
    stores: dict[str, VectorStore], embedder: Any, model: Path, faiss_spec: str
) -> Iterator[dict[str, Door]]:
    """Every door over every store, by name (``service on faiss``; Haystack on the FAISS store alone); closed on
    exit."""
    with contextlib.ExitStack() as stack:
        doors: dict[str, Door] = {}
        for name, store in stores.items():
            doors[f"python on {name}"] = _python_door(store, embedder)
            doors[f"service on {name}"] = _service_door(store, embedder, stack)
            doors[f"langchain on {name}"] = _langchain_door(store, embedder, model)
        doors["haystack on faiss"] = _haystack_door(faiss_spec, embedder, model, stack)
        yield doors
