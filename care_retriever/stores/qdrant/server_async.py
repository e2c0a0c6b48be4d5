"""Async reads of a Qdrant server store: ``search_async``, ``get_async``, ``count_async`` await an
``AsyncQdrantClient`` (opened on first use, with the sync client's URL and key); a store handed a local client runs
the sync calls in a worker thread, unless an ``AsyncQdrantClient`` is given as ``async_client``.

A mixin of :class:`~care_retriever.stores.qdrant.server.ServerStore`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from care_retriever.documents import Document
from care_retriever.stores.base import Filters, Hit, Manifest
from care_retriever.stores.qdrant.common import document_of, is_server, point_id, query_rows
from care_retriever.stores.qdrant.server_settings import async_client as open_async_client


class ServerAsync:
    collection: str
    location: str
    manifest: Manifest | None
    _api_key: str | None

    if TYPE_CHECKING:  # provided by the store (declared for the type checker only: a body here would shadow them)

        def require_manifest(self) -> Manifest: ...
        def search_params(self) -> Any: ...
        def _filter(self, filters: Filters | None) -> Any: ...
        def _hits(self, points: Sequence[Any]) -> list[Hit]: ...

    # None (the sync client runs in a thread) unless one is assigned (e.g. on a folder no sync client holds).
    async_client: Any = None

    def _async(self) -> Any:
        if self.async_client is None and is_server(self.location):
            self.async_client = open_async_client(self.location, self._api_key)
        return self.async_client

    def _search_requests(self, vectors: np.ndarray, top_k: int, filters: Filters | None, payload: bool) -> list[Any]:
        """The Query API requests :meth:`search` sends, one per row of ``vectors``."""
        from qdrant_client import models

        vectors = query_rows(vectors, top_k, self.require_manifest().dim)
        flt = self._filter(filters)
        fields = True if payload else ["doc_id"]
        params = self.search_params()
        return [
            models.QueryRequest(query=v.tolist(), limit=top_k, filter=flt, with_payload=fields, params=params)
            for v in vectors
        ]

    async def search_async(
        self, vectors: np.ndarray, top_k: int, filters: Filters | None = None, *, payload: bool = True
    ) -> list[list[Hit]]:
        """:meth:`search` awaiting the async client (a server), else in a worker thread."""
        client = self._async()
        if client is None:
            return await super().search_async(vectors, top_k, filters, payload=payload)  # type: ignore[misc]
        requests = self._search_requests(vectors, top_k, filters, payload)
        if not requests:
            return []
        responses = await client.query_batch_points(self.collection, requests)
        return [self._hits(response.points) for response in responses]

    async def get_async(self, ids: Sequence[str]) -> list[Document | None]:
        """:meth:`get` awaiting the async client (a server), else in a worker thread."""
        client = self._async()
        if client is None or self.manifest is None:
            return await super().get_async(ids)  # type: ignore[misc]
        found: dict[str, Document] = {}
        for start in range(0, len(ids), 256):
            points = await client.retrieve(
                self.collection, [point_id(i) for i in ids[start : start + 256]], with_payload=True, with_vectors=False
            )
            found.update({p.payload["doc_id"]: document_of(p.payload) for p in points})
        return [found.get(i) for i in ids]

    async def count_async(self, filters: Filters | None = None) -> int:
        """:meth:`count` awaiting the async client (a server), else in a worker thread."""
        client = self._async()
        if client is None or self.manifest is None:
            return await super().count_async(filters)  # type: ignore[misc]
        return (await client.count(self.collection, count_filter=self._filter(filters), exact=True)).count

    async def aclose(self) -> None:
        """Close the async client, then the sync one (:meth:`close`)."""
        if self.async_client is not None:
            client, self.async_client = self.async_client, None
            await client.close()
        await super().aclose()  # type: ignore[misc]
