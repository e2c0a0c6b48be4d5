"""The store contract is a small core plus optional capabilities that callers check.

- Every store kind claims exactly the capabilities listed for it here, and ``isinstance`` agrees.
- The core is the abstract methods every store must write, and no more.
- A store that implements the core alone (an in-memory store defined here: the input of the callers under test)
  is searched and counted by the callers that need only the core, and refused in one line, naming the store, its
  kind and the capability, by each caller that needs more; nothing is written.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from care_retriever.documents import Document
from care_retriever.errors import StoreError
from care_retriever.indexing.checks import check_prune
from care_retriever.indexing.space import check_store_space
from care_retriever.indexing.writer import DocumentStoreWriter
from care_retriever.search.hybrid import hybrid_search
from care_retriever.search.retriever import CareRetriever
from care_retriever.stores.base import Filters, Hit, Manifest, VectorStore
from care_retriever.stores.capabilities import (
    CAPABILITIES,
    SparseSearch,
    StoredIteration,
    WriteRuns,
    capabilities_of,
)
from care_retriever.stores.config import StoreConfig
from care_retriever.stores.copying import copy_store
from care_retriever.stores.faiss import FaissStore
from care_retriever.stores.qdrant import QdrantStore
from care_retriever.stores.qdrant.edge_store import EdgeStore
from care_retriever.stores.qdrant.server import ServerStore
from care_retriever.stores.training_sample import require_training_sample

DIM = 8
SPACE = "capability-space"
EVERY = frozenset(CAPABILITIES)
CLAIMS = {FaissStore: EVERY, EdgeStore: EVERY, ServerStore: EVERY}
CORE = {"describe", "prepare", "upsert", "delete", "search", "get", "count", "content_hashes"}


class CoreOnlyStore(VectorStore):
    """The core and nothing else: documents and unit vectors in dictionaries, exact inner-product search."""

    backend = "memory"

    def __init__(self) -> None:
        self.manifest: Manifest | None = None
        self.documents: dict[str, Document] = {}
        self.rows: dict[str, np.ndarray] = {}

    def describe(self) -> str:
        return "memory:test"

    def prepare(
        self, dim: int, space_fingerprint: str, model_name: str, index: StoreConfig = None, *, metric: str = "cosine"
    ) -> None:
        if self.manifest is None:
            self.manifest = Manifest(self.backend, dim, space_fingerprint, model_name, metric)
        self.check_compatible(space_fingerprint, dim)

    def upsert(
        self, documents: Sequence[Document], vectors: np.ndarray, *, sparse_tokens: Sequence[list[str]] | None = None
    ) -> None:
        for document, vector in zip(documents, vectors, strict=True):
            self.documents[document.id], self.rows[document.id] = document, np.asarray(vector, dtype=np.float32)

    def delete(self, ids: Sequence[str]) -> int:
        held = [i for i in ids if i in self.documents]
        for i in held:
            del self.documents[i], self.rows[i]
        return len(held)

    def search(
        self, vectors: np.ndarray, top_k: int, filters: Filters | None = None, *, payload: bool = True
    ) -> list[list[Hit]]:
        ids = list(self.rows)
        matrix = np.stack([self.rows[i] for i in ids]) if ids else np.empty((0, DIM), dtype=np.float32)
        out = []
        for scores in np.atleast_2d(vectors) @ matrix.T:
            best = np.argsort(-scores)[:top_k]
            out.append([Hit(ids[j], float(scores[j]), self.documents[ids[j]].text) for j in best])
        return out

    def get(self, ids: Sequence[str]) -> list[Document | None]:
        return [self.documents.get(i) for i in ids]

    def count(self, filters: Filters | None = None) -> int:
        return len(self.documents)

    def content_hashes(self, ids: Sequence[str]) -> dict[str, str]:
        return {i: self.documents[i].content_hash() for i in ids if i in self.documents}


class HashingEncoder:
    """Both sides of a model as unit vectors from a hash of each text; no torch tower."""

    dim = query_dim = DIM
    mode = "asymmetric"
    loaded_towers = ("query", "document")
    space_fingerprint = SPACE
    document_model_name = "hashing"
    similarity = "cosine"
    document_model = None

    def embed_documents(self, texts: Sequence[str], **options: Any) -> np.ndarray:
        rows = [np.frombuffer(hashlib.sha256(t.encode()).digest()[:DIM], dtype=np.uint8) - 127.5 for t in texts]
        matrix = np.asarray(rows, dtype=np.float32).reshape(len(texts), DIM)
        return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)

    def embed_queries(self, queries: Sequence[str], **options: Any) -> np.ndarray:
        return self.embed_documents(queries)


DOCS = [Document(id=f"d{i}", text=f"第{i}号文档：高血压患者应低盐饮食") for i in range(6)]


@pytest.fixture
def core_store() -> CoreOnlyStore:
    store = CoreOnlyStore()
    store.prepare(DIM, SPACE, "hashing")
    store.upsert(DOCS, HashingEncoder().embed_documents([d.text for d in DOCS]))
    return store


def test_core_is_the_abstract_methods_every_store_writes() -> None:
    assert set(VectorStore.__abstractmethods__) == CORE
    assert not CORE & {"verify", "iter_documents", "commit", "search_sparse", "local_footprint"}


@pytest.mark.parametrize("kind", list(CLAIMS), ids=lambda k: k.__name__)
def test_each_store_kind_claims_exactly_its_capabilities(kind: type[VectorStore]) -> None:
    assert capabilities_of(kind) == CLAIMS[kind]


def test_opened_stores_are_instances_of_what_their_kind_claims(tmp_path: Path) -> None:
    opened = [FaissStore(tmp_path / "f"), QdrantStore(str(tmp_path / "q")), QdrantStore(":memory:")]
    try:
        for store in opened:
            claimed = CLAIMS[type(store)]
            assert {c for c in CAPABILITIES if isinstance(store, c)} == claimed, store.describe()
    finally:
        for store in opened:
            store.close()
    assert capabilities_of(CoreOnlyStore()) == frozenset()


def test_callers_that_need_only_the_core_take_a_core_only_store(core_store: CoreOnlyStore, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("{}\n", encoding="utf-8")
    # no index built on this machine: nothing to train, no local disk to check
    require_training_sample(core_store, DIM, None, 1, "corpus.jsonl")
    check_store_space(core_store, total=10**12, corpus=corpus, dim=DIM, sparse=False, index=None)
    retriever = CareRetriever(core_store, HashingEncoder())
    hits = retriever.search(DOCS[2].text, top_k=1)
    assert [h.id for h in hits] == ["d2"]


def _refusals(core_store: CoreOnlyStore, tmp_path: Path) -> dict[str, tuple[Any, type[VectorStore]]]:
    vectors = HashingEncoder().embed_queries(["低盐"])
    retriever = CareRetriever(core_store, HashingEncoder())
    return {
        "index writer": (lambda: DocumentStoreWriter(HashingEncoder(), core_store, show_progress=False), WriteRuns),
        "sparse search": (lambda: retriever.search("低盐", mode="sparse"), SparseSearch),
        "hybrid search": (lambda: hybrid_search(core_store, vectors, ["低盐"], 3), SparseSearch),
        "prune": (lambda: check_prune(core_store, set(), confirmed=True), StoredIteration),
        "copy from": (lambda: copy_store(core_store, f"faiss:{tmp_path / 'copy'}"), StoredIteration),
    }


@pytest.mark.parametrize("caller", ["index writer", "sparse search", "hybrid search", "prune", "copy from"])
def test_a_caller_refuses_a_store_without_its_capability_in_one_line(
    caller: str, core_store: CoreOnlyStore, tmp_path: Path
) -> None:
    call, capability = _refusals(core_store, tmp_path)[caller]
    with pytest.raises(StoreError) as raised:
        call()
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("memory:test: a memory store has no ")
    assert capability.capability in message
    assert core_store.count() == len(DOCS)
    assert not (tmp_path / "copy").exists()  # the copy's target was never created


def test_copy_into_a_store_without_write_runs_is_refused_before_writing(tmp_path: Path) -> None:
    source = FaissStore(tmp_path / "src")
    with source.transaction(DIM, SPACE, "hashing"):
        source.upsert(DOCS, HashingEncoder().embed_documents([d.text for d in DOCS]))
    target = CoreOnlyStore()
    expected = f"memory:test: a memory store has no {WriteRuns.capability}, which copy (its target) needs"
    with pytest.raises(StoreError, match=re.escape(expected)):
        copy_store(source, target)
    assert target.manifest is None and target.count() == 0
    source.close()
