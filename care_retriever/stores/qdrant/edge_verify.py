"""What ``verify`` checks of a Qdrant Edge store beyond the engine's own files: part of the store
(:mod:`edge_store`), kept in a file of its own. Each check raises one :class:`StoreError` line naming the first
problem found."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from care_retriever.errors import StoreError
from care_retriever.stores.base import Manifest
from care_retriever.stores.qdrant.common import point_id
from care_retriever.vectors import VectorContract

SETTINGS = ("quantize", "always_ram", "on_disk", "m", "ef_construct")  # what the shard and the manifest both record


def check_settings(source: str, actual: dict[str, Any], recorded: dict[str, Any]) -> None:
    """The shard's own settings are the ones its manifest records."""
    for key in SETTINGS:
        if key in recorded and actual[key] is not None and actual[key] != recorded[key]:
            raise StoreError(f"{source}: the shard holds {key}={actual[key]!r}; its manifest says {recorded[key]!r}")


def check_points(source: str, manifest: Manifest, records: Sequence[Any]) -> None:
    """Each point carries its document's id, a content hash, and a finite dense vector of the store's width with
    the norm its model promises."""
    contract = VectorContract.for_metric(manifest.metric)
    for r in records:
        doc_id, content = r.payload.get("doc_id"), r.payload.get("content_hash")
        if not doc_id or not content:
            raise StoreError(f"{source}: point {r.id} has no doc_id or content_hash")
        if r.id != point_id(doc_id):
            raise StoreError(f"{source}: point {r.id} does not carry the id of {doc_id!r}")
        vector = np.asarray(r.vector if r.vector is not None else [], dtype=np.float32)
        if vector.shape != (manifest.dim,) or not np.isfinite(vector).all():
            raise StoreError(f"{source}: {doc_id!r} has no finite {manifest.dim}-dim dense vector")
        if contract.bad_norms(np.asarray([np.linalg.norm(vector)])).any():
            raise StoreError(
                f"{source}: {doc_id!r} has a vector not {contract.describe_norms()} as its {manifest.metric} "
                "model's are"
            )


def unchecked_manifest(source: str) -> StoreError:
    """The line for a manifest written without its own checksum, once every other check has passed."""
    return StoreError(
        f"{source}: every point checked, but its manifest has no checksum (written by an earlier release), so the "
        "fingerprint, model and metric it records could not be; `care-retriever verify --record-checksums` records "
        "one for it as it is (the next write records it too)"
    )
