"""What every exported query backend shares: tokenizers, pooling and normalisation in numpy, no torch.

Preprocessing and the steps after the transformer follow the torch path's definitions: the prompt
from ``care_config.json`` (:meth:`CareConfig.query_prompt`), the pooling named there, truncation to
the module's max length recorded at export, then L2 normalisation. Texts are sorted by length so
each batch pads to similar lengths, as :func:`care_retriever.model.encoding.encode_texts` does. A backend
subclass only runs the transformer (:meth:`ExportedQueryEmbedder._hidden_states`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import numpy as np

from care_retriever.errors import InputError, ModelError
from care_retriever.model.config import CareConfig
from care_retriever.model.embedder_base import ConfiguredEmbedder
from care_retriever.model.text_checks import check_texts
from care_retriever.search.backends.layout import (
    BACKEND_FILES,
    ExportRecord,
    QueryRoute,
    require_export,
)

POOLINGS = ("cls", "mean", "last_token")


def pool(hidden: np.ndarray, mask: np.ndarray, pooling: str) -> np.ndarray:
    """``(batch, seq, dim)`` token states -> ``(batch, dim)``, as sentence-transformers' Pooling does."""
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "mean":
        weights = mask[..., None].astype(hidden.dtype)
        return (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
    if pooling == "last_token":
        # right padding: the last real token sits at length - 1
        last = mask.sum(axis=1).astype(np.int64) - 1
        return hidden[np.arange(hidden.shape[0]), last]
    raise ModelError(f"Unknown pooling {pooling!r}. Available poolings: {list(POOLINGS)}")


def normalize(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.clip(norms, 1e-12, None)


def first_line(exc: BaseException) -> str:
    """The first line of a runtime's error message (they run to pages for a bad protobuf or IR)."""
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:200]


class ExportedQueryEmbedder(ConfiguredEmbedder):
    """Encode queries with an export of a CARE model's query tower (see ``care-retriever export``)."""

    backend: ClassVar[str]

    def __init__(self, config: CareConfig, route: QueryRoute, record: ExportRecord, model_file: str) -> None:
        from tokenizers import Tokenizer

        self.config = config
        self.route = route
        self.record = record
        self.model_path = route.backend_dir(self.backend) / model_file
        if config.query.pooling not in POOLINGS:
            raise ModelError(f"Unknown pooling {config.query.pooling!r}. Available poolings: {list(POOLINGS)}")
        tokenizer_file = route.transformer_dir / "tokenizer.json"
        try:
            self._tokenizer = Tokenizer.from_file(str(tokenizer_file))
        except Exception as exc:
            raise ModelError(f"{tokenizer_file}: cannot load the query tokenizer ({exc})") from exc
        self._tokenizer.enable_truncation(record.max_length)
        self._tokenizer.no_padding()
        # Tokenizer objects are not safe to share across threads mid-call.
        self._lock = threading.Lock()

    @classmethod
    def locate(
        cls, model_name_or_path: str | os.PathLike[str], model_file: str | None
    ) -> tuple[CareConfig, QueryRoute, ExportRecord, str]:
        """The checked export of a local model folder and the file to run (int8 when exported, else fp32)."""
        model = Path(model_name_or_path).expanduser()
        route, record = require_export(model, cls.backend)
        config = CareConfig.load(model)
        files = BACKEND_FILES[cls.backend]
        if model_file is None:
            model_file = next((files[q] for q in ("int8", "none") if files[q] in record.files), None)
        if model_file is None or model_file not in record.files:
            raise ModelError(
                f"{route.backend_dir(cls.backend)}: no exported file {model_file!r}. Available: {sorted(record.files)}"
            )
        return config, route, record, model_file

    # ------------------------------------------------------------------ what the search path reads
    @property
    def query_backend(self) -> str:
        """The backend that answers, with its quantisation: ``onnx``, ``onnx-int8``, ``openvino``, ``openvino-int8``."""
        int8 = self.record.files.get(self.model_path.name) == "int8"
        return f"{self.backend}-int8" if int8 else self.backend

    @property
    def loaded_towers(self) -> tuple[str, ...]:
        return ("query",)  # only ever the query tower

    def document_weights(self) -> str:
        # the document tower is not here: its fingerprint is the one the saved model records
        if not self.config.space_fingerprint:
            raise ModelError(f"{self.route.model}: care_config.json has no space_fingerprint; re-save the model")
        return self.config.space_fingerprint

    # ------------------------------------------------------------------ encoding
    def features(self, texts: list[str]) -> dict[str, np.ndarray]:
        """Token ids, attention mask and token types of ``texts``, right-padded: the transformer's inputs."""
        with self._lock:
            encodings = self._tokenizer.encode_batch(texts)
        width = max(len(e.ids) for e in encodings)
        ids = np.full((len(texts), width), self.record.pad_token_id, dtype=np.int64)
        mask = np.zeros((len(texts), width), dtype=np.int64)
        types = np.zeros((len(texts), width), dtype=np.int64)
        for row, enc in enumerate(encodings):
            n = len(enc.ids)
            ids[row, :n] = enc.ids
            mask[row, :n] = 1
            types[row, :n] = enc.type_ids
        features = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        return {name: features[name] for name in self.record.input_names}

    def _hidden_states(self, features: dict[str, np.ndarray]) -> np.ndarray:
        """``(batch, seq, dim)`` last hidden states of the transformer."""
        raise NotImplementedError

    def embed_queries(
        self, texts: Sequence[str], *, instruction: str | None = None, batch_size: int = 32, show_progress: bool = False
    ) -> np.ndarray:
        """Encode queries: ``(len(texts), dim)`` float32, unit norm (same contract as the torch embedder)."""
        texts = check_texts(texts, "queries")
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        if batch_size < 1:
            raise InputError(f"batch_size must be >= 1, got {batch_size}")
        prompt = self.query_prompt(instruction) or ""
        order = np.argsort([-len(t) for t in texts], kind="stable")
        for start in range(0, len(texts), batch_size):
            idx = order[start : start + batch_size]
            features = self.features([prompt + texts[i] for i in idx])
            hidden = self._hidden_states(features)
            pooled = pool(hidden, features["attention_mask"], self.config.query.pooling)
            vectors = normalize(pooled.astype(np.float32))
            if not np.isfinite(vectors).all():
                raise ModelError(f"{self.model_path}: the model produced non-finite embeddings")
            out[idx] = vectors
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}(file={self.model_path}, dim={self.dim}, pooling={self.config.query.pooling})"
