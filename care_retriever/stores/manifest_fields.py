"""The fields of a store's manifest, typed and ranged: a hand-edited or damaged manifest is one line naming the
manifest and the field, before any of its values is used (``Manifest.from_dict`` calls :func:`check_fields`)."""

from __future__ import annotations

import math
from typing import Any

from care_retriever.errors import StoreError

MAX_DIM = 65_536  # wider than any embedding model; a larger value is damage, not a model
METRICS = ("cosine", "dot")
DICT_FIELDS = ("index", "versions", "checksums", "block_checksums", "sizes", "sparse", "sealed")
STRING_FIELDS = ("backend", "space_fingerprint", "model_name")


def _shown(value: Any) -> str:
    return "null" if value is None else f"{value!r} ({type(value).__name__})"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bad(source: str, name: str, want: str, value: Any) -> StoreError:
    return StoreError(f"{source}: field {name!r} must be {want}, got {_shown(value)}; the manifest is damaged")


def check_format_version(data: dict[str, Any], source: str, readable: int) -> int:
    """The store's format version (1 when absent): an integer from 1 up to ``readable``."""
    version = data.get("format_version", 1)
    if not _is_int(version):
        raise _bad(source, "format_version", "an integer", version)
    if version < 1:
        raise _bad(source, "format_version", "an integer >= 1", version)
    if version > readable:
        raise StoreError(
            f"{source}: store format_version {version} is newer than this care-retriever reads "
            f"({readable}); upgrade care-retriever"
        )
    return version


def check_fields(data: dict[str, Any], source: str) -> None:
    """Each known field present has its type and range (unknown fields are left to the caller)."""
    if not isinstance(data, dict):
        raise StoreError(f"{source}: malformed manifest (a JSON object expected, got {type(data).__name__})")
    for name in STRING_FIELDS:
        if name in data and not isinstance(data[name], str):
            raise _bad(source, name, "a string", data[name])
    if "dim" in data and not (_is_int(data["dim"]) and 1 <= data["dim"] <= MAX_DIM):
        raise _bad(source, "dim", f"an integer from 1 to {MAX_DIM}", data["dim"])
    if "metric" in data and data["metric"] not in METRICS:
        raise _bad(source, "metric", f"one of {', '.join(METRICS)}", data["metric"])
    if "count" in data and not (_is_int(data["count"]) and data["count"] >= 0):
        raise _bad(source, "count", "an integer >= 0", data["count"])
    for name in ("created_at", "updated_at"):
        value = data.get(name, 0.0)
        if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)):
            raise _bad(source, name, "a finite number (seconds since the epoch)", value)
    for name in DICT_FIELDS:
        if name in data and not isinstance(data[name], dict):
            raise _bad(source, name, "an object", data[name])
    for key, value in data.get("checksums", {}).items():
        if not (isinstance(value, str) and len(value) == 64):
            raise _bad(source, f"checksums.{key}", "a SHA-256 hex digest", value)
    for key, value in data.get("block_checksums", {}).items():
        if not (isinstance(value, list) and all(isinstance(v, str) and len(v) == 64 for v in value)):
            raise _bad(source, f"block_checksums.{key}", "a list of SHA-256 hex digests", value)
    for name in ("sizes", "sealed"):
        for key, value in data.get(name, {}).items():
            if not (_is_int(value) and value >= 0):
                raise _bad(source, f"{name}.{key}", "an integer >= 0", value)
