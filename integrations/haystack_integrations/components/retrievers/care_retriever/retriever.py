"""``CareFaissEmbeddingRetriever``: the query side of :class:`CareFaissDocumentStore` in a pipeline.

Connect ``CareTextEmbedder.embedding`` to ``query_embedding``; the embedding comes from the query
tower, the stored vectors from the document tower, both in one space.
"""

from __future__ import annotations

from typing import Any

from haystack import Document, component, default_from_dict, default_to_dict
from haystack.document_stores.types import FilterPolicy
from haystack.document_stores.types.filter_policy import apply_filter_policy
from haystack_integrations.document_stores.care_retriever.document_store import CareFaissDocumentStore


@component
class CareFaissEmbeddingRetriever:
    """Retrieve the ``top_k`` documents of a :class:`CareFaissDocumentStore` most similar to a query embedding.

    Usage example:
    ```python
    from haystack import Pipeline
    from haystack_integrations.components.embedders.care_retriever import CareTextEmbedder
    from haystack_integrations.components.retrievers.care_retriever import CareFaissEmbeddingRetriever
    from haystack_integrations.document_stores.care_retriever import CareFaissDocumentStore

    store = CareFaissDocumentStore("stores/care", model="models/care")
    query = Pipeline()
    query.add_component("embedder", CareTextEmbedder("models/care"))
    query.add_component("retriever", CareFaissEmbeddingRetriever(store, top_k=3))
    query.connect("embedder.embedding", "retriever.query_embedding")
    hits = query.run({"embedder": {"text": "血压高怎么办"}})["retriever"]["documents"]
    assert len(hits) == 3
    ```

    :param document_store: the :class:`CareFaissDocumentStore` to search.
    :param filters: Haystack filters applied to every run (see ``filter_policy``).
    :param top_k: number of documents to return.
    :param scale_score: map the score (the store's similarity: cosine or dot product) from [-1, 1] to [0, 1].
    :param return_embedding: read the stored vectors back into the documents (as the store keeps them).
    :param filter_policy: ``replace`` (run-time filters replace init filters) or ``merge``.
    """

    def __init__(
        self,
        document_store: CareFaissDocumentStore,
        filters: dict[str, Any] | None = None,
        top_k: int = 10,
        scale_score: bool = False,
        return_embedding: bool = False,
        filter_policy: str | FilterPolicy = FilterPolicy.REPLACE,
    ) -> None:
        if not isinstance(document_store, CareFaissDocumentStore):
            raise ValueError("document_store must be an instance of CareFaissDocumentStore")
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        self.document_store = document_store
        self.filters = filters
        self.top_k = top_k
        self.scale_score = scale_score
        self.return_embedding = return_embedding
        self.filter_policy = (
            filter_policy if isinstance(filter_policy, FilterPolicy) else FilterPolicy.from_str(filter_policy)
        )

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(
            self,
            document_store=self.document_store.to_dict(),
            filters=self.filters,
            top_k=self.top_k,
            scale_score=self.scale_score,
            return_embedding=self.return_embedding,
            filter_policy=self.filter_policy.value,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CareFaissEmbeddingRetriever:
        params = data["init_parameters"]
        params["document_store"] = CareFaissDocumentStore.from_dict(params["document_store"])
        if params.get("filter_policy"):
            params["filter_policy"] = FilterPolicy.from_str(params["filter_policy"])
        return default_from_dict(cls, data)

    @component.output_types(documents=list[Document])
    def run(
        self,
        query_embedding: list[float],
        filters: dict[str, Any] | None = None,
        top_k: int | None = None,
        scale_score: bool | None = None,
        return_embedding: bool | None = None,
    ) -> dict[str, list[Document]]:
        """Documents ranked by the store's similarity to ``query_embedding``, best first, with ``score`` set."""
        docs = self.document_store.embedding_retrieval(
            query_embedding=query_embedding,
            filters=apply_filter_policy(self.filter_policy, self.filters, filters),
            top_k=top_k if top_k is not None else self.top_k,
            scale_score=self.scale_score if scale_score is None else scale_score,
            return_embedding=self.return_embedding if return_embedding is None else return_embedding,
        )
        return {"documents": docs}

    @component.output_types(documents=list[Document])
    async def run_async(
        self,
        query_embedding: list[float],
        filters: dict[str, Any] | None = None,
        top_k: int | None = None,
        scale_score: bool | None = None,
        return_embedding: bool | None = None,
    ) -> dict[str, list[Document]]:
        """:meth:`run` through the store's ``embedding_retrieval_async`` (off the event loop)."""
        docs = await self.document_store.embedding_retrieval_async(
            query_embedding=query_embedding,
            filters=apply_filter_policy(self.filter_policy, self.filters, filters),
            top_k=top_k if top_k is not None else self.top_k,
            scale_score=self.scale_score if scale_score is None else scale_score,
            return_embedding=self.return_embedding if return_embedding is None else return_embedding,
        )
        return {"documents": docs}
