"""The query tower on OpenVINO Runtime (CPU): tokenizers + openvino + numpy, no torch."""

from __future__ import annotations

import os

import numpy as np

from care_retriever.errors import ModelError
from care_retriever.model.config import CareConfig
from care_retriever.search.backends.exported import ExportedQueryEmbedder, first_line
from care_retriever.search.backends.layout import ExportRecord, QueryRoute, export_command


class OpenVinoQueryEmbedder(ExportedQueryEmbedder):
    """Encode queries with an OpenVINO export of a CARE model's query tower (see ``care-retriever export``)."""

    backend = "openvino"

    def __init__(
        self,
        config: CareConfig,
        route: QueryRoute,
        record: ExportRecord,
        openvino_file: str,
        threads: int | None = None,
    ) -> None:
        import openvino as ov

        super().__init__(config, route, record, openvino_file)
        # LATENCY: one stream, every core on one request (the search path's batch-1 case); the
        # weights (.bin beside the .xml) are memory-mapped by default.
        properties: dict[str, object] = {"PERFORMANCE_HINT": "LATENCY"}
        if threads:
            properties["INFERENCE_NUM_THREADS"] = threads
        weights = self.model_path.with_suffix(".bin")
        try:
            core = ov.Core()
            self._compiled = core.compile_model(core.read_model(self.model_path, weights), "CPU", properties)
        except Exception as exc:  # openvino raises RuntimeError with the parser's message
            raise ModelError(
                f"{self.model_path} (weights {weights}): not a loadable OpenVINO model ({first_line(exc)}); "
                f"re-run `{export_command(route.model, 'openvino')}`"
            ) from exc
        self._output = self._compiled.output(0)

    @classmethod
    def from_pretrained(
        cls, model_name_or_path: str | os.PathLike[str], *, openvino_file: str | None = None, threads: int | None = None
    ) -> OpenVinoQueryEmbedder:
        """Load the OpenVINO query tower of a local CARE model folder (int8 when exported, else fp32)."""
        config, route, record, openvino_file = cls.locate(model_name_or_path, openvino_file)
        return cls(config, route, record, openvino_file, threads=threads)

    def _hidden_states(self, features: dict[str, np.ndarray]) -> np.ndarray:
        # One infer request per call: a request holds its own buffers, so concurrent callers
        # (the server's threads) never share one; the compiled model is thread-safe.
        request = self._compiled.create_infer_request()
        return request.infer(features)[self._output]
