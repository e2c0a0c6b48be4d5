"""Vector stores: FAISS (embedded default) and Qdrant (local mode or server).

``open_store`` parses a store spec: ``faiss:DIR``, ``qdrant:PATH``, ``qdrant::memory:`` or
``qdrant:http(s)://host:port``. Qdrant is imported only when a Qdrant spec is used.
"""

from __future__ import annotations

from care_retriever.errors import InputError
from care_retriever.stores.base import Hit, Manifest, VectorStore

SCHEMES = ("faiss", "qdrant")

__all__ = ["SCHEMES", "Hit", "Manifest", "VectorStore", "open_store", "parse_store_spec"]


def parse_store_spec(spec: str) -> tuple[str, str]:
    scheme, sep, location = spec.partition(":")
    if not sep or scheme not in SCHEMES or not location:
        raise InputError(
            f"invalid store {spec!r}: expected one of faiss:DIR, qdrant:PATH, qdrant::memory:, qdrant:http://host:6333"
        )
    return scheme, location


def open_store(spec: str | VectorStore, *, collection: str | None = None, use_gpu: bool | None = None) -> VectorStore:
    """Open (or get ready to create) the store named by ``spec``."""
    if isinstance(spec, VectorStore):
        return spec
    scheme, location = parse_store_spec(spec)
    if scheme == "faiss":
        from care_retriever.stores.faiss import FaissStore

        return FaissStore(location, use_gpu=use_gpu)
    from care_retriever.stores.qdrant_store import DEFAULT_COLLECTION, QdrantStore

    return QdrantStore(location, collection or DEFAULT_COLLECTION)
