"""The manifest of a Qdrant Edge store: ``PATH/NAME/manifest.json`` beside the shard (an Edge shard has no
collection metadata), written atomically: a temporary file fsynced, renamed over the old one, the folder fsynced.
It ends with its own checksum (``stores.manifest.MANIFEST_DIGEST``), which ``verify`` checks: the shard keeps no copy
of the model's fingerprint, the metric or the backend, so an edit of those is caught only there."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import care_retriever.faults as faults
from care_retriever.errors import StoreError
from care_retriever.stores.base import Manifest
from care_retriever.stores.manifest import MANIFEST_DIGEST, digest_mismatch, manifest_bytes

MANIFEST_FILE = "manifest.json"


def read_manifest(path: Path, source: str) -> Manifest:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StoreError(f"{source}: the shard has no {path.name}: not written by care-retriever") from None
    except ValueError as exc:
        raise StoreError(f"{source}: damaged {path} ({exc})") from exc
    return Manifest.from_dict(data, source)


def write_manifest(path: Path, manifest: Manifest) -> None:
    temporary = path.with_name(path.name + ".tmp")
    with faults.writing(path, "the store's manifest", unchanged="the previous manifest is kept"):
        try:
            with open(temporary, "wb") as fh:
                fh.write(manifest_bytes(manifest.to_dict(), indent=1, ensure_ascii=False))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(temporary, path)
        finally:
            with contextlib.suppress(OSError):
                temporary.unlink()
        descriptor = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def check_manifest(path: Path, source: str) -> bool:
    """The manifest file is byte for byte what care-retriever wrote: True; False where it has no checksum to check
    (written before manifests had their own)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise StoreError(f"{source}: the shard has no {path.name}: not written by care-retriever") from None
    mismatch = digest_mismatch(raw, indent=1, ensure_ascii=False)
    if mismatch:
        raise StoreError(
            f"{path}: checksum mismatch (field {MANIFEST_DIGEST!r}): the manifest was changed after it was written"
        )
    return mismatch is not None
