"""Where an export lives in a CARE model folder, and how it is tied to the query tower it came from.

sentence-transformers keeps backend files in a ``<backend>/`` folder beside the weights of a
Transformer module (``onnx/model.onnx``, ``onnx/model_qint8_avx512_vnni.onnx``,
``openvino/openvino_model.xml``, ``openvino/openvino_model_qint8_quantized.xml``); in a CARE model the
query tower is the ``query`` route of the Router, so the export goes to
``<model>/<query Transformer module>/<backend>/``. ``care_export.json`` beside it records the query
tower's fingerprint (a hash of its module files) and what the runtime needs to reproduce the torch
preprocessing (max length, input names, padding token).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from care_retriever.errors import ModelError

BACKENDS = ("auto", "torch", "onnx", "openvino")
EXPORT_BACKENDS = ("onnx", "openvino")
QUANTIZE = ("int8", "none")
RECORD_NAME = "care_export.json"
ONNX_FP32 = "model.onnx"
# sentence-transformers' name for dynamic int8 (avx512_vnni config: u8 activations, s8 weights)
ONNX_INT8 = "model_qint8_avx512_vnni.onnx"
ONNX_FILES = {"none": ONNX_FP32, "int8": ONNX_INT8}
# sentence-transformers' names for OpenVINO (``openvino_model_{file_suffix}.xml``, weights in a .bin beside it)
OPENVINO_FP32 = "openvino_model.xml"
OPENVINO_INT8 = "openvino_model_qint8_quantized.xml"
OPENVINO_FILES = {"none": OPENVINO_FP32, "int8": OPENVINO_INT8}
BACKEND_FILES = {"onnx": ONNX_FILES, "openvino": OPENVINO_FILES}
ROUTER_CONFIG = "router_config.json"
# Backend folders inside a module folder: not part of the tower they were exported from; nor are an
# export's staging folder (``.onnx.<random>``) and the previous copy being replaced (``.onnx.old``),
# which a killed export can leave behind.
_BACKEND_DIRS = frozenset({"onnx", "openvino"})
_BACKEND_STAGING = tuple(f".{name}." for name in sorted(_BACKEND_DIRS))
RECORD_VERSION = 1


def export_command(model: str | Path, backend: str) -> str:
    return f"care-retriever export --model {model} --backend {backend}"


@dataclass
class QueryRoute:
    """The query route of a saved CARE model: its module folders, in order."""

    model: Path
    transformer: str
    modules: list[str]
    types: dict[str, str]

    @property
    def transformer_dir(self) -> Path:
        return self.model / self.transformer

    def backend_dir(self, backend: str) -> Path:
        return self.transformer_dir / backend


@dataclass
class ExportRecord:
    backend: str
    query_fingerprint: str
    max_length: int
    input_names: list[str]
    pad_token_id: int
    pad_token: str
    files: dict[str, str] = field(default_factory=dict)  # file name -> quantisation ("none" | "int8")
    # Size and mtime of each fingerprinted file: when they all match, the fingerprint is not recomputed.
    stats: dict[str, list[int]] = field(default_factory=dict)
    format_version: int = RECORD_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False, indent=2)


def query_route(model: Path) -> QueryRoute:
    path = model / ROUTER_CONFIG
    if not path.is_file():
        raise ModelError(f"{model}: missing {ROUTER_CONFIG}; the model folder is incomplete")
    router = json.loads(path.read_text("utf-8"))
    structure, types = router.get("structure", {}), router.get("types", {})
    if "query" not in structure:
        raise ModelError(f"No route found for task 'query' in {model}. Available routes: {sorted(structure)}")
    modules = list(structure["query"])
    transformers = [m for m in modules if types.get(m, "").endswith(".Transformer")]
    if len(transformers) != 1:
        raise ModelError(f"{model}: the query route {modules} has no single Transformer module to export")
    return QueryRoute(model, transformers[0], modules, {m: types.get(m, "") for m in modules})


def _tower_files(route: QueryRoute) -> list[Path]:
    files: list[Path] = []
    for module in route.modules:
        folder = route.model / module
        for path in sorted(folder.rglob("*")):
            rel = path.relative_to(folder)
            if path.is_file() and rel.parts[0] not in _BACKEND_DIRS and not rel.parts[0].startswith(_BACKEND_STAGING):
                files.append(path)
    return files


def _stats(route: QueryRoute, files: list[Path]) -> dict[str, list[int]]:
    out = {}
    for path in files:
        st = path.stat()
        out[path.relative_to(route.model).as_posix()] = [st.st_size, st.st_mtime_ns]
    return out


def _file_digest(path: Path) -> bytes:
    digest = hashlib.blake2b(digest_size=16)
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 22):
            digest.update(chunk)
    return digest.digest()


def query_fingerprint(route: QueryRoute) -> tuple[str, dict[str, list[int]]]:
    """Hash of the query route's module files (weights, tokenizer, configs), and their size/mtime."""
    files = _tower_files(route)
    digest = hashlib.blake2b(digest_size=16)
    for path in files:
        digest.update(path.relative_to(route.model).as_posix().encode())
        digest.update(_file_digest(path))
    return digest.hexdigest(), _stats(route, files)


def find_export(model: Path, backend: str) -> ExportRecord | None:
    """The export record of ``backend`` in ``model``, or None when there is none (no check of its files)."""
    try:
        route = query_route(model)
    except ModelError:
        return None
    path = route.backend_dir(backend) / RECORD_NAME
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text("utf-8"))
        return ExportRecord(**data)
    except (OSError, ValueError, TypeError) as exc:
        raise ModelError(
            f"{path}: unreadable export record ({exc}); re-run `{export_command(model, backend)}`"
        ) from exc


def require_export(model: Path, backend: str) -> tuple[QueryRoute, ExportRecord]:
    """The export of ``backend``, checked against the folder's query tower; one-line errors otherwise."""
    if not model.is_dir():
        raise ModelError(f"backend {backend!r} needs a local model folder; {model} is not one")
    route = query_route(model)
    record = find_export(model, backend)
    if record is None:
        raise ModelError(
            f"{model}: no {backend} export of the query tower; create it with `{export_command(model, backend)}`"
        )
    files = _tower_files(route)
    if _stats(route, files) != record.stats:
        current, _ = query_fingerprint(route)
        if current != record.query_fingerprint:
            raise ModelError(
                f"{route.backend_dir(backend)}: exported from another query tower (fingerprint "
                f"{record.query_fingerprint[:12]} != {current[:12]} of {model}); "
                f"re-run `{export_command(model, backend)}`"
            )
    return route, record
