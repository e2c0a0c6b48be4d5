"""``CareEmbeddings``: a CARE model as LangChain ``Embeddings``.

LangChain's two entry points map onto the two towers: ``embed_query`` runs the small query tower
(with the model's instruction prompt, exactly as :class:`~care_retriever.search.retriever.CareRetriever`
does), ``embed_documents`` the document tower (the text ``care-retriever index`` encodes for a
document without a title). Each tower is loaded on first use, so a retrieval-only process never
builds the document tower. The async variants are the class's own: ``aembed_query`` joins the queries other
coroutines of the loop submit meanwhile into one forward pass of the query tower, in a worker thread;
``aembed_documents`` runs the document tower in a worker thread
(:class:`~care_retriever.search.async_encoding.AsyncEncoder`); neither blocks the event loop.
"""

from __future__ import annotations

from typing import Any

from langchain_core.embeddings import Embeddings
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from care_retriever.documents import check_document_text
from care_retriever.errors import InputError
from care_retriever.integrations.common import TowerLoader, check_model_location, model_metric, model_space
from care_retriever.model.protocols import QueryEncoder
from care_retriever.search.async_encoding import AsyncEncoder, EncoderStats


class CareEmbeddings(BaseModel, Embeddings):
    """Query tower for ``embed_query``, document tower for ``embed_documents``; float vectors as the model gives
    them (unit-norm for a cosine model; :attr:`similarity` says which similarity to score them with).

    Usage example:
    ```python
    from care_retriever.integrations.langchain import CareEmbeddings

    embeddings = CareEmbeddings(model="models/care")
    vector = embeddings.embed_query("血压高怎么办")  # only the query tower is loaded
    assert len(vector) == len(embeddings.embed_documents(["高血压患者应低盐饮食"])[0])
    ```

    Each field below is one parameter (its ``description`` says what it does).
    """

    model: str = Field(
        description="CARE model folder or hub id: written by `care-retriever init` / training, or a model in the "
        "authors' release layout (e.g. PhilipGAQ/CARE-0.3B-4B)."
    )
    instruction: str | None = Field(default=None, description="Override the default query instruction.")
    device: str | None = Field(default=None, description="cpu | cuda | cuda:N (default: CUDA when available).")
    backend: str = Field(
        default="auto",
        description="Query tower backend for embed_query: auto | torch | onnx | openvino (auto: the export if any).",
    )
    trust_remote_code: bool = Field(
        default=False, description="Needed when a tower runs model code shipped with it (off by default)."
    )
    query_batch_size: int = Field(default=32, ge=1, description="Queries per forward pass of the query tower.")
    document_batch_size: int = Field(default=16, ge=1, description="Documents per forward pass of the document tower.")
    show_progress: bool = Field(
        default=False, description="tqdm bar while embedding documents, and transformers' bars while loading a tower."
    )

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    _towers: TowerLoader = PrivateAttr()
    _async: AsyncEncoder | None = PrivateAttr(default=None)

    def model_post_init(self, context: Any, /) -> None:
        check_model_location(self.model)
        self._towers = TowerLoader(
            self.model,
            device=self.device,
            query_backend=self.backend,
            trust_remote_code=self.trust_remote_code,
            show_progress=self.show_progress,
        )

    @classmethod
    def from_embedder(cls, embedder: QueryEncoder, model: str, **kwargs: Any) -> CareEmbeddings:
        """Wrap an already loaded embedder (an :class:`AsymmetricEmbedder`, or a query-only export); its loaded
        towers serve, the others load from ``model`` (which also names it, for serialisation)."""
        instance = cls(model=model, **kwargs)
        instance._towers = TowerLoader(
            model,
            device=instance.device,
            embedder=embedder,
            query_backend=instance.backend,
            trust_remote_code=instance.trust_remote_code,
            show_progress=instance.show_progress,
        )
        return instance

    @property
    def space(self) -> tuple[int, str, str]:
        """``(dim, space fingerprint, document model)`` read from the model's config, no tower loaded."""
        return model_space(self.model)

    @property
    def similarity(self) -> str:
        """The similarity to set in a third-party store (LangChain FAISS ``distance_strategy``, Qdrant ``Distance``):
        ``cosine`` for this package's models (unit vectors), ``dot`` for the authors' released models (dot product
        / max inner product; their document vectors are not unit-norm). Read from the config; no tower loaded."""
        return model_metric(self.model)

    @property
    def metric(self) -> str:
        """What the model's scores are (``cosine`` or ``dot``): a new store is created for it."""
        return model_metric(self.model)

    def embed_query(self, text: str) -> list[float]:
        if not isinstance(text, str):
            raise InputError(f"embed_query expects a str, got {type(text).__name__}")
        if not text.strip():
            raise InputError("empty query")
        embedder = self._towers.query()
        vector = embedder.embed_queries([text], instruction=self.instruction, batch_size=self.query_batch_size)[0]
        return vector.tolist()

    @staticmethod
    def _document_texts(texts: list[str]) -> list[str]:
        """The texts of ``embed_documents`` and ``aembed_documents``, checked alike: a list of str, none empty."""
        if isinstance(texts, str):
            raise InputError("embed_documents expects a list of texts, got a single str (wrap it in a list)")
        texts = list(texts)
        for n, text in enumerate(texts):  # as every door refuses it (care_retriever.documents)
            if not isinstance(text, str):
                raise InputError(f"embed_documents expects str texts, got {type(text).__name__} at {n}")
            check_document_text(f"#{n}", text)
        return texts

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        texts = self._document_texts(texts)
        if not texts:
            return []
        embedder = self._towers.document()
        vectors = embedder.embed_documents(texts, batch_size=self.document_batch_size, show_progress=self.show_progress)
        return vectors.tolist()

    # ------------------------------------------------------------------ async: off the event loop
    def _async_encoder(self) -> AsyncEncoder:
        if self._async is None:
            # The towers are looked up at each batch (in the worker thread): loading one on first use, or a
            # from_embedder swap, never happens on the loop.
            self._async = AsyncEncoder(
                lambda: self._towers.query(), lambda: self._towers.document(), max_batch_size=self.query_batch_size
            )
        return self._async

    @property
    def async_stats(self) -> EncoderStats:
        """Forward passes and texts the async methods have run (concurrent ``aembed_query`` calls share passes)."""
        return self._async_encoder().stats

    async def aembed_query(self, text: str) -> list[float]:
        """``embed_query`` without blocking the loop; concurrent calls from one loop share a forward pass."""
        if not isinstance(text, str):
            raise InputError(f"embed_query expects a str, got {type(text).__name__}")
        if not text.strip():
            raise InputError("empty query")
        vectors = await self._async_encoder().embed_queries([text], instruction=self.instruction)
        return vectors[0].tolist()

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        """``embed_documents`` in a worker thread: the loop keeps serving while the document tower runs."""
        texts = self._document_texts(texts)
        if not texts:
            return []
        vectors = await self._async_encoder().embed_documents(
            texts, batch_size=self.document_batch_size, show_progress=self.show_progress
        )
        return vectors.tolist()
