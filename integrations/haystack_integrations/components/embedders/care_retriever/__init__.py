"""care-retriever's Haystack embedders: the query tower (:class:`CareTextEmbedder`) and the document tower
(:class:`CareDocumentEmbedder`) of a CARE model."""

from haystack_integrations.components.embedders.care_retriever.document_embedder import CareDocumentEmbedder
from haystack_integrations.components.embedders.care_retriever.text_embedder import CareTextEmbedder

__all__ = ["CareDocumentEmbedder", "CareTextEmbedder"]
