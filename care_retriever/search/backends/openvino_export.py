"""Export a CARE model's query tower to OpenVINO IR (openvino's converter) and quantise it (nncf), in place.

The transformer goes through the same torch.onnx graph as the ONNX export (one traced interface:
token inputs -> ``last_hidden_state``), which ``openvino.convert_model`` reads; the fp32 IR keeps fp32
weights (``save_model`` would halve them to fp16 by default). int8 is nncf's weight compression
(``nncf.compress_weights``: int8 weights, asymmetric, per output channel; activations stay fp32),
rather than static quantisation (int8 activations calibrated on query texts): calibrated activation ranges move a
small tower with wide weights out of the document space, which silently ruins retrieval. Pooling, the prompt and
normalisation stay in :mod:`care_retriever.search.backends.exported`.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

from care_retriever.search.backends.layout import OPENVINO_FILES
from care_retriever.search.backends.onnx_export import (
    ExportReport,
    check_parity,
    load_tower,
    torch_export,
    write_export,
)


def export_openvino(
    model: str | Path, quantize: tuple[str, ...] = ("none", "int8"), trust_remote_code: bool = False
) -> ExportReport:
    """Write ``openvino/openvino_model.xml`` (and the int8 IR when asked) for the query tower of ``model``."""
    import openvino as ov

    tower = load_tower(model, "openvino", quantize, trust_remote_code)

    def write(tmp: Path) -> None:
        with tempfile.TemporaryDirectory(prefix="care-ov-") as scratch:
            onnx_path = Path(scratch) / "model.onnx"
            torch_export(tower, onnx_path)
            # saved while the graph file exists: the converter may read its weights lazily
            ov_model = ov.convert_model(str(onnx_path))
            ov.save_model(ov_model, str(tmp / OPENVINO_FILES["none"]), compress_to_fp16=False)
            if "int8" in quantize:
                ov.save_model(_compress_int8(ov_model), str(tmp / OPENVINO_FILES["int8"]), compress_to_fp16=False)

    target = write_export(tower, write)
    return ExportReport(target, tower.record.files, check_parity(tower, "openvino"))


def _compress_int8(ov_model: Any) -> Any:
    import nncf

    nncf.set_log_level(logging.ERROR)  # its notes on the chosen modes; the CLI prints one line per file
    return nncf.compress_weights(ov_model, mode=nncf.CompressWeightsMode.INT8_ASYM)
