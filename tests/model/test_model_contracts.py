"""The embedder contracts: sibling query and document protocols over one face, one implementation of that face,
and space fingerprints that are computed, never written into a model's config."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from care_retriever.errors import ModelError
from care_retriever.model.embedder_base import EmbedderBase
from care_retriever.model.protocols import DocumentEncoder, Embedder, EncoderIdentity, QueryEncoder


class _Face:
    dim = 4
    query_dim = 4
    mode = "symmetric"
    space_fingerprint = "f" * 32

    @property
    def loaded_towers(self) -> tuple[str, ...]:
        return ("document",)


class DocumentOnly(_Face):
    """Encodes documents and nothing else (an indexing worker's embedder)."""

    document_model_name = "docs-only"
    similarity = "cosine"
    document_model = None  # no torch tower: the index writer runs it on the CPU's limits

    def embed_documents(self, texts: Sequence[str], **options: Any) -> np.ndarray:
        return np.ones((len(texts), self.dim), dtype=np.float32) / 2


class QueryOnly(_Face):
    """Encodes queries and nothing else (an exported query tower)."""

    def query_prompt(self, instruction: str | None = None) -> str | None:
        return None

    def embed_queries(self, texts: Sequence[str], **options: Any) -> np.ndarray:
        return np.ones((len(texts), self.dim), dtype=np.float32) / 2


def test_query_and_document_encoders_are_siblings() -> None:
    """A document-only object is a DocumentEncoder and no QueryEncoder (it would raise on the search path), and
    the other way round; both share the face."""
    assert isinstance(DocumentOnly(), DocumentEncoder) and isinstance(DocumentOnly(), EncoderIdentity)
    assert not isinstance(DocumentOnly(), QueryEncoder)
    assert isinstance(QueryOnly(), QueryEncoder) and not isinstance(QueryOnly(), DocumentEncoder)
    assert not isinstance(DocumentOnly(), Embedder) and not isinstance(QueryOnly(), Embedder)
    assert QueryEncoder not in DocumentEncoder.__mro__ and DocumentEncoder not in QueryEncoder.__mro__
    assert {QueryEncoder, DocumentEncoder} <= set(Embedder.__mro__)


def test_every_embedder_shares_the_one_implementation_of_the_face() -> None:
    """The face is written once: no embedder class defines its own query width or space fingerprint."""
    from care_retriever.model.baselines import OneTowerEmbedder, SentenceTransformerEmbedder
    from care_retriever.model.embedder import AsymmetricEmbedder
    from care_retriever.search.backends.exported import ExportedQueryEmbedder
    from care_retriever.search.backends.onnx_embedder import OnnxQueryEmbedder
    from care_retriever.search.backends.openvino_embedder import OpenVinoQueryEmbedder

    classes = [
        AsymmetricEmbedder,
        ExportedQueryEmbedder,
        OnnxQueryEmbedder,
        OpenVinoQueryEmbedder,
        SentenceTransformerEmbedder,
        OneTowerEmbedder,
    ]
    for cls in classes:
        assert issubclass(cls, EmbedderBase), cls.__name__
        copies = {"query_dim", "mode", "space_fingerprint", "similarity"} & set(vars(cls))
        assert not copies, f"{cls.__name__} defines its own {sorted(copies)}"


def _counting_hash(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    from care_retriever.model import embedder as embedder_module

    calls: list[int] = []
    real = embedder_module.weights_fingerprint

    def counted(modules: Any, dim: int) -> str:
        calls.append(dim)
        return real(modules, dim)

    monkeypatch.setattr(embedder_module, "weights_fingerprint", counted)
    return calls


def test_the_space_fingerprint_is_computed_never_written(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading the fingerprint of a model whose config has none hashes its document weights once and keeps them in
    the embedder: the config stays as it was built."""
    from care_retriever.model.embedder import AsymmetricEmbedder

    loaded = AsymmetricEmbedder.from_pretrained(tiny_model_dir)
    calls = _counting_hash(monkeypatch)
    assert loaded.space_fingerprint and calls == []  # a loaded model's weights fingerprint is its config's

    unknown = loaded.with_config(space_fingerprint=None)
    as_built = unknown.config.to_json()
    assert unknown.space_fingerprint == loaded.space_fingerprint  # the same weights
    assert unknown.space_fingerprint == loaded.space_fingerprint
    assert len(calls) == 1  # hashed once, then kept
    assert unknown.config.space_fingerprint is None and unknown.config.to_json() == as_built


def test_a_save_writes_a_copy_of_the_config(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from care_retriever.model.embedder import AsymmetricEmbedder

    unknown = AsymmetricEmbedder.from_pretrained(tiny_model_dir).with_config(space_fingerprint=None)
    unknown.config.care_retriever_version = "0.0.0"
    as_built = unknown.config.to_json()
    unknown.save_pretrained(tmp_path / "saved")
    assert unknown.config.to_json() == as_built
    saved = json.loads((tmp_path / "saved" / "care_config.json").read_text("utf-8"))
    assert saved["space_fingerprint"] == unknown.document_weights() and saved["care_retriever_version"] != "0.0.0"
    assert AsymmetricEmbedder.from_pretrained(tmp_path / "saved").space_fingerprint == unknown.space_fingerprint


def test_towers_are_values_and_replacing_one_gives_a_new_model(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new query tower keeps the document space; a document tower retrained in place is hashed again; the model
    they came from keeps its config."""
    from care_retriever.model.embedder import AsymmetricEmbedder

    embedder = AsymmetricEmbedder.from_pretrained(tiny_model_dir)
    before = embedder.config.to_json()
    calls = _counting_hash(monkeypatch)

    pooled = embedder.with_tower("query", embedder.tower("query").with_pooling("mean"))
    assert pooled.config.query.pooling == "mean" and embedder.config.query.pooling != "mean"
    assert pooled.space_fingerprint == embedder.space_fingerprint and calls == []

    document = embedder.tower("document")
    assert document.weights == embedder.config.space_fingerprint
    retrained = embedder.with_tower("document", document.retrained())
    assert retrained.config.space_fingerprint is None
    assert retrained.space_fingerprint == embedder.space_fingerprint and len(calls) == 1  # same weights, hashed
    assert embedder.config.to_json() == before

    query_only = AsymmetricEmbedder.from_pretrained(tiny_model_dir, load="query")
    with pytest.raises(ModelError, match="document tower is not loaded"):
        query_only.tower("document")


def test_the_training_runner_gives_new_models(tiny_model_dir: Path) -> None:
    """The runner's model edits (pooling, max length, prompt template) return a new model; the one passed in keeps
    its config."""
    from care_retriever.model.embedder import AsymmetricEmbedder
    from care_retriever.training.models import set_max_length, set_pooling, set_query_prompt_template

    embedder = AsymmetricEmbedder.from_pretrained(tiny_model_dir)
    before = embedder.config.to_json()
    changed = set_pooling(embedder, "document", "mean")
    changed = set_max_length(changed, 24)
    changed = set_query_prompt_template(changed, "Q: {instruction} ")
    assert embedder.config.to_json() == before
    assert changed.config.document.pooling == "mean"
    assert changed.config.query.max_length == changed.config.document.max_length == 24
    assert changed.tower("document").transformer.max_seq_length == 24
    assert changed.config.query_prompt_template == "Q: {instruction} " and changed.config.default_instruction
