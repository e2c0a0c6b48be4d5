"""Store settings (quantization, oversampling, on-disk vectors, shards, replicas) through the framework constructors.

LangChain's ``CareVectorStore`` writes FAISS folders and Qdrant collections, Haystack's ``CareFaissDocumentStore``
FAISS folders; each takes ``index_options``, checks it when built (one line), and the store created at the first
write holds those settings, read back from the store itself (Qdrant's collection info, the FAISS store's footprint).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import pytest
from haystack import Document as HaystackDocument
from langchain_core.embeddings import DeterministicFakeEmbedding

from care_retriever.errors import InputError, StoreError
from care_retriever.integrations.haystack import CareFaissDocumentStore
from care_retriever.integrations.langchain import CareVectorStore
from care_retriever.stores.faiss import FaissStore

DIM = 16
TEXTS = [f"passage {i} about {w}" for i, w in enumerate(["fever", "cough", "rash", "nausea", "headache"] * 4)]


def _vectors(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    vectors = rng.normal(size=(n, DIM)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_langchain_qdrant_collection_takes_every_setting(tmp_path: Path) -> None:
    spec = f"qdrant:{tmp_path / 'q'}"
    options = {"quantize": "binary", "on_disk": True, "oversample": 4, "always_ram": True, "shards": 2}
    store = CareVectorStore(spec, DeterministicFakeEmbedding(size=DIM), index_options=options)
    assert store.index_options == options
    ids = store.add_texts(TEXTS, ids=[f"t{i}" for i in range(len(TEXTS))])
    held = store.store.collection_settings()  # what Qdrant Edge holds, not our manifest
    assert (held["quantize"], held["on_disk"], held["always_ram"], held["shards"]) == ("binary", True, True, 1)
    assert store.store.manifest is not None and store.store.manifest.index["oversample"] == 4.0
    assert store.similarity_search(TEXTS[3], k=1)[0].page_content == TEXTS[3]
    store.delete(ids[:2])
    assert store.store.count() == len(TEXTS) - 2 and store.store.verify() == len(TEXTS) - 2
    store.close()
    again = CareVectorStore(spec, DeterministicFakeEmbedding(size=DIM), index_options=options)
    again.add_texts(["one more"], ids=["extra"])  # the same settings: written
    again.close()
    other = CareVectorStore(spec, DeterministicFakeEmbedding(size=DIM), index_options={"quantize": "sq8"})
    with pytest.raises(StoreError, match=r"created with quantize 'binary' \(asked 'sq8'\)"):
        other.add_texts(["refused"], ids=["refused"])
    assert other.store.count() == len(TEXTS) - 1
    other.close()


@pytest.mark.parametrize(
    ("backend", "options", "message"),
    [
        ("qdrant", {"quantize": "pq"}, "unknown Qdrant quantization 'pq'; valid: none, sq8, binary"),
        ("qdrant", {"shards": 0}, "shards must be an integer >= 1"),
        ("faiss", {"quantize": "int4"}, "Unknown FAISS quantize 'int4'"),
        ("faiss", {"quantize": "sq8", "shards": 2, "on_disk": True}, r"\['on_disk', 'shards'\] are Qdrant collection"),
    ],
)
def test_langchain_refuses_bad_settings_when_built(tmp_path: Path, backend: str, options: dict, message: str) -> None:
    with pytest.raises(InputError, match=message) as caught:
        CareVectorStore(f"{backend}:{tmp_path / 's'}", DeterministicFakeEmbedding(size=DIM), index_options=options)
    assert "\n" not in str(caught.value)


def test_langchain_faiss_store_takes_quantize_and_oversample(tmp_path: Path) -> None:
    store = CareVectorStore(
        f"faiss:{tmp_path / 'f'}",
        DeterministicFakeEmbedding(size=DIM),
        index_options={"quantize": "sq8", "oversample": 3},
    )
    texts = [f"note {i}" for i in range(300)]  # FAISS trains its int8 ranges on the first write: 256 vectors at least
    store.add_texts(texts)
    footprint = store.store.footprint()
    assert footprint["quantize"] == "sq8" and footprint["oversample"] == 3.0
    assert store.similarity_search(texts[7], k=1)[0].page_content == texts[7]
    store.close()


def test_haystack_document_store_round_trips_and_applies_its_settings(tmp_path: Path) -> None:
    options = {"quantize": "binary", "oversample": 4}
    store = CareFaissDocumentStore(str(tmp_path / "f"), embedding_dim=DIM, index_options=options)
    data = store.to_dict()
    assert data["init_parameters"]["index_options"] == options
    clone = CareFaissDocumentStore.from_dict(data)
    assert clone.to_dict() == data
    vectors = _vectors(len(TEXTS))
    docs = [
        HaystackDocument(id=f"h{i}", content=t, embedding=v.tolist())
        for i, (t, v) in enumerate(zip(TEXTS, vectors, strict=True))
    ]
    assert clone.write_documents(docs) == len(TEXTS)
    with contextlib.closing(FaissStore(tmp_path / "f")) as written:  # the folder the clone wrote, read on its own
        footprint = written.footprint()
    assert footprint["quantize"] == "binary" and footprint["oversample"] == 4.0
    hits = clone.embedding_retrieval(vectors[5].tolist(), top_k=3)
    exact = [f"h{i}" for i in np.argsort(-(vectors @ vectors[5]))[:3]]
    assert [h.id for h in hits] == exact  # rescored: the exact top 3
    clone.close()
    store.close()
    with pytest.raises(InputError, match=r"\['replicas'\] are Qdrant collection settings"):
        CareFaissDocumentStore(str(tmp_path / "g"), index_options={"replicas": 2})
