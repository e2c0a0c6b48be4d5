"""Vector stores: FAISS (embedded default) and Qdrant (Qdrant Edge embedded, or a server).

``open_store`` opens a store spec (:class:`~care_retriever.stores.config.StoreSpec`): ``faiss:DIR``,
``qdrant:PATH``, ``qdrant::memory:`` or ``qdrant:http(s)://host:port``. Qdrant is imported only when a Qdrant spec
is used.
"""

from __future__ import annotations

from care_retriever.stores.base import Hit, Manifest, VectorStore
from care_retriever.stores.config import StoreKind, StoreSpec

SCHEMES = tuple(kind.value for kind in StoreKind)

__all__ = ["SCHEMES", "Hit", "Manifest", "StoreSpec", "VectorStore", "open_store", "parse_store_spec"]


def parse_store_spec(spec: str) -> tuple[str, str]:
    """``(scheme, location)`` of a spec string (:meth:`StoreSpec.parse`)."""
    parsed = StoreSpec.parse(spec)
    return parsed.kind.value, parsed.location


def open_store(
    spec: str | StoreSpec | VectorStore, *, collection: str | None = None, use_gpu: bool | None = None
) -> VectorStore:
    """Open (or get ready to create) the store named by ``spec`` (``collection``: the spec's, or Qdrant's default)."""
    if isinstance(spec, VectorStore):
        return spec
    parsed = StoreSpec.parse(spec) if isinstance(spec, str) else spec
    if parsed.kind is StoreKind.FAISS:
        from care_retriever.stores.faiss import FaissStore

        return FaissStore(parsed.location, use_gpu=use_gpu)
    from care_retriever.stores.qdrant import DEFAULT_COLLECTION, open_qdrant

    return open_qdrant(parsed.location, collection or parsed.collection or DEFAULT_COLLECTION)
