"""Baselines with the embedder interface of :class:`~care_retriever.model.embedder.AsymmetricEmbedder`.

Evaluation and benchmarks compare models through one interface
(:class:`~care_retriever.model.protocols.Embedder`), so ``load_embedder`` resolves a name to:

- ``bm25``: the lexical baseline (:class:`care_retriever.sparse.bm25.BM25Model`);
- a CARE folder (has ``care_config.json``): :class:`AsymmetricEmbedder`; ``DIR#query`` and
  ``DIR#document`` use one of its towers on both sides (the small symmetric model and the symmetric
  LLM path that the asymmetric model is measured against);
- anything else: a sentence-transformers model or folder, :class:`SentenceTransformerEmbedder`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from care_retriever.errors import InputError, ModelError
from care_retriever.model import fingerprint
from care_retriever.model.embedder_base import EmbedderBase
from care_retriever.model.protocols import Embedder
from care_retriever.model.towers.loading import hub_options, local_model_dir, quiet_transformers
from care_retriever.model.towers.prompts import QUERY_PROMPT_TEMPLATE, fill_query_prompt, is_instruction_prompt
from care_retriever.runtime.batch_limits import DOCUMENT_BATCH_SIZE

if TYPE_CHECKING:
    from tqdm.auto import tqdm

    from care_retriever.model.embedder import AsymmetricEmbedder
    from care_retriever.model.encoding import BatchLimits
    from care_retriever.sparse.bm25 import BM25Model

TOWER_SUFFIXES: dict[str, Literal["query", "document"]] = {"#query": "query", "#document": "document"}


class OneModelEmbedder(EmbedderBase):
    """One model on both sides (the baselines): symmetric, both sides in memory, its weights the document side's."""

    model: Any
    _weights: str | None = None

    @property
    def mode(self) -> str:
        return "symmetric"

    @property
    def similarity(self) -> str:
        return "cosine"  # what a baseline's store has always recorded: its scores are compared as cosines

    @property
    def loaded_towers(self) -> tuple[str, ...]:
        return ("query", "document")  # one model, both sides

    @property
    def document_model(self) -> Any:
        """The model both sides run."""
        return self.model

    @property
    def query_model(self) -> Any:
        return self.model

    def document_weights(self) -> str:
        # hashed on first use and kept: the model is not trained through this interface
        if self._weights is None:
            self._weights = fingerprint.weights_fingerprint([self.model], self.dim)
        return self._weights


class SentenceTransformerEmbedder(OneModelEmbedder):
    """Any sentence-transformers model (hub id or folder) as a CARE-style embedder.

    ``query_prompt_template="auto"``: a model whose ``query`` prompt is an ``Instruct: ...`` prompt
    (Qwen3-Embedding, gte-Qwen2-instruct) gets the task's instruction in that form; a model with a
    fixed query prompt (bge-zh) keeps it; other models get no prompt. Documents take the model's own
    ``document`` prompt, if any.
    """

    def __init__(
        self,
        model_name_or_path: str,
        *,
        device: str | None = None,
        query_prompt_template: str | Literal["auto"] | None = "auto",
        trust_remote_code: bool = False,
        max_length: int | None = None,
    ) -> None:
        from sentence_transformers import SentenceTransformer

        from care_retriever.runtime.device import resolve_device

        self.name = model_name_or_path
        try:
            self.model = SentenceTransformer(
                model_name_or_path,
                device=str(resolve_device(device)),
                trust_remote_code=trust_remote_code,
                **hub_options(),
            )
        except (OSError, ValueError) as exc:
            raise ModelError(
                f"cannot load sentence-transformers model {model_name_or_path!r}: {str(exc).splitlines()[0]}"
            ) from exc
        if max_length:
            self.model.max_seq_length = max_length
        fixed = self.model.prompts.get("query") or None
        if query_prompt_template == "auto":
            query_prompt_template = QUERY_PROMPT_TEMPLATE if is_instruction_prompt(fixed) else None
        self.query_prompt_template = query_prompt_template
        self.fixed_query_prompt = fixed

    @property
    def dim(self) -> int:
        dim = self.model.get_embedding_dimension()
        if dim is None:
            raise ModelError(f"{self.name}: the model gives no sentence embedding (no pooling module)")
        return dim

    @property
    def document_model_name(self) -> str:
        return self.name

    def query_prompt(self, instruction: str | None = None) -> str | None:
        if self.query_prompt_template and instruction:
            return fill_query_prompt(self.query_prompt_template, instruction)
        return self.fixed_query_prompt

    def embed_queries(
        self,
        texts: Sequence[str],
        *,
        instruction: str | None = None,
        batch_size: int = 32,
        show_progress: bool = False,
    ) -> np.ndarray:
        from care_retriever.model.encoding import check_texts

        texts = check_texts(texts, "queries")
        return self._encode(
            self.model.encode_query, texts, self.query_prompt(instruction) or "", batch_size, show_progress
        )

    def embed_documents(
        self,
        texts: Sequence[str],
        *,
        batch_size: int = DOCUMENT_BATCH_SIZE,
        show_progress: bool = False,
        limits: BatchLimits | None = None,
        progress: tqdm | None = None,
        stats: dict[str, int] | None = None,
    ) -> np.ndarray:
        """sentence-transformers' ``encode_document`` (its own document prompt and normalisation).

        ``limits``: only its text count applies (no token budget, no out-of-memory back-off); ``progress`` is
        advanced once for all ``texts``; ``stats`` gets no truncation count: this path exists to compare
        models, and the index writer's speed with a baseline (:mod:`care_retriever.evaluation.speed`).
        """
        from care_retriever.model.encoding import check_texts

        texts = check_texts(texts, "documents")
        batch = limits.texts if limits is not None else batch_size
        vectors = self._encode(self.model.encode_document, texts, None, batch, show_progress and progress is None)
        if progress is not None:
            progress.update(len(texts))
        return vectors

    def _encode(
        self, fn: Any, texts: list[str], prompt: str | None, batch_size: int, show_progress: bool
    ) -> np.ndarray:
        if not texts:
            return np.empty((0, self.dim), dtype=np.float32)
        out = fn(
            texts,
            prompt=prompt,
            batch_size=batch_size,
            show_progress_bar=show_progress,
            convert_to_numpy=True,
            normalize_embeddings=True,
        )
        return np.ascontiguousarray(out, dtype=np.float32)

    def __repr__(self) -> str:
        return f"SentenceTransformerEmbedder({self.name!r}, dim={self.dim})"


class OneTowerEmbedder(OneModelEmbedder):
    """One tower of a CARE model on both sides: the symmetric baselines of the paper's Table 4.

    ``tower="document"`` is the symmetric LLM path, ``tower="query"`` the small symmetric model.
    Queries take the model's own query prompt (none for BERT query towers): the symmetric document
    stage of ``care_retriever.training`` trains the document tower on queries without a prompt, so
    adding one here would score a tower on inputs it never saw.
    """

    def __init__(self, embedder: AsymmetricEmbedder, tower: Literal["query", "document"]) -> None:
        from care_retriever.model.towers.prompts import DEFAULT_INSTRUCTION

        self.embedder = embedder
        self.tower = tower
        self.model = embedder.query_model if tower == "query" else embedder.document_model
        self.template = embedder.config.query_prompt_template
        self.default_instruction = embedder.config.default_instruction or DEFAULT_INSTRUCTION

    @property
    def dim(self) -> int:
        return int(self.embedder.dim)

    @property
    def document_model_name(self) -> str:
        tower = self.embedder.config.query if self.tower == "query" else self.embedder.config.document
        return tower.base_model or ""

    def query_prompt(self, instruction: str | None = None) -> str | None:
        return fill_query_prompt(self.template, instruction or self.default_instruction)

    def embed_queries(
        self,
        texts: Sequence[str],
        *,
        instruction: str | None = None,
        batch_size: int = 32,
        show_progress: bool = False,
    ) -> np.ndarray:
        from care_retriever.model.encoding import check_texts, encode_texts

        return encode_texts(
            self.model,
            check_texts(texts, "queries"),
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
        show_progress: bool = False,
        limits: BatchLimits | None = None,
        progress: tqdm | None = None,
        stats: dict[str, int] | None = None,
    ) -> np.ndarray:
        from care_retriever.model.encoding import check_texts, encode_texts

        return encode_texts(
            self.model,
            check_texts(texts, "documents"),
            batch_size=batch_size,
            limits=limits,
            show_progress=show_progress,
            desc="Encoding documents",
            unit="doc",
            progress=progress,
            stats=stats,
        )

    def __repr__(self) -> str:
        return f"OneTowerEmbedder({self.tower} tower of {self.embedder!r})"


def is_care_folder(path: str | os.PathLike[str]) -> bool:
    from care_retriever.model.config import CONFIG_NAME

    return Path(path).is_dir() and (Path(path) / CONFIG_NAME).is_file()


def is_care_model(name: str) -> bool:
    """A CARE model: a folder with ``care_config.json``, or the authors' release layout (folder or hub id)."""
    from care_retriever.model.towers import release

    local = local_model_dir(name)
    if local is not None and is_care_folder(local):
        return True
    return release.find_release(name, need=()) is not None


def load_embedder(
    name_or_path: str,
    *,
    device: str | None = None,
    load: Literal["both", "query", "document"] = "both",
    trust_remote_code: bool = False,
) -> Embedder | BM25Model:
    """Resolve ``bm25``, a CARE folder (``DIR``, ``DIR#query``, ``DIR#document``) or an ST model."""
    if not name_or_path or not name_or_path.strip():
        raise InputError("empty model name")
    if name_or_path.lower() == "bm25":
        from care_retriever.sparse.bm25 import BM25Model

        return BM25Model()
    base, tower = name_or_path, None
    for suffix, side in TOWER_SUFFIXES.items():
        if name_or_path.endswith(suffix):
            base, tower = name_or_path[: -len(suffix)], side
    local = local_model_dir(base)
    if is_care_model(base):  # care_config.json, or the authors' release layout (query_encoder/ + doc_encoder/)
        quiet_transformers()
        from care_retriever.model.embedder import AsymmetricEmbedder

        embedder = AsymmetricEmbedder.from_pretrained(
            str(local) if local is not None else base,
            load=tower or load,
            device=device,
            trust_remote_code=trust_remote_code,
        )
        return OneTowerEmbedder(embedder, tower) if tower else embedder
    if tower:
        raise ModelError(
            f"{base}: '#{tower}' selects a tower of a CARE model (a folder with care_config.json, or the authors' "
            "release layout)"
        )
    quiet_transformers()
    return SentenceTransformerEmbedder(
        str(local) if local is not None else name_or_path, device=device, trust_remote_code=trust_remote_code
    )
