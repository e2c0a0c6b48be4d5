"""Export a CARE model's query tower to OpenVINO IR (openvino's converter) and quantise it (nncf), in place.

The transformer goes through the same torch.onnx graph as the ONNX export (one traced interface:
token inputs -> ``last_hidden_state``), which ``openvino.convert_model`` reads; the fp32 IR keeps fp32
weights (``save_model`` would halve them to fp16 by default). int8 is nncf's post-training static
quantisation (``nncf.quantize``, transformer preset: int8 weights and activations, the scales
calibrated on real query shapes): the shipped sample's medical queries with the model's query prompt,
one query per sample as the search path runs them. Pooling, the prompt and normalisation stay in
:mod:`care_retriever.backends.exported`.
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path
from typing import Any

from care_retriever.backends.layout import OPENVINO_FILES, read_care_config
from care_retriever.backends.onnx_export import (
    CHECK_QUERIES,
    ExportReport,
    TowerToExport,
    check_parity,
    load_tower,
    torch_export,
    write_export,
)

SAMPLE_QUERIES = Path(__file__).resolve().parents[1] / "data" / "sample" / "queries.jsonl"


def calibration_texts() -> list[str]:
    """Realistic medical queries for the int8 scales: the shipped sample's, plus the check queries."""
    rows = [json.loads(line)["text"] for line in SAMPLE_QUERIES.read_text("utf-8").splitlines() if line.strip()]
    return [*rows, *CHECK_QUERIES]


def export_openvino(model: str | Path, quantize: tuple[str, ...] = ("none", "int8")) -> ExportReport:
    """Write ``openvino/openvino_model.xml`` (and the int8 IR when asked) for the query tower of ``model``."""
    import openvino as ov

    tower = load_tower(model, "openvino", quantize)

    def write(tmp: Path) -> None:
        with tempfile.TemporaryDirectory(prefix="care-ov-") as scratch:
            onnx_path = Path(scratch) / "model.onnx"
            torch_export(tower, onnx_path)
            ov_model = ov.convert_model(str(onnx_path))
        ov.save_model(ov_model, str(tmp / OPENVINO_FILES["none"]), compress_to_fp16=False)
        if "int8" in quantize:
            quantized = _quantize_int8(ov_model, _calibration_items(tower))
            ov.save_model(quantized, str(tmp / OPENVINO_FILES["int8"]), compress_to_fp16=False)

    target = write_export(tower, write)
    return ExportReport(target, tower.record.files, check_parity(tower, "openvino"))


def _calibration_items(tower: TowerToExport) -> list[dict[str, Any]]:
    prompt = read_care_config(tower.folder).query_prompt(None) or ""
    tokenizer = tower.transformer.tokenizer
    names = tower.record.input_names
    items = []
    for text in calibration_texts():
        encoded = tokenizer(prompt + text, truncation=True, max_length=tower.record.max_length, return_tensors="np")
        items.append({name: encoded[name].astype("int64") for name in names})
    return items


def _quantize_int8(ov_model: Any, items: list[dict[str, Any]]) -> Any:
    import nncf

    # nncf logs its progress bars and backend notes at INFO; the CLI prints one line per file instead.
    nncf.set_log_level(logging.ERROR)
    return nncf.quantize(
        ov_model,
        nncf.Dataset(items),
        model_type=nncf.ModelType.TRANSFORMER,
        subset_size=len(items),
    )
