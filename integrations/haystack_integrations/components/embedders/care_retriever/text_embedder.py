"""``CareTextEmbedder``: the query tower of a CARE model as a Haystack text embedder.

Only the query tower is loaded (``load="query"``), so a query pipeline stays as light as
``care-retriever search``; queries get the same instruction prompt as :class:`CareRetriever`, so a
Haystack query and the CLI return the same hits from the same store.

``run_async`` encodes in a worker thread, never on the event loop, and the queries that other coroutines of
the loop (other ``Pipeline.run_async`` calls) submit meanwhile share its forward pass
(:class:`~care_retriever.search.async_encoding.AsyncEncoder`; ``async_stats`` counts the passes).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from haystack import component, default_from_dict, default_to_dict

from care_retriever.errors import InputError
from care_retriever.integrations.common import check_model_location, model_metric
from care_retriever.model.towers.loading import loading_progress
from care_retriever.search.async_encoding import AsyncEncoder, EncoderStats

if TYPE_CHECKING:
    from care_retriever.model.protocols import QueryEncoder

NOT_WARMED_UP = "The embedding model has not been loaded. Please call warm_up() before running."


@component
class CareTextEmbedder:
    """Embed a query string with the query tower of a CARE model.

    Usage example:
    ```python
    from haystack_integrations.components.embedders.care_retriever import CareTextEmbedder

    embedder = CareTextEmbedder(model="models/care")
    embedder.warm_up()
    result = embedder.run("血压高怎么办")
    assert len(result["embedding"]) > 0
    ```

    :param model: CARE model folder (or hub id) written by ``care-retriever init`` / training.
    :param instruction: override the model's default query instruction (instruction-tuned towers only).
    :param device: ``cpu``, ``cuda``, ``cuda:N``; default picks CUDA when available.
    :param trust_remote_code: needed when the query tower runs model code shipped with it (off by default).
    :param backend: ``auto`` | ``torch`` | ``onnx`` | ``openvino``; ``auto`` runs the model's export
        (``care-retriever export``) when it has one.
    :param progress_bar: let transformers print its loading bars in ``warm_up`` (off: loading is quiet).
    """

    def __init__(
        self,
        model: str,
        instruction: str | None = None,
        device: str | None = None,
        backend: str = "auto",
        trust_remote_code: bool = False,
        progress_bar: bool = False,
    ) -> None:
        self.model = model
        self.progress_bar = progress_bar
        self.trust_remote_code = trust_remote_code
        self.instruction = instruction
        self.device = device
        self.backend = backend
        self.embedder: QueryEncoder | None = None

    def warm_up(self) -> None:
        """Load the query tower (once); pipelines call this before the first run."""
        if self.embedder is None:
            from care_retriever.search.backends import load_query_embedder

            with loading_progress(self.progress_bar):
                self.embedder = load_query_embedder(
                    self.model, self.backend, device=self.device, trust_remote_code=self.trust_remote_code
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
            instruction=self.instruction,
            device=self.device,
            backend=self.backend,
            trust_remote_code=self.trust_remote_code,
            progress_bar=self.progress_bar,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CareTextEmbedder:
        check_model_location(data.get("init_parameters", {}).get("model"))
        return default_from_dict(cls, data)

    @component.output_types(embedding=list[float])
    def run(self, text: str) -> dict[str, list[float]]:
        """The query's embedding (width: the model's shared dim; scored by :attr:`similarity`)."""
        if not isinstance(text, str):
            raise TypeError(
                "CareTextEmbedder expects a string as input. "
                "In case you want to embed a list of Documents, please use the CareDocumentEmbedder."
            )
        if not text.strip():
            raise InputError("CareTextEmbedder: empty query")
        if self.embedder is None:
            raise RuntimeError(NOT_WARMED_UP)
        vector = self.embedder.embed_queries([text], instruction=self.instruction)[0]
        return {"embedding": vector.tolist()}

    # ------------------------------------------------------------------ async
    _async: AsyncEncoder | None = None  # made on the first run_async, around the warmed-up tower

    def _query_tower(self) -> QueryEncoder:
        if self.embedder is None:
            raise RuntimeError(NOT_WARMED_UP)
        return self.embedder

    def _async_encoder(self) -> AsyncEncoder:
        if self._async is None:
            self._async = AsyncEncoder(self._query_tower)
        return self._async

    @property
    def async_stats(self) -> EncoderStats:
        """Forward passes and queries ``run_async`` has run (concurrent runs share passes)."""
        return self._async_encoder().stats

    async def warm_up_async(self) -> None:
        """:meth:`warm_up` in a worker thread (``Pipeline.run_async`` calls it): loading never blocks the loop."""
        await asyncio.to_thread(self.warm_up)

    @component.output_types(embedding=list[float])
    async def run_async(self, text: str) -> dict[str, list[float]]:
        """:meth:`run` off the event loop; concurrent calls from one loop are encoded in one forward pass."""
        if not isinstance(text, str):
            raise TypeError(
                "CareTextEmbedder expects a string as input. "
                "In case you want to embed a list of Documents, please use the CareDocumentEmbedder."
            )
        if not text.strip():
            raise InputError("CareTextEmbedder: empty query")
        self._query_tower()  # not warmed up: the error now, not from the worker thread
        vectors = await self._async_encoder().embed_queries([text], instruction=self.instruction)
        return {"embedding": vectors[0].tolist()}
