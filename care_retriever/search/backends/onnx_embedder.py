"""The query tower on ONNX Runtime: tokenizers + onnxruntime + numpy, no torch."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from care_retriever.errors import ModelError
from care_retriever.model.config import CareConfig
from care_retriever.search.backends.exported import ExportedQueryEmbedder, first_line, normalize, pool
from care_retriever.search.backends.layout import ExportRecord, QueryRoute, export_command

__all__ = ["OnnxQueryEmbedder", "normalize", "pool"]


class OnnxQueryEmbedder(ExportedQueryEmbedder):
    """Encode queries with an ONNX export of a CARE model's query tower (see ``care-retriever export``)."""

    backend = "onnx"

    def __init__(
        self, config: CareConfig, route: QueryRoute, record: ExportRecord, onnx_file: str, threads: int | None = None
    ) -> None:
        import onnxruntime as ort

        super().__init__(config, route, record, onnx_file)
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
            # Idle pool threads spin by default, taking the cores from forward passes running beside them.
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            self._session = ort.InferenceSession(str(self.model_path), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own exception types for bad protobufs
            raise ModelError(
                f"{self.model_path}: not a loadable ONNX model ({first_line(exc)}); "
                f"re-run `{export_command(route.model, 'onnx')}`"
            ) from exc

    @property
    def onnx_path(self) -> Path:  # the name the first version of this class had
        return self.model_path

    @classmethod
    def from_pretrained(
        cls, model_name_or_path: str | os.PathLike[str], *, onnx_file: str | None = None, threads: int | None = None
    ) -> OnnxQueryEmbedder:
        """Load the ONNX query tower of a local CARE model folder (int8 when exported, else fp32)."""
        config, route, record, onnx_file = cls.locate(model_name_or_path, onnx_file)
        return cls(config, route, record, onnx_file, threads=threads)

    def _hidden_states(self, features: dict[str, np.ndarray]) -> np.ndarray:
        (hidden,) = self._session.run(["last_hidden_state"], features)
        return hidden
