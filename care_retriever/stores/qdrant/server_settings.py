"""A Qdrant server's collection through qdrant-client: the clients and the collection's settings.

``collection_options`` turns the store's :class:`~care_retriever.stores.config.QdrantCollectionConfig` into
``create_collection`` arguments; ``collection_settings`` reads back what the server holds. The API key of a server
comes from ``QDRANT_API_KEY`` (or is handed in) and is never logged.
"""

from __future__ import annotations

import os
from typing import Any

import care_retriever.faults as faults
from care_retriever.errors import StoreError
from care_retriever.stores.config import QdrantCollectionConfig
from care_retriever.stores.qdrant.common import first_line, is_server


def async_client(location: str, api_key: str | None = None) -> Any:
    """An ``AsyncQdrantClient`` for a server URL."""
    from qdrant_client import AsyncQdrantClient

    return AsyncQdrantClient(url=location, api_key=api_key or os.environ.get("QDRANT_API_KEY") or None, timeout=60)


def client(location: str, api_key: str | None = None) -> Any:
    """A ``QdrantClient`` for a server URL, ``:memory:`` or (the legacy reader only) a local-mode folder."""
    try:
        from qdrant_client import QdrantClient
    except ImportError as exc:
        raise StoreError("Qdrant stores need qdrant-client: pip install 'care-retriever[qdrant]'") from exc
    if location == ":memory:":
        return QdrantClient(location=":memory:")
    if is_server(location):
        return QdrantClient(url=location, api_key=api_key or os.environ.get("QDRANT_API_KEY") or None, timeout=60)
    from pathlib import Path

    faults.require_folder(Path(location), f"the local Qdrant store qdrant:{location}")  # a file there stays untouched
    try:
        return QdrantClient(path=location)
    except RuntimeError as exc:  # the local mode holds a file lock
        raise StoreError(f"qdrant:{location}: {first_line(exc)}") from exc
    except Exception as exc:  # a damaged meta.json or storage.sqlite fails in json, sqlite3, pickle or pydantic
        reason = faults.reason_of(exc)  # opening writes too (its lock file, its tables): a full disk is not damage
        if reason is not None:
            raise faults.write_error(f"qdrant:{location}", "the local Qdrant storage", exc, reason) from exc
        raise StoreError(
            f"qdrant:{location}: corrupted local Qdrant storage ({type(exc).__name__}: {first_line(exc)})"
        ) from exc


# Settings that exist only on a server: qdrant-client's memory mode drops them (one shard, no replicas).
SERVER_ONLY = ("shards", "replicas")
# Settings qdrant-client's memory mode keeps in the collection config but does not act on (it searches exactly).
LOCAL_UNUSED = (
    "quantize",
    "always_ram",
    "oversample",
    "on_disk",
    "on_disk_payload",
    "m",
    "ef_construct",
    "indexing_threshold",
    "max_segment_size",
)


def collection_options(dim: int, options: QdrantCollectionConfig, *, metric: str = "cosine") -> dict[str, Any]:
    """``create_collection`` arguments for a collection sized for millions of documents.

    ``m`` / ``ef_construct``: the HNSW graph; ``on_disk``: the original vectors memory-mapped from disk;
    ``quantize``: ``sq8`` (int8 scalar codes, 4x smaller) or ``binary`` (one bit a dimension, 32x smaller),
    kept in RAM with ``always_ram`` (default) and rescored from the originals at search time, ``oversample``
    times ``top_k`` candidates; ``shards`` / ``replicas``: distribution over a cluster. See benchmarks/results/scale.md.
    """
    from qdrant_client import models

    resolved = options.resolved().given()
    hnsw = {k: resolved[k] for k in ("m", "ef_construct") if k in resolved}
    quantization: Any = None
    if resolved["quantize"] == "sq8":
        quantization = models.ScalarQuantization(
            scalar=models.ScalarQuantizationConfig(type=models.ScalarType.INT8, always_ram=resolved["always_ram"])
        )
    elif resolved["quantize"] == "binary":
        quantization = models.BinaryQuantization(
            binary=models.BinaryQuantizationConfig(always_ram=resolved["always_ram"])
        )
    kwargs: dict[str, Any] = {
        # The quantization sits on the (unnamed) dense vector rather than the collection: the same on a
        # server, and local mode keeps a vector's config, so the collection's info reports it either way.
        "vectors_config": models.VectorParams(
            size=dim,
            # cosine would renormalise the stored vectors: a model that scores by dot product gets DOT
            distance=models.Distance.DOT if metric == "dot" else models.Distance.COSINE,
            on_disk=resolved.get("on_disk"),
            hnsw_config=models.HnswConfigDiff(**hnsw) if hnsw else None,
            quantization_config=quantization,
        ),
    }
    optimizers = {k: resolved[k] for k in ("indexing_threshold", "max_segment_size") if k in resolved}
    if optimizers:  # the server's optimizer: index segments past the threshold, none larger than the size (KB)
        kwargs["optimizers_config"] = models.OptimizersConfigDiff(**optimizers)
    for key, arg in (
        ("on_disk_payload", "on_disk_payload"),
        ("shards", "shard_number"),
        ("replicas", "replication_factor"),
    ):
        if key in resolved:
            kwargs[arg] = resolved[key]
    return kwargs


def collection_settings(info: Any) -> dict[str, Any]:
    """The settings a collection holds, read from Qdrant's own collection info (not from the manifest)."""
    from qdrant_client import models

    params = info.config.params
    vector = params.vectors[""] if isinstance(params.vectors, dict) else params.vectors
    quantization = getattr(vector, "quantization_config", None) or info.config.quantization_config
    if isinstance(quantization, models.ScalarQuantization):
        quantize, always_ram = "sq8", quantization.scalar.always_ram
    elif isinstance(quantization, models.BinaryQuantization):
        quantize, always_ram = "binary", quantization.binary.always_ram
    elif quantization is None:
        quantize, always_ram = "none", None
    else:
        quantize, always_ram = type(quantization).__name__, None
    return {
        "quantize": quantize,
        "always_ram": always_ram,
        "on_disk": getattr(vector, "on_disk", None),
        "shards": params.shard_number,
        "replicas": params.replication_factor,
    }
