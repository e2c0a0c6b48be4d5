"""The Qdrant stores, one module per concern (as ``stores/faiss/``).

* ``common.py``: point ids, payloads, filters, and ``QdrantStore``, the class users name: ``QdrantStore(location,
  collection)`` is an :class:`EdgeStore` for a folder or ``:memory:``, a :class:`ServerStore` for a server URL or a
  qdrant-client handed in.
* ``edge.py``: the one adapter to Qdrant Edge (pinned ``qdrant-edge-py``); ``edge_store.py`` the Edge store
  (manifest, writes, commit = flush, optimize at finalize, verify, what the engine built); ``edge_search.py`` its
  dense, BM25 and hybrid search fused in the engine.
* ``server.py``, ``server_search.py``, ``server_async.py``, ``server_settings.py``: a Qdrant server through
  qdrant-client (sync and async).
* ``legacy.py``: stores of earlier releases (qdrant-client local mode) recognised and read; ``migrate.py``
  converts them.
* ``edge_space.py``: free space checked before Edge writes (a full disk under its mapped files is a SIGBUS).
"""

from __future__ import annotations

from care_retriever.stores.qdrant.common import (
    DEFAULT_COLLECTION,
    ID_NAMESPACE,
    MANIFEST_KEY,
    QdrantOptions,
    QdrantStore,
    dense_vector,
    is_server,
    open_qdrant,
    point_id,
    redact,
)
from care_retriever.stores.qdrant.edge_store import EdgeStore
from care_retriever.stores.qdrant.server import ServerStore
from care_retriever.stores.qdrant.server_settings import collection_options, collection_settings

__all__ = [
    "DEFAULT_COLLECTION",
    "ID_NAMESPACE",
    "MANIFEST_KEY",
    "EdgeStore",
    "QdrantOptions",
    "QdrantStore",
    "ServerStore",
    "collection_options",
    "collection_settings",
    "dense_vector",
    "is_server",
    "open_qdrant",
    "point_id",
    "redact",
]
