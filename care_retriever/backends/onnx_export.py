"""Export a CARE model's query tower to ONNX (torch.onnx) and quantise it (onnxruntime), in place.

Only the query route's transformer is exported, with sentence-transformers' / optimum's interface
(``input_ids``, ``attention_mask``[, ``token_type_ids``] -> ``last_hidden_state``); pooling, the prompt
and normalisation stay in :mod:`care_retriever.backends.onnx_embedder`, read from ``care_config.json``
like the torch path does. The export is written to a temp folder and renamed into place, then
checked against the torch tower on a few queries.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from care_retriever.backends.layout import (
    ONNX_FILES,
    QUANTIZE,
    RECORD_NAME,
    ExportRecord,
    query_fingerprint,
    query_route,
)
from care_retriever.errors import InputError, ModelError
from care_retriever.locations import replace_folder

logger = logging.getLogger("care_retriever")

# Queries of realistic shape for the export's own parity check (and the tracing example).
CHECK_QUERIES = (
    "高血压患者平时饮食需要注意什么？",
    "孩子发烧38度5，咳嗽有痰，需要去医院吗",
    "糖尿病",
    "怀孕期间感冒了可以吃什么药，会不会影响胎儿发育，已经咳嗽三天了",
)
ONNX_OPSET = 17


@dataclass
class ExportReport:
    folder: Path
    files: dict[str, str]
    min_cosine: dict[str, float]


def export_onnx(model: str | Path, quantize: tuple[str, ...] = ("none", "int8")) -> ExportReport:
    """Write ``onnx/model.onnx`` (and the int8 file when asked) for the query tower of ``model``."""
    import torch

    from care_retriever.embedder import AsymmetricEmbedder, is_decoder

    unknown = [q for q in quantize if q not in QUANTIZE]
    if unknown:
        raise InputError(f"Unknown quantize {unknown[0]!r}. Available: {list(QUANTIZE)}")
    folder = Path(model).expanduser()
    if not folder.is_dir():
        raise ModelError(f"export needs a local model folder; {model} is not one")
    route = query_route(folder)
    kinds = [route.types[m].rsplit(".", 1)[-1] for m in route.modules]
    if kinds != ["Transformer", "Pooling"]:
        raise ModelError(f"{folder}: the query route is {kinds}; only Transformer -> Pooling towers export to ONNX")
    fingerprint, stats = query_fingerprint(route)
    embedder = AsymmetricEmbedder.from_pretrained(folder, load="query", device="cpu", dtype="fp32")
    transformer = embedder.query_modules[0]
    if is_decoder(transformer):
        raise ModelError(
            f"{folder}: the query tower is a decoder ({transformer.auto_model.config.model_type}); only BERT-family "
            "query towers export to ONNX, so this model stays on --backend torch"
        )
    tokenizer = transformer.tokenizer
    probe = tokenizer(list(CHECK_QUERIES[:2]), padding=True, return_tensors="pt")
    input_names = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in probe]
    record = ExportRecord(
        backend="onnx",
        query_fingerprint=fingerprint,
        max_length=int(transformer.max_seq_length or tokenizer.model_max_length),
        input_names=input_names,
        pad_token_id=int(tokenizer.pad_token_id),
        pad_token=str(tokenizer.pad_token),
        files={ONNX_FILES[q]: q for q in ("none", *[q for q in quantize if q != "none"])},
        stats=stats,
    )
    target = route.backend_dir("onnx")
    tmp = Path(tempfile.mkdtemp(prefix=".onnx.", dir=route.transformer_dir))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it owner-only; the export is read by whoever serves the model
        fp32 = tmp / ONNX_FILES["none"]
        _torch_export(torch, transformer.auto_model, probe, input_names, fp32)
        if "int8" in quantize:
            _quantize_int8(fp32, tmp / ONNX_FILES["int8"])
        for name in record.files:
            _externalize_weights(tmp / name)
        (tmp / RECORD_NAME).write_text(record.to_json(), encoding="utf-8")
        replace_folder(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ExportReport(target, record.files, _check_parity(folder, embedder, record.files))


def _torch_export(torch: Any, model: Any, probe: Any, input_names: list[str], path: Path) -> None:
    class LastHiddenState(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
            return self.inner(**dict(zip(input_names, inputs, strict=True))).last_hidden_state

    model.eval()
    axes = {n: {0: "batch", 1: "sequence"} for n in input_names}
    axes["last_hidden_state"] = {0: "batch", 1: "sequence"}
    with torch.inference_mode(), warnings.catch_warnings():
        # the TorchScript exporter is deprecated upstream; it needs no extra package and handles BERT
        warnings.simplefilter("ignore")
        torch.onnx.export(
            LastHiddenState(model),
            tuple(probe[n] for n in input_names),
            str(path),
            input_names=input_names,
            output_names=["last_hidden_state"],
            dynamic_axes=axes,
            opset_version=ONNX_OPSET,
            dynamo=False,
        )


def _quantize_int8(source: Path, target: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # sentence-transformers' avx512_vnni config: dynamic, u8 activations, s8 weights, per tensor.
    # onnxruntime logs a "consider pre-processing" hint on the root logger; a CLI user cannot act on it.
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        quantize_dynamic(source, target, weight_type=QuantType.QInt8, per_channel=False, reduce_range=False)
    finally:
        root.setLevel(level)


def _externalize_weights(path: Path) -> None:
    """Move the weights to ``<file>_data`` beside the graph (optimum's layout for large models).

    onnxruntime memory-maps external weights, so a search process keeps resident only the pages it
    touches (the embedding rows of the tokens it sees) instead of a parsed copy of the whole file.
    """
    import onnx

    graph = onnx.load(str(path))
    data = path.with_name(path.name + "_data")
    onnx.save_model(
        graph,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=data.name,
        size_threshold=1024,
    )
    data.chmod(0o644)  # onnx writes it owner-only


def _check_parity(folder: Path, embedder: Any, files: dict[str, str]) -> dict[str, float]:
    from care_retriever.backends.onnx_embedder import OnnxQueryEmbedder

    reference = embedder.embed_queries(list(CHECK_QUERIES))
    out = {}
    for name in files:
        vectors = OnnxQueryEmbedder.from_pretrained(folder, onnx_file=name).embed_queries(list(CHECK_QUERIES))
        out[name] = float(np.min(np.sum(vectors * reference, axis=1)))
    return out
