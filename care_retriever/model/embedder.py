"""``AsymmetricEmbedder``: a small query tower and a large document tower in one embedding space.

On disk a CARE model is a sentence-transformers model whose first module is a ``Router`` with a ``query`` and a
``document`` route; ``care_config.json`` beside it keeps what sentence-transformers has no field for. So
``SentenceTransformer(folder).encode_query(...)`` works, and ``load="query"`` reads only the query route.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.modules import Module, Normalize, Router
from tqdm.auto import tqdm

from care_retriever.errors import ModelError
from care_retriever.model.config import CareConfig, TowerInfo
from care_retriever.model.embedder_base import ConfiguredEmbedder
from care_retriever.model.encoding import BatchLimits, check_texts, encode_texts
from care_retriever.model.fingerprint import weights_fingerprint
from care_retriever.model.pairing import TowerPairing
from care_retriever.model.reading import Load, read_release, read_saved, read_towers
from care_retriever.model.saving import save_model
from care_retriever.model.tower import Side, Tower
from care_retriever.runtime.batch_limits import DOCUMENT_BATCH_SIZE
from care_retriever.runtime.device import resolve_device
from care_retriever.version import __version__


def _assemble(modules: list[Module], device: torch.device, config: CareConfig) -> SentenceTransformer:
    # A tower that normalises before its Matryoshka cut carries its own Normalize: nothing renormalises after.
    tail: list[Module] = [Normalize()] if config.normalize == "after_truncation" else []
    return SentenceTransformer(
        modules=[*modules, *tail], device=str(device), similarity_fn_name=config.similarity, prompts={}
    )


class AsymmetricEmbedder(ConfiguredEmbedder):
    """Encode queries with the query tower and documents with the document tower, into one space.

    Build one from two pretrained towers with :meth:`from_towers`, or load a saved model with
    :meth:`from_pretrained`. ``embed_queries`` / ``embed_documents`` return L2-normalised float32
    arrays of width :attr:`dim`. The config it is built with is never changed: :meth:`with_tower` and
    :meth:`with_config` give a new model, and a save writes a copy (:meth:`saved_config`).

    Usage example:
    ```python
    from care_retriever import AsymmetricEmbedder

    embedder = AsymmetricEmbedder.from_pretrained("models/care")
    queries = embedder.embed_queries(["高血压怎么治疗"])
    documents = embedder.embed_documents(["高血压的治疗包括生活方式干预和药物治疗。"])
    assert queries.shape == documents.shape == (1, embedder.dim)
    print((queries @ documents.T)[0, 0])
    ```

    :param config: the model's :class:`~care_retriever.model.config.CareConfig` (``care_config.json``).
    :param query_modules: the query tower's sentence-transformers modules (None: not loaded).
    :param document_modules: the document tower's modules (None: not loaded).
    :param device: where the towers run (None: the best device the machine has).
    :raises ModelError: a tower's width is not the config's ``dim``.
    """

    def __init__(
        self,
        config: CareConfig,
        query_modules: list[Module] | None,
        document_modules: list[Module] | None,
        device: str | torch.device | None = None,
    ) -> None:
        self.config = config
        self.device = resolve_device(device)
        self._weights = config.space_fingerprint
        self.query_modules = query_modules
        self.document_modules = document_modules
        self._query_model = _assemble(query_modules, self.device, config) if query_modules else None
        self._document_model = _assemble(document_modules, self.device, config) if document_modules else None
        for side, model in (("query", self._query_model), ("document", self._document_model)):
            if model is not None and model.get_embedding_dimension() != config.dim:
                raise ModelError(
                    f"dimension mismatch: the {side} tower gives {model.get_embedding_dimension()} dims, "
                    f"the model's embedding dim is {config.dim}"
                )

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_towers(
        cls,
        query_model: str,
        document_model: str | None = None,
        pairing: TowerPairing | None = None,
        *,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = "auto",
    ) -> AsymmetricEmbedder:
        """Pair two pretrained towers (hub ids or folders) into one model.

        Each tower is read the way its own library reads it; the document tower is cut (Matryoshka) to the query
        tower's width.

        Usage example:
            ```python
            from care_retriever import AsymmetricEmbedder

            embedder = AsymmetricEmbedder.from_towers(
                "alibaba-nlp-community/gte-multilingual-base", "Qwen/Qwen3-Embedding-4B"
            )
            ```

        :param query_model: the query tower (a small encoder), hub id or folder.
        :param document_model: the document tower (an LLM embedder); None: the query tower on both sides.
        :param pairing: how the towers are paired (:class:`~care_retriever.model.pairing.TowerPairing`: pooling,
            prompts, max length, adapters, the authors' conventions); None: its defaults.
        :param device: where the towers run (default: the best device the machine has).
        :param dtype: the towers' precision: ``auto``, ``saved`` (each tower's own), or a named dtype.
        """
        parts = read_towers(query_model, document_model, pairing, device=device, dtype=dtype)
        return cls(parts.config, parts.query, parts.document, device=parts.device)

    @classmethod
    def from_release(
        cls,
        model_name_or_path: str | os.PathLike[str],
        load: Load = "both",
        *,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = "auto",
        trust_remote_code: bool = False,
        allow_pickled_weights: bool = False,
        attn_implementation: str | None = None,
    ) -> AsymmetricEmbedder:
        """Load a model in the authors' release layout (``query_encoder/`` + ``doc_encoder/``).

        Read exactly as the authors' inference code reads it (:mod:`care_retriever.model.towers.release`). A model
        whose card declares a non-commercial licence says so once, in one line.

        :param model_name_or_path: the release, a folder or hub id.
        :param load: the towers to build: ``both``, ``query`` (a search process; the document space's fingerprint
            then comes from the document tower's file hashes) or ``document``.
        :param device: where the towers run (None: the best device the machine has).
        :param dtype: the towers' precision: ``auto``, ``saved`` (each tower's own), or a named dtype.
        :param trust_remote_code: let a tower run model code shipped with it.
        :param allow_pickled_weights: read ``pytorch_model.bin`` weights (pickles run code when read).
        :param attn_implementation: ``sdpa``, ``flash_attention_2`` or ``eager`` (None: flash-attention where
            installed and usable, else sdpa).
        """
        parts = read_release(
            model_name_or_path,
            load,
            device=device,
            dtype=dtype,
            trust_remote_code=trust_remote_code,
            allow_pickled_weights=allow_pickled_weights,
            attn_implementation=attn_implementation,
        )
        return cls(parts.config, parts.query, parts.document, device=parts.device)

    @classmethod
    def from_pretrained(
        cls,
        model_name_or_path: str | os.PathLike[str],
        load: Load = "both",
        *,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = "auto",
        trust_remote_code: bool = False,
        allow_pickled_weights: bool = False,
        merge_lora: bool = True,
        revision: str | None = None,
        token: str | bool | None = None,
        cache_folder: str | None = None,
        attn_implementation: str | None = None,
    ) -> AsymmetricEmbedder:
        """Load a saved CARE model (torch towers) from a folder or hub id.

        A search process loads its query side with :func:`care_retriever.search.backends.load_query_embedder`,
        which picks the backend (torch, or the folder's ONNX / OpenVINO export).

        :param model_name_or_path: the model folder (``care-retriever init`` or training writes one) or hub id.
        :param load: the towers to build: ``both``, ``query`` (a search process) or ``document`` (indexing).
        :param device: where the towers run (None: the best device the machine has).
        :param dtype: the towers' precision: ``auto``, ``saved`` (each tower's own), or a named dtype.
        :param trust_remote_code: let a tower run model code shipped with it (refused unless asked: it runs code).
        :param allow_pickled_weights: read ``pytorch_model.bin`` weights (refused unless asked: pickles run code).
        :param merge_lora: merge a saved LoRA adapter into the document tower's weights.
        :param revision: the hub revision (branch, tag or commit) of a hub id.
        :param token: the hub token for a private model (True: the saved login).
        :param cache_folder: where hub downloads are kept (None: the hub's cache).
        :param attn_implementation: ``sdpa``, ``flash_attention_2`` or ``eager`` (None: flash-attention where
            installed and usable, else sdpa).
        """
        parts = read_saved(
            model_name_or_path,
            load,
            device=device,
            dtype=dtype,
            trust_remote_code=trust_remote_code,
            allow_pickled_weights=allow_pickled_weights,
            merge_lora=merge_lora,
            revision=revision,
            token=token,
            cache_folder=cache_folder,
            attn_implementation=attn_implementation,
        )
        return cls(parts.config, parts.query, parts.document, device=parts.device)

    # ------------------------------------------------------------------ properties
    @property
    def document_dim(self) -> int:
        """Native width of the document tower, before Matryoshka truncation to :attr:`dim`."""
        return self.config.document.native_dim

    @property
    def document_model_name(self) -> str:
        """The document tower's base model (hub id or folder), recorded in a store's manifest."""
        return self.config.document.base_model or ""

    @property
    def query_model(self) -> SentenceTransformer:
        if self._query_model is None:
            raise ModelError("this embedder was loaded with load='document'; the query tower is not loaded")
        return self._query_model

    @property
    def document_model(self) -> SentenceTransformer:
        if self._document_model is None:
            raise ModelError("this embedder was loaded with load='query'; the document tower is not loaded")
        return self._document_model

    def document_weights(self) -> str:
        """The document tower's weights fingerprint: the one its config records, else hashed once and kept.

        The space fingerprint covers them, so a new query tower alone keeps existing stores valid.
        """
        if self._weights is None:
            self._weights = self.hash_document_weights()
        return self._weights

    def hash_document_weights(self) -> str:
        """The fingerprint of the document tower's weights as they are in memory now (not kept)."""
        return weights_fingerprint(self.document_modules or [], self.config.dim)

    # ------------------------------------------------------------------ new models from this one
    def tower(self, side: Side) -> Tower:
        """The ``side`` tower as a value, with the document tower's weights fingerprint where known.

        :param side: ``query`` or ``document``.
        :raises ModelError: that tower was not loaded.
        """
        modules = self.query_modules if side == "query" else self.document_modules
        if modules is None:
            other = "document" if side == "query" else "query"
            raise ModelError(f"this embedder was loaded with load={other!r}; the {side} tower is not loaded")
        info: TowerInfo = getattr(self.config, side)
        return Tower(modules, replace(info), self._weights if side == "document" else None)

    def with_tower(self, side: Side, tower: Tower) -> AsymmetricEmbedder:
        """A new model with its ``side`` tower replaced by ``tower``; the other tower is shared, not copied.

        :param side: ``query`` or ``document``.
        :param tower: the new tower; a document tower brings its own weights fingerprint (None: hashed when asked).
        """
        query, document = self.query_modules, self.document_modules
        query_info, document_info = replace(self.config.query), replace(self.config.document)
        if side == "query":
            query, query_info, weights = tower.modules, replace(tower.info), self._weights
        else:
            document, document_info, weights = tower.modules, replace(tower.info), tower.weights
        config = replace(self.config, query=query_info, document=document_info, space_fingerprint=weights)
        return AsymmetricEmbedder(config, query, document, device=self.device)

    def with_config(self, **changes: Any) -> AsymmetricEmbedder:
        """A new model over the same towers whose config has ``changes``.

        :param changes: :class:`~care_retriever.model.config.CareConfig` fields and their new values.
        """
        config = replace(self.config, **{"space_fingerprint": self._weights, **changes})
        return AsymmetricEmbedder(config, self.query_modules, self.document_modules, device=self.device)

    def saved_config(self, *, rehash: bool = False) -> CareConfig:
        """The config a save writes: this one with the document weights' fingerprint and this package's version.

        :param rehash: hash the weights again first, and keep it (a tower trained in place since it was hashed).
        """
        if rehash:
            self._weights = self.hash_document_weights()
        return replace(self.config, space_fingerprint=self.document_weights(), care_retriever_version=__version__)

    # ------------------------------------------------------------------ encoding
    def embed_queries(
        self,
        texts: Sequence[str],
        *,
        instruction: str | None = None,
        batch_size: int = 32,
        show_progress: bool = False,
    ) -> np.ndarray:
        """Encode queries with the query tower: ``(len(texts), dim)`` float32, unit norm.

        :param texts: the queries.
        :param instruction: the instruction of the query prompt (None: the model's default).
        :param batch_size: queries per forward pass.
        :param show_progress: draw a progress bar.
        :raises ModelError: the query tower was not loaded.
        """
        texts = check_texts(texts, "queries")
        return encode_texts(
            self.query_model,
            texts,
            prompt=self.query_prompt(instruction),
            batch_size=batch_size,
            show_progress=show_progress,
            desc="Encoding queries",
            unit="query",
        )

    def embed_documents(
        self,
        texts: Sequence[str],
        *,
        batch_size: int = DOCUMENT_BATCH_SIZE,
        max_batch_tokens: int | None = None,
        show_progress: bool = False,
        limits: BatchLimits | None = None,
        progress: tqdm | None = None,
        stats: dict[str, int] | None = None,
    ) -> np.ndarray:
        """Encode documents with the document tower and its document prompt: ``(len(texts), dim)`` float32, unit norm.

        A batch that runs out of GPU memory is halved and retried (:func:`care_retriever.model.encoding.encode_texts`).

        :param texts: the documents' texts (:meth:`~care_retriever.documents.Document.embedding_text`).
        :param batch_size: documents per forward pass at most.
        :param max_batch_tokens: also at most that many padded tokens per forward pass (None: no budget).
        :param show_progress: draw a progress bar.
        :param limits: texts and tokens per pass as an object the caller keeps across calls (replaces the two above).
        :param progress: an outer progress bar to advance instead of drawing one.
        :param stats: a dict to add the ``truncated`` count to.
        :raises ModelError: the document tower was not loaded.
        """
        texts = check_texts(texts, "documents")
        return encode_texts(
            self.document_model,
            texts,
            prompt=self.config.document_prompt,
            batch_size=batch_size,
            max_batch_tokens=max_batch_tokens,
            limits=limits,
            show_progress=show_progress,
            desc="Encoding documents",
            unit="doc",
            progress=progress,
            stats=stats,
        )

    # ------------------------------------------------------------------ saving
    def to_sentence_transformer(self) -> SentenceTransformer:
        """One ``SentenceTransformer`` with a ``Router`` over both towers (shared parameters)."""
        if self.query_modules is None or self.document_modules is None:
            raise ModelError("saving or training needs both towers; load the model with load='both'")
        router = Router.for_query_document(self.query_modules, self.document_modules, default_route="document")
        prompts = {"query": self.query_prompt() or "", "document": self.config.document_prompt or ""}
        # Towers that normalise before the Matryoshka cut hold their own Normalize (nothing after the router).
        tail: list[Module] = [Normalize()] if self.config.normalize == "after_truncation" else []
        return SentenceTransformer(
            modules=[router, *tail],
            device=str(self.device),
            prompts=prompts,
            similarity_fn_name=self.config.similarity,
        )

    def save_pretrained(self, path: str | os.PathLike[str]) -> Path:
        """Write the model to ``path`` atomically (a temporary folder renamed into place).

        The document weights are hashed again (the tower may have been trained since); training uses
        :func:`~care_retriever.model.saving.save_model` for its options.

        :param path: the model folder to write.
        :returns: the folder written.
        """
        return save_model(self, path)

    @property
    def loaded_towers(self) -> tuple[str, ...]:
        """The towers in memory: ``("query",)`` in a search process (``load="query"``)."""
        return tuple(s for s, m in (("query", self._query_model), ("document", self._document_model)) if m is not None)

    def __repr__(self) -> str:
        loaded = list(self.loaded_towers)
        return (
            f"AsymmetricEmbedder(mode={self.mode}, dim={self.dim}, document_dim={self.document_dim}, loaded={loaded})"
        )
