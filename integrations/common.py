"""Framework-free helpers shared by the Haystack and LangChain adapters.

Both adapters need the same few things: where a model is and what space it embeds into (read
from ``care_config.json`` without building a tower), each tower loaded only when its side is first
used (a search process never builds the document tower), and one mapping between a framework's
``(text, metadata)`` and the core :class:`~care_retriever.documents.Document` (``title`` is a column
of the core store, a metadata key in the frameworks).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np

from care_retriever.documents import Document, check_document_text, metadata_json
from care_retriever.errors import InputError, ModelError
from care_retriever.model.config import CONFIG_NAME, CareConfig
from care_retriever.model.protocols import DocumentEncoder, QueryEncoder
from care_retriever.model.towers.loading import loading_progress, local_model_dir
from care_retriever.stores.base import Manifest
from care_retriever.stores.config import (
    FaissIndexConfig,
    QdrantCollectionConfig,
    StoreKind,
    StoreSpec,
    qdrant_only_keys,
)
from care_retriever.vectors import VectorContract

# Fingerprint recorded for stores written from vectors of an unknown model: `care-retriever search`
# then refuses them with "built with another model" instead of returning meaningless hits.
UNKNOWN_FINGERPRINT = "unknown"


def check_model_location(model: str) -> Path | None:
    """Fail early, in one line, when a local-looking model path does not exist (``org/name`` may be a hub id);
    return the local folder, or None for a hub id (:func:`care_retriever.model.towers.loading.local_model_dir`)."""
    return local_model_dir(model)


def model_space(model: str) -> tuple[int, str, str]:
    """``(dim, space_fingerprint, document model name)`` of a saved CARE model, no tower loaded."""
    local = check_model_location(model)
    config = CareConfig.load(local if local is not None else model)
    if not config.space_fingerprint:
        raise ModelError(f"{model}/{CONFIG_NAME}: missing space_fingerprint")
    # The config keeps the weights fingerprint; the space also covers the document-text rule and prompt.
    space = config.document_space()
    return config.dim, space, config.document.base_model or model


def model_contract(model: str) -> VectorContract:
    """What a saved CARE model's vectors are (its similarity and norms), read from its config, no tower loaded."""
    local = check_model_location(model)
    return CareConfig.load(local if local is not None else model).vectors


def model_metric(model: str) -> str:
    """What a saved CARE model's scores are (``cosine`` or ``dot``), read from its config, no tower loaded."""
    return model_contract(model).similarity


def faiss_folder(path: str | PathLike[str]) -> Path:
    """The folder of a FAISS store given as a store spec (``faiss:DIR``, :meth:`StoreSpec.parse
    <care_retriever.stores.config.StoreSpec.parse>`) or a plain path; one line for a store of another kind."""
    text = str(path)
    scheme = text.partition(":")[0]
    if scheme in [k.value for k in StoreKind]:
        spec = StoreSpec.parse(text)
        if spec.kind is not StoreKind.FAISS:
            raise InputError(
                f"{text!r} is a {spec.kind.value} store; this class opens FAISS stores (faiss:DIR or a folder). "
                "Search a Qdrant store with CareStoreRetriever or LangChain's CareVectorStore"
            )
        return Path(spec.location)
    return Path(text)


class TowerLoader:
    """Loads each tower of a CARE model on first use; thread-safe, each side built at most once."""

    def __init__(
        self,
        model: str | None,
        *,
        device: str | None = None,
        embedder: QueryEncoder | None = None,
        query_backend: str = "torch",
        trust_remote_code: bool = False,
        show_progress: bool = False,
    ) -> None:
        if model is None and embedder is None:
            raise ModelError("pass a CARE model folder (model=...) or a loaded AsymmetricEmbedder (embedder=...)")
        self.model = model
        self.device = device
        # auto | torch | onnx | openvino (care_retriever.search.backends); the document tower always runs on torch
        self.query_backend = query_backend
        self.trust_remote_code = trust_remote_code  # a tower whose model code ships with it needs it at load
        self.show_progress = show_progress  # transformers' loading bars and reports; off: a library stays quiet
        self._query: QueryEncoder | None = None
        self._document: DocumentEncoder | None = None
        if embedder is not None:  # its loaded towers serve; a query-only backend (onnx) has no document side
            if "query" in embedder.loaded_towers:
                self._query = embedder
            if "document" in embedder.loaded_towers and isinstance(embedder, DocumentEncoder):
                self._document = embedder
        self._lock = threading.Lock()

    def loaded(self, side: str) -> bool:
        return (self._query if side == "query" else self._document) is not None

    def _source(self, side: str) -> str:
        if self.model is None:
            raise ModelError(f"the given embedder has no {side} tower and no model path to load it from")
        return self.model

    def query(self) -> QueryEncoder:
        """The query side, loaded if needed on the chosen backend
        (``care_retriever.search.backends.load_query_embedder``)."""
        if self._query is not None:  # no lock once loaded: a document tower loading meanwhile does not stall queries
            return self._query
        with self._lock:
            if self._query is None:
                from care_retriever.search.backends import load_query_embedder

                with loading_progress(self.show_progress):
                    self._query = load_query_embedder(
                        self._source("query"),
                        self.query_backend,
                        device=self.device,
                        trust_remote_code=self.trust_remote_code,
                    )
            return self._query

    def document(self) -> DocumentEncoder:
        """The document side (a torch tower), loaded if needed."""
        if self._document is not None:
            return self._document
        with self._lock:
            if self._document is None:
                from care_retriever.model.embedder import AsymmetricEmbedder

                with loading_progress(self.show_progress):
                    self._document = AsymmetricEmbedder.from_pretrained(
                        self._source("document"),
                        load="document",
                        device=self.device,
                        trust_remote_code=self.trust_remote_code,
                    )
            return self._document


def store_contract(manifest: Manifest | None, model_metric: str | None = None) -> VectorContract:
    """What the vectors of a store are (:mod:`care_retriever.vectors`): its manifest's metric, or for a store not
    written yet the metric of the model that will write it (``cosine`` for vectors of an unknown model)."""
    if manifest is not None:
        return VectorContract.for_metric(manifest.metric)
    return VectorContract.for_metric(model_metric or "cosine")


def prepare_vectors(manifest: Manifest | None, vectors: np.ndarray, model_metric: str | None = None) -> np.ndarray:
    """Vectors (to write, or a query to search with) as the store's model defines them: unit rows for a cosine
    store, unchanged for a dot-product one (the authors' released models: renormalising would change their scores
    and ranking). Every adapter goes through here, so it scores as ``care-retriever search`` does."""
    return store_contract(manifest, model_metric).prepare(vectors)


def as_matrix(embeddings: Sequence[Sequence[float]], dim: int | None, what: str) -> np.ndarray:
    """Validate embeddings from a framework (same width, finite numbers) and stack them as float32 rows."""
    rows = [list(e) for e in embeddings]
    if not rows:
        return np.zeros((0, dim or 0), dtype=np.float32)
    widths = {len(r) for r in rows}
    if len(widths) > 1:
        raise InputError(f"{what}: embeddings have different lengths {sorted(widths)}")
    if dim is not None and widths != {dim}:
        raise InputError(f"{what}: embeddings have {widths.pop()} dims; the store holds {dim}-dim vectors")
    try:
        matrix = np.asarray(rows, dtype=np.float32).reshape(len(rows), -1)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{what}: embeddings must be lists of numbers") from exc
    if not np.isfinite(matrix).all():
        raise InputError(f"{what}: embeddings contain NaN or infinite values")
    return matrix


def core_title(meta: Mapping[str, Any]) -> str:
    """The title of a framework document: a non-empty string ``meta["title"]``, else none."""
    title = meta.get("title")
    return title if isinstance(title, str) and title else ""


def to_core_document(doc_id: str, text: str, meta: Mapping[str, Any]) -> Document:
    """A framework document as a core Document: a non-empty string ``meta["title"]`` becomes the title column."""
    metadata = dict(meta)
    title = core_title(metadata)
    # As `care-retriever index` refuses it: an empty document would be stored with a meaningless vector.
    check_document_text(doc_id, text, title)
    if title:
        del metadata["title"]
    metadata_json(doc_id, metadata)  # strict JSON, as every door refuses NaN and Infinity (naming the field)
    return Document(id=doc_id, text=text, title=title, metadata=metadata)


def from_core_metadata(title: str, metadata: Mapping[str, Any], hidden: Sequence[str] = ()) -> dict[str, Any]:
    """The inverse of :func:`to_core_document` for metadata: title back in, adapter bookkeeping keys out."""
    meta = {k: v for k, v in metadata.items() if k not in hidden}
    if title:
        meta["title"] = title
    return meta


def cosine_to_unit(score: float) -> float:
    """Map a score in [-1, 1] to [0, 1] (what ``scale_score`` / relevance scores expect): a cosine, or the dot
    product of vectors of norm at most 1 (the authors' released models)."""
    return min(1.0, max(0.0, (score + 1.0) / 2.0)) if math.isfinite(score) else 0.0


def check_index_options(
    backend: str, options: Mapping[str, Any] | None
) -> FaissIndexConfig | QdrantCollectionConfig | None:
    """A framework object's ``index_options`` as the store's config, read once when the object is built rather than
    at its first write (the config class checks it: the same one-line error as ``care-retriever index``).

    FAISS: ``type``, ``quantize`` (none | sq8 | binary | pq), ``oversample``, ``m``, ``ef_construction``,
    ``ef_search``, ``nlist``, ``nprobe``, ``pq_m``, ``pq_bits``; Qdrant: ``quantize`` (none | sq8 | binary),
    ``oversample``, ``always_ram``, ``on_disk``, ``on_disk_payload``, ``shards``, ``replicas``, ``m``,
    ``ef_construct`` (benchmarks/results). One line for a setting the store does not have, an unknown quantization or a
    bad value.
    """
    if options is None:
        return None
    if not isinstance(options, Mapping):
        raise InputError(f"index_options must be a dict of store settings, got {type(options).__name__}")
    if backend == "qdrant":
        return QdrantCollectionConfig.from_manifest(options)
    misplaced = sorted(set(options) & qdrant_only_keys())  # derived from the two configs' fields
    if misplaced:
        raise InputError(f"index_options {misplaced} are Qdrant collection settings; a FAISS store has none of them")
    known = FaissIndexConfig.manifest_keys()
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise InputError(f"Unknown FAISS index_options {unknown}. Available: {known}")
    return FaissIndexConfig.from_manifest(options)
