"""``CareDocumentEmbedder``: the document tower of a CARE model as a Haystack document embedder.

Only the document tower is loaded (``load="document"``). By default (``meta_fields_to_embed=["title"]``,
separator newline) the text embedded is the core's :func:`~care_retriever.documents.document_text` of the
document's title (:func:`~care_retriever.integrations.common.core_title`) and content: the text
``care-retriever index`` encodes, so documents embedded here and by the CLI get the same vectors.

``run_async`` runs :meth:`CareDocumentEmbedder.run` (its checks, texts and the document tower) in a worker
thread: the event loop keeps serving while a batch encodes.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from haystack import Document, component, default_from_dict, default_to_dict
from haystack_integrations.components.embedders.care_retriever.text_embedder import NOT_WARMED_UP

from care_retriever.documents import document_text
from care_retriever.errors import InputError
from care_retriever.integrations.common import check_model_location, core_title, model_metric
from care_retriever.model.towers.loading import loading_progress
from care_retriever.runtime.batch_limits import DOCUMENT_BATCH_SIZE

if TYPE_CHECKING:
    from care_retriever.model.protocols import DocumentEncoder


@component
class CareDocumentEmbedder:
    """Embed Documents with the document tower of a CARE model; returns copies with ``embedding`` set.

    Usage example:
    ```python
    from haystack import Document
    from haystack_integrations.components.embedders.care_retriever import CareDocumentEmbedder

    embedder = CareDocumentEmbedder(model="models/care", progress_bar=False)
    embedder.warm_up()
    documents = embedder.run([Document(content="高血压患者应低盐饮食", meta={"title": "高血压"})])["documents"]
    assert documents[0].embedding is not None
    ```

    :param model: CARE model folder (or hub id).
    :param meta_fields_to_embed: meta fields written, in order, above the content (default ``["title"]``).
    :param embedding_separator: joins the meta values and the content.
    :param batch_size: documents per forward pass.
    :param progress_bar: show a tqdm bar while encoding (loading the tower is quiet either way).
    :param device: ``cpu``, ``cuda``, ``cuda:N``; default picks CUDA when available.
    :param trust_remote_code: needed when the document tower runs model code shipped with it (off by default).
    """

    def __init__(
        self,
        model: str,
        meta_fields_to_embed: list[str] | None = None,
        embedding_separator: str = "\n",
        batch_size: int = DOCUMENT_BATCH_SIZE,
        progress_bar: bool = True,
        device: str | None = None,
        trust_remote_code: bool = False,
    ) -> None:
        if batch_size < 1:
            raise InputError(f"batch_size must be >= 1, got {batch_size}")
        self.model = model
        self.meta_fields_to_embed = ["title"] if meta_fields_to_embed is None else list(meta_fields_to_embed)
        self.embedding_separator = embedding_separator
        self.batch_size = batch_size
        self.progress_bar = progress_bar
        self.device = device
        self.trust_remote_code = trust_remote_code
        self.embedder: DocumentEncoder | None = None

    def warm_up(self) -> None:
        """Load the document tower (once); pipelines call this before the first run."""
        if self.embedder is None:
            from care_retriever.model.embedder import AsymmetricEmbedder

            # Loading is quiet whatever progress_bar says: that bar is the encoding's (on by default, as Haystack's).
            with loading_progress(show=False):
                self.embedder = AsymmetricEmbedder.from_pretrained(
                    self.model, load="document", device=self.device, trust_remote_code=self.trust_remote_code
                )

    @property
    def similarity(self) -> str:
        """The similarity the model's vectors are scored with, to set in a third-party store: ``cosine`` (this
        package's models, unit vectors) or ``dot`` (the authors' released models: dot product / inner product).
        Read from the model's config; no tower is loaded."""
        return model_metric(self.model)

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(
            self,
            model=self.model,
            meta_fields_to_embed=self.meta_fields_to_embed,
            embedding_separator=self.embedding_separator,
            batch_size=self.batch_size,
            progress_bar=self.progress_bar,
            device=self.device,
            trust_remote_code=self.trust_remote_code,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CareDocumentEmbedder:
        check_model_location(data.get("init_parameters", {}).get("model"))
        return default_from_dict(cls, data)

    def text_to_embed(self, doc: Document) -> str:
        """By default the core's document text; with other fields or separator, the meta values (skipping
        missing and empty ones), then the content, joined by the separator."""
        if self.meta_fields_to_embed == ["title"] and self.embedding_separator == "\n":
            return document_text(core_title(doc.meta), doc.content or "")
        parts = [str(doc.meta[k]) for k in self.meta_fields_to_embed if doc.meta.get(k) not in (None, "")]
        return self.embedding_separator.join([*parts, doc.content or ""])

    @component.output_types(documents=list[Document])
    def run(self, documents: list[Document]) -> dict[str, list[Document]]:
        """Copies of ``documents`` with embeddings from the document tower (as the model gives them: unit-norm for a
        cosine model, cut without renormalising for a dot-product one; :attr:`similarity`)."""
        if not isinstance(documents, list) or any(not isinstance(d, Document) for d in documents):
            raise TypeError(
                "CareDocumentEmbedder expects a list of Documents as input. "
                "In case you want to embed a string, please use the CareTextEmbedder."
            )
        empty = [d.id for d in documents if d.content is None or not d.content.strip()]
        if empty:
            raise InputError(
                f"CareDocumentEmbedder: {len(empty)} document(s) have no text content (first: id {empty[0]!r}); "
                "only text documents can be embedded"
            )
        if self.embedder is None:
            raise RuntimeError(NOT_WARMED_UP)
        if not documents:
            return {"documents": []}
        vectors = self.embedder.embed_documents(
            [self.text_to_embed(d) for d in documents], batch_size=self.batch_size, show_progress=self.progress_bar
        )
        return {"documents": [replace(d, embedding=v.tolist()) for d, v in zip(documents, vectors, strict=True)]}

    async def warm_up_async(self) -> None:
        """:meth:`warm_up` in a worker thread (``Pipeline.run_async`` calls it): loading never blocks the loop."""
        await asyncio.to_thread(self.warm_up)

    @component.output_types(documents=list[Document])
    async def run_async(self, documents: list[Document]) -> dict[str, list[Document]]:
        """:meth:`run` in a worker thread: the same vectors, and the event loop is never blocked by the tower."""
        return await asyncio.to_thread(self.run, documents)
