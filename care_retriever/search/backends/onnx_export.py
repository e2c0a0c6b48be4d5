"""Export a CARE model's query tower to ONNX (torch.onnx) and quantise it (onnxruntime), in place.

Only the query route's transformer is exported, with sentence-transformers' / optimum's interface
(``input_ids``, ``attention_mask``[, ``token_type_ids``] -> ``last_hidden_state``); pooling, the prompt
and normalisation stay in :mod:`care_retriever.search.backends.onnx_embedder`, read from ``care_config.json``
like the torch path does. The export is written to a temp folder and renamed into place, then
checked against the torch tower on a few queries.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from care_retriever.errors import InputError, ModelError
from care_retriever.model.towers.loading import replace_folder
from care_retriever.search.backends.layout import (
    BACKEND_FILES,
    ONNX_FILES,
    QUANTIZE,
    RECORD_NAME,
    ROUTER_CONFIG,
    ExportRecord,
    QueryRoute,
    query_fingerprint,
    query_route,
)

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


@dataclass
class TowerToExport:
    """The query tower of a local CARE model, loaded on torch, with the record its export will carry."""

    folder: Path
    route: QueryRoute
    embedder: Any  # AsymmetricEmbedder holding the query tower
    transformer: Any  # its sentence-transformers Transformer module
    probe: Any  # tokenised CHECK_QUERIES[:2]: tracing example
    record: ExportRecord


def load_tower(
    model: str | Path, backend: str, quantize: tuple[str, ...], trust_remote_code: bool = False
) -> TowerToExport:
    """Check ``model`` can be exported to ``backend`` and load its query tower (fp32, CPU)."""
    from sentence_transformers.sentence_transformer.modules import Transformer

    from care_retriever.model.embedder import AsymmetricEmbedder
    from care_retriever.runtime.architecture import is_decoder

    unknown = [q for q in quantize if q not in QUANTIZE]
    if unknown:
        raise InputError(f"Unknown quantize {unknown[0]!r}. Available: {list(QUANTIZE)}")
    folder = Path(model).expanduser()
    if not folder.is_dir():
        raise ModelError(f"export needs a local model folder; {model} is not one")
    from care_retriever.model.towers import release

    if release.find_release(str(folder), need=()) is not None and not (folder / ROUTER_CONFIG).is_file():
        raise ModelError(
            f"{folder}: a model in the authors' release layout exports once converted: "
            f"care-retriever init OUT --from-release {folder}, then export OUT"
        )
    route = query_route(folder)
    kinds = [route.types[m].rsplit(".", 1)[-1] for m in route.modules]
    # A Normalize in the route (a tower normalised before its cut, with nothing cut off the query side) is what
    # the exported runtime does after pooling anyway.
    if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        raise ModelError(f"{folder}: the query route is {kinds}; only Transformer -> Pooling towers export")
    fingerprint, stats = query_fingerprint(route)
    embedder = AsymmetricEmbedder.from_pretrained(
        folder, load="query", device="cpu", dtype="fp32", trust_remote_code=trust_remote_code
    )
    transformer = embedder.query_modules[0] if embedder.query_modules else None
    if not isinstance(transformer, Transformer):
        raise ModelError(f"{folder}: the query route does not start with a Transformer module")
    if is_decoder(transformer):
        raise ModelError(
            f"{folder}: the query tower is a decoder ({transformer.auto_model.config.model_type}); only BERT-family "
            f"query towers export to {backend}, so this model stays on --backend torch"
        )
    tokenizer = transformer.tokenizer
    probe = tokenizer(list(CHECK_QUERIES[:2]), padding=True, return_tensors="pt")
    files = BACKEND_FILES[backend]
    record = ExportRecord(
        backend=backend,
        query_fingerprint=fingerprint,
        max_length=int(transformer.max_seq_length or tokenizer.model_max_length),
        input_names=[n for n in ("input_ids", "attention_mask", "token_type_ids") if n in probe],
        pad_token_id=int(tokenizer.pad_token_id),
        pad_token=str(tokenizer.pad_token),
        files={files[q]: q for q in ("none", *[q for q in quantize if q != "none"])},
        stats=stats,
    )
    return TowerToExport(folder, route, embedder, transformer, probe, record)


def write_export(tower: TowerToExport, write: Callable[[Path], None]) -> Path:
    """Run ``write(tmp)``, add the record and swap the folder into place; nothing half-written is left."""
    backend = tower.record.backend
    target = tower.route.backend_dir(backend)
    tmp = Path(tempfile.mkdtemp(prefix=f".{backend}.", dir=tower.route.transformer_dir))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it owner-only; the export is read by whoever serves the model
        write(tmp)
        (tmp / RECORD_NAME).write_text(tower.record.to_json(), encoding="utf-8")
        replace_folder(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def export_onnx(
    model: str | Path, quantize: tuple[str, ...] = ("none", "int8"), trust_remote_code: bool = False
) -> ExportReport:
    """Write ``onnx/model.onnx`` (and the int8 file when asked) for the query tower of ``model``."""
    tower = load_tower(model, "onnx", quantize, trust_remote_code)

    def write(tmp: Path) -> None:
        fp32 = tmp / ONNX_FILES["none"]
        torch_export(tower, fp32)
        if "int8" in quantize:
            _quantize_int8(fp32, tmp / ONNX_FILES["int8"])
        for name in tower.record.files:
            _externalize_weights(tmp / name)

    target = write_export(tower, write)
    return ExportReport(target, tower.record.files, check_parity(tower, "onnx"))


def torch_export(tower: TowerToExport, path: Path) -> None:
    """The transformer of the query tower as one ONNX graph: token inputs -> ``last_hidden_state``."""
    import torch

    _torch_export(torch, tower.transformer.auto_model, tower.probe, tower.record.input_names, path)


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


def check_parity(tower: TowerToExport, backend: str) -> dict[str, float]:
    """Minimum cosine of each exported file's query vectors to the torch tower's, on CHECK_QUERIES."""
    from care_retriever.search.backends import load_query_embedder

    reference = tower.embedder.embed_queries(list(CHECK_QUERIES))
    file_option = {"onnx": "onnx_file", "openvino": "openvino_file"}[backend]
    out = {}
    for name in tower.record.files:
        option: dict[str, Any] = {file_option: name}
        embedder = load_query_embedder(tower.folder, backend, **option)
        vectors = embedder.embed_queries(list(CHECK_QUERIES))
        out[name] = float(np.min(np.sum(vectors * reference, axis=1)))
    return out
