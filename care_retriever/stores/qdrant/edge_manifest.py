"""The manifest of a Qdrant Edge store: ``PATH/NAME/manifest.json`` beside the shard (an Edge shard has no
collection metadata), written atomically: a temporary file fsynced, renamed over the old one, the folder fsynced."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from care_retriever import faults
from care_retriever.errors import StoreError
from care_retriever.stores.base import Manifest

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
            with open(temporary, "w", encoding="utf-8") as fh:
                fh.write(json.dumps(manifest.to_dict(), ensure_ascii=False, indent=1))
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
