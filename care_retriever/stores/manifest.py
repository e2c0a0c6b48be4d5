"""The manifest that ties a store to a model: who built it (the space fingerprint), its width, metric, size,
checksums and format version; read by every store kind (its fields checked by :mod:`manifest_fields`)."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from care_retriever import __version__
from care_retriever.errors import InputError, StoreError
from care_retriever.stores.manifest_fields import METRICS, check_fields, check_format_version

# 2: the FAISS store may hold an append-only vector delta (written by small in-place writes). Format 1
# stores (no delta) are read as they are.
STORE_FORMAT_VERSION = 2
# 3: a FAISS store with compressed codes and a rescoring vector file (index option "quantize"); only such
# stores are written as 3, so that an older reader refuses them instead of searching the codes alone.
READABLE_FORMAT_VERSION = 3
# The manifest file's own checksum, its last field (not a Manifest field): the SHA-256 of the JSON of the other
# fields. The files' checksums cannot cover the manifest, and a Qdrant shard keeps no copy of the model's
# fingerprint, the metric or the backend, so an edit of those would otherwise pass every check.
MANIFEST_DIGEST = "manifest_sha256"


def check_metric(metric: str) -> str:
    if metric not in METRICS:
        raise InputError(f"Unknown metric {metric!r}. Available metrics: {list(METRICS)}")
    return metric


@dataclass
class Manifest:
    """Describes a store: who built it (model fingerprint), its width, metric, size and versions."""

    backend: str
    dim: int
    space_fingerprint: str
    model_name: str = ""
    metric: str = "cosine"
    count: int = 0
    index: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    checksums: dict[str, str] = field(default_factory=dict)  # SHA-256 of each file's first sizes[name] bytes
    # Files hashed by blocks (a FAISS store's docstore, delta and rescoring vectors): SHA-256 of each block, so
    # that a small write hashes the blocks it changed, not the whole file.
    block_checksums: dict[str, list[str]] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)  # file sizes when the checksums were taken, checked on open
    # The write the checksums describe (a FAISS store's journal bookkeeping when they were taken): a write killed
    # after its commit and before its manifest leaves them describing the version before it.
    sealed: dict[str, int] = field(default_factory=dict)
    sparse: dict[str, Any] = field(default_factory=dict)  # the BM25 side, when built (care_retriever.sparse)
    format_version: int = STORE_FORMAT_VERSION

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str) -> Manifest:
        check_fields(data, source)
        check_format_version(data, source, READABLE_FORMAT_VERSION)
        known = set(cls.__dataclass_fields__)
        try:
            return cls(**{k: v for k, v in data.items() if k in known})
        except TypeError as exc:
            raise StoreError(f"{source}: malformed manifest ({exc})") from exc


def default_versions(**extra: str) -> dict[str, str]:
    return {"care_retriever": __version__, **extra}


def manifest_bytes(data: dict[str, Any], *, indent: int = 2, ensure_ascii: bool = True) -> bytes:
    """The manifest file for the fields ``data``: their JSON, closed by the SHA-256 of that JSON (written last, as
    :data:`MANIFEST_DIGEST`), so that any byte changed in the file is caught (:func:`digest_mismatch`)."""
    fields = {k: v for k, v in data.items() if k != MANIFEST_DIGEST}
    text = json.dumps(fields, indent=indent, ensure_ascii=ensure_ascii)
    digest = hashlib.sha256(text.encode()).hexdigest()
    return json.dumps({**fields, MANIFEST_DIGEST: digest}, indent=indent, ensure_ascii=ensure_ascii).encode()


def digest_mismatch(raw: bytes, *, indent: int = 2, ensure_ascii: bool = True) -> bool | None:
    """Whether the manifest file ``raw`` differs from what :func:`manifest_bytes` wrote for its fields; None when
    it has no :data:`MANIFEST_DIGEST` (written before manifests had one) or is not a JSON object."""
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(data, dict) or MANIFEST_DIGEST not in data:
        return None
    return manifest_bytes(data, indent=indent, ensure_ascii=ensure_ascii) != raw
