"""The index writer knows an embedder and a store only through what their protocols declare, and a store takes
only the config of its kind: a user's dict of settings is read once where it is handed in.

- The writer indexes with a document encoder that implements :class:`DocumentEncoder` and nothing more (no torch
  tower, no ``device``): the store records the encoder's own similarity and name.
- A store's ``prepare`` / ``begin`` / ``transaction`` refuse a dict or the other kind's config in one line, before
  anything is created.
- What the free-space check and the writer's first-slice order need from a store is the store's to say
  (``local_footprint``, ``trains_on_first_vectors``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from care_retriever.documents import Document
from care_retriever.errors import InputError, WriteError
from care_retriever.indexing.space import check_store_space
from care_retriever.indexing.writer import DocumentStoreWriter
from care_retriever.model.protocols import DocumentEncoder
from care_retriever.stores.config import (
    FaissIndexConfig,
    IndexType,
    QdrantCollectionConfig,
    QdrantQuantize,
    Quantize,
    store_config,
)
from care_retriever.stores.faiss import FaissStore
from care_retriever.stores.qdrant import QdrantStore

DIM = 16
DOCS = [Document(id=f"d{i}", text=f"第{i}号文档：高血压患者应低盐饮食，第{i}条建议") for i in range(40)]


class HashingDocumentEncoder:
    """A document side with exactly the members :class:`DocumentEncoder` declares: unit vectors from a hash of each
    text (equal texts, equal vectors), no torch tower."""

    dim = DIM
    query_dim = DIM
    mode = "asymmetric"
    loaded_towers = ("document",)
    space_fingerprint = "hashing-space"
    document_model_name = "hashing-encoder"
    similarity = "dot"
    document_model = None

    def __init__(self) -> None:
        self.calls = 0

    def embed_documents(self, texts: Sequence[str], **options: Any) -> np.ndarray:
        self.calls += 1
        progress = options.get("progress")
        rows = [vector_of(text) for text in texts]
        if progress is not None:
            progress.update(len(texts))
        return np.stack(rows) if rows else np.zeros((0, DIM), dtype=np.float32)


def vector_of(text: str) -> np.ndarray:
    seed = int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")
    vector = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
    return vector / np.linalg.norm(vector)


def test_the_writer_indexes_with_an_encoder_that_implements_only_the_protocol(tmp_path: Path) -> None:
    encoder = HashingDocumentEncoder()
    assert isinstance(encoder, DocumentEncoder)
    writer = DocumentStoreWriter(encoder, f"faiss:{tmp_path / 's'}", show_progress=False, chunk_size=16)
    assert writer.background_tokenizer is False  # no torch tower: nothing runs on an accelerator
    report = writer.write(DOCS)
    assert report.added == len(DOCS) and report.count == len(DOCS) and encoder.calls >= 1
    with FaissStore(tmp_path / "s") as store:
        manifest = store.require_manifest()
        # what the encoder declares, recorded as it says (not a default in its place)
        assert (manifest.metric, manifest.model_name, manifest.dim) == ("dot", "hashing-encoder", DIM)
        assert manifest.space_fingerprint == "hashing-space"
        hit = store.search(vector_of(DOCS[7].embedding_text())[None, :], 1)[0][0]
        assert hit.id == "d7" and hit.score == pytest.approx(1.0, abs=1e-5)
    # a second run changes nothing: every content hash is stored
    again = DocumentStoreWriter(encoder, f"faiss:{tmp_path / 's'}", show_progress=False).write(DOCS)
    assert again.unchanged == len(DOCS) and again.encoded == 0
    # delete goes through the same declared members
    assert DocumentStoreWriter(encoder, f"faiss:{tmp_path / 's'}", show_progress=False).delete(["d0", "dx"]) == 1


def test_the_writer_trains_a_new_ivf_store_on_the_corpus_first_documents(tmp_path: Path) -> None:
    """The store says whether it trains on the first vectors; the writer then writes them in corpus order."""
    encoder = HashingDocumentEncoder()
    index = FaissIndexConfig(index_type=IndexType.IVF, nlist=2, nprobe=2)
    writer = DocumentStoreWriter(encoder, f"faiss:{tmp_path / 's'}", index=index, show_progress=False, chunk_size=40)
    assert writer.store.trains_on_first_vectors(index)
    assert writer.write(DOCS).count == len(DOCS)
    with FaissStore(tmp_path / "s") as store:
        assert store.require_manifest().index["type"] == "ivf"
        assert not store.trains_on_first_vectors(index)  # a published store's index is trained already


@pytest.mark.parametrize(
    "settings", [{"type": "hnsw"}, {"quantize": "sq8"}, QdrantCollectionConfig(quantize=QdrantQuantize.SQ8)]
)
def test_a_faiss_store_takes_only_its_config(tmp_path: Path, settings: Any) -> None:
    store = FaissStore(tmp_path / "s")
    for call in (
        lambda: store.prepare(DIM, "fp", "m", settings),
        lambda: store.begin(DIM, "fp", "m", settings),
        lambda: store.transaction(DIM, "fp", "m", settings).__enter__(),
        lambda: store.local_footprint(settings),
        lambda: store.trains_on_first_vectors(settings),
    ):
        with pytest.raises(InputError, match=r"a FAISS store takes a FaissIndexConfig") as caught:
            call()
        assert "\n" not in str(caught.value)
        if isinstance(settings, dict):
            assert "store_config" in str(caught.value)  # where a dict is read
    assert not (tmp_path / "s").exists() and not list(tmp_path.iterdir())  # nothing created, no lock left
    store.prepare(DIM, "fp", "m", FaissIndexConfig(index_type=IndexType.HNSW))  # the config itself is taken
    store.abort()


@pytest.mark.parametrize("settings", [{"quantize": "sq8"}, FaissIndexConfig(quantize=Quantize.SQ8)])
def test_a_qdrant_store_takes_only_its_config(settings: Any) -> None:
    store = QdrantStore(":memory:")
    for call in (
        lambda: store.prepare(DIM, "fp", "m", settings),
        lambda: store.transaction(DIM, "fp", "m", settings).__enter__(),
        lambda: store.local_footprint(settings),
    ):
        with pytest.raises(InputError, match=r"a Qdrant store takes a QdrantCollectionConfig") as caught:
            call()
        assert "\n" not in str(caught.value)
    assert store.manifest is None and not store.folder.exists()  # nothing created
    store.prepare(DIM, "fp", "m", QdrantCollectionConfig(quantize=QdrantQuantize.SQ8))
    assert store.require_manifest().index["quantize"] == "sq8"


def test_a_users_dict_is_read_once_where_it_is_handed_in(tmp_path: Path) -> None:
    """The writer's earlier ``index_options=`` keyword is such a door: the store is handed the config."""
    writer = DocumentStoreWriter(
        HashingDocumentEncoder(), f"faiss:{tmp_path / 's'}", index_options={"type": "hnsw", "m": 8}, show_progress=False
    )
    assert writer.index == FaissIndexConfig(index_type=IndexType.HNSW, m=8)
    writer.write(DOCS[:5])
    with FaissStore(tmp_path / "s") as store:
        assert store.require_manifest().index["type"] == "hnsw" and store.require_manifest().index["m"] == 8
    assert store_config("qdrant", {"quantization": "int8"}) == QdrantCollectionConfig(quantize=QdrantQuantize.SQ8)
    with pytest.raises(InputError, match="unknown Qdrant collection options"):
        store_config("qdrant", {"nlist": 4})


def test_the_space_check_reads_where_the_store_writes(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("x" * 1000, encoding="utf-8")
    faiss_store = FaissStore(tmp_path / "s")
    footprint = faiss_store.local_footprint(FaissIndexConfig(quantize=Quantize.SQ8))
    assert footprint.path == tmp_path / "s" and footprint.quantized and footprint.published_bytes == 0
    assert not faiss_store.local_footprint(None).quantized
    local = QdrantStore(str(tmp_path / "q"))
    assert local.local_footprint() is not None and local.local_footprint().path == tmp_path / "q"
    local.close()
    assert QdrantStore(":memory:").local_footprint() is None  # no disk of this machine to check
    # a corpus this disk cannot hold is refused in one line before anything is written; a small one passes
    check_store_space(faiss_store, total=10, corpus=corpus, dim=DIM, sparse=True, index=None)
    with pytest.raises(WriteError, match="not enough free space") as caught:
        check_store_space(faiss_store, total=10**15, corpus=corpus, dim=DIM, sparse=True, index=None)
    assert "\n" not in str(caught.value) and not (tmp_path / "s").exists()


def test_an_encoder_of_its_own_needs_no_document_tower(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Vectors computed elsewhere (``encoder=``) are written for a model loaded with its query tower only: the
    writer does not ask for the document tower (a search host filling a store, benchmarks/server_load.py)."""
    from care_retriever.documents import Document
    from care_retriever.indexing.writer import DocumentStoreWriter
    from care_retriever.model.embedder import AsymmetricEmbedder
    from care_retriever.stores import open_store

    embedder = AsymmetricEmbedder.from_pretrained(tiny_model_dir, load="query")

    def unit_rows(texts: list[str]) -> np.ndarray:
        rows = np.random.default_rng(0).standard_normal((len(texts), embedder.dim)).astype(np.float32)
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)

    spec = f"faiss:{tmp_path / 'store'}"
    docs = [Document(id=str(i), text=f"文本{i}") for i in range(5)]
    report = DocumentStoreWriter(embedder, spec, show_progress=False, encoder=unit_rows).write(docs)
    assert report.encoded == 5 and open_store(spec).count() == 5
