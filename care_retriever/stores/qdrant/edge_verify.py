"""What ``verify`` checks of a Qdrant Edge store beyond the engine's own files: part of the store
(:mod:`edge_store`), kept in a file of its own. Each check raises one :class:`StoreError` line naming the first
problem found.

Each point carries, recorded at write, the content hash of its document and a checksum of its dense vector as the
engine stored it (:data:`VECTOR_CHECKSUM`): the same contract as a FAISS store's docstore and file checksums. A
changed byte of a stored text (the payload storage) or of a stored vector (the vector storage) no longer matches
them: ``verify`` names the point, and ``index`` treats it as not stored, so that a re-run writes it again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from care_retriever.documents import Document
from care_retriever.errors import StoreError
from care_retriever.stores.base import Manifest
from care_retriever.stores.config import QdrantCollectionConfig
from care_retriever.stores.qdrant import common, edge_files
from care_retriever.stores.qdrant.common import document_of, point_id
from care_retriever.stores.qdrant.edge import EdgeRecord, EdgeShard, EngineError
from care_retriever.stores.qdrant.edge_manifest import MANIFEST_FILE, check_manifest
from care_retriever.stores.qdrant.edge_opening import Opened
from care_retriever.vectors import VectorContract

VECTOR_CHECKSUM = "vector_checksum"  # payload field: BLAKE2b-128 of the stored float32 vector's bytes
REPAIR = "run the same `care-retriever index` again to rewrite it"

# every field a point's payload may hold: a changed byte of a field's name leaves a field outside these
PAYLOAD_FIELDS = frozenset({"doc_id", "text", "title", "metadata", "content_hash", VECTOR_CHECKSUM})
SETTINGS = ("quantize", "always_ram", "on_disk", "m", "ef_construct")  # what the shard and the manifest both record


def check_settings(source: str, actual: dict[str, Any], recorded: dict[str, Any]) -> None:
    """The shard's own settings are the ones its manifest records."""
    for key in SETTINGS:
        if key in recorded and actual[key] is not None and actual[key] != recorded[key]:
            raise StoreError(f"{source}: the shard holds {key}={actual[key]!r}; its manifest says {recorded[key]!r}")


def vector_checksum(vector: Sequence[float] | np.ndarray) -> str:
    """The checksum of a dense vector as the engine stores it (float32, little-endian)."""
    return hashlib.blake2b(np.asarray(vector, dtype="<f4").tobytes(), digest_size=16).hexdigest()


def payload_of(document: Document, vector: np.ndarray) -> dict[str, Any]:
    """A point's payload: the document, its content hash, and the checksum of the vector given."""
    return {**common.payload_of(document), VECTOR_CHECKSUM: vector_checksum(vector)}


def damage(record: Any) -> str | None:
    """What of a point (read with its whole payload and its vector) no longer matches the hashes recorded at
    write: its text, its vector, or None. A point written before vectors had a checksum has its text checked."""
    payload = record.payload
    unknown = sorted(set(payload) - PAYLOAD_FIELDS)
    if unknown:
        return f"its payload holds a field the store never writes ({unknown[0]!r})"
    try:
        stored = document_of(payload)
    except (KeyError, TypeError, ValueError):
        return "its payload is incomplete"
    if stored.content_hash() != payload.get("content_hash"):
        return "its stored text, title or metadata no longer matches its content hash"
    recorded = payload.get(VECTOR_CHECKSUM)
    if recorded is not None and (record.vector is None or vector_checksum(record.vector) != recorded):
        return "its stored vector no longer matches its checksum"
    return None


def check_points(source: str, manifest: Manifest, records: Sequence[Any]) -> None:
    """Each point carries its document's id, a content hash matching its stored document, a vector matching its
    checksum, and a finite dense vector of the store's width with the norm its model promises."""
    contract = VectorContract.for_metric(manifest.metric)
    for r in records:
        doc_id, content = r.payload.get("doc_id"), r.payload.get("content_hash")
        if not doc_id or not content:
            raise StoreError(f"{source}: point {r.id} has no doc_id or content_hash")
        if r.id != point_id(doc_id):
            raise StoreError(f"{source}: point {r.id} does not carry the id of {doc_id!r}")
        found = damage(r)
        if found is not None:
            raise StoreError(f"{source}: {doc_id!r}: {found} (the store's files were changed); {REPAIR}")
        vector = np.asarray(r.vector if r.vector is not None else [], dtype=np.float32)
        if vector.shape != (manifest.dim,) or not np.isfinite(vector).all():
            raise StoreError(f"{source}: {doc_id!r} has no finite {manifest.dim}-dim dense vector")
        if contract.bad_norms(np.asarray([np.linalg.norm(vector)])).any():
            raise StoreError(
                f"{source}: {doc_id!r} has a vector not {contract.describe_norms()} as its {manifest.metric} "
                "model's are"
            )


def recorded_as_stored(shard: Any, points: Sequence[Any]) -> None:
    """After an upsert of ``points`` (EdgePoint, each payload with the checksum of the vector given): where the
    engine stored another vector than the one given (a cosine shard normalizes one whose norm is not 1 to its
    precision), the checksum of the stored one replaces it."""
    given = {p.id: p.payload[VECTOR_CHECKSUM] for p in points}
    fixes = {}
    for record in shard.retrieve(list(given), False, True):
        if record.vector is not None and vector_checksum(record.vector) != given[record.id]:
            fixes[record.id] = {VECTOR_CHECKSUM: vector_checksum(record.vector)}
    if fixes:
        shard.set_payload(fixes)


def check_shard(
    source: str, manifest: Manifest, shard: EdgeShard, folder: Path, opened: Opened | None, record: bool
) -> tuple[int, dict[str, dict[str, str]], bool, bool]:
    """``verify`` of an open shard: its settings, the manifest's own checksum (:func:`check_manifest`), every
    point (:func:`check_every_point`), the count, then every file against the checksums its last commit recorded
    (:mod:`edge_files`; ``opened``: what :func:`edge_opening.opened` found). A damaged point is named by
    its document; a damaged file the engine trips on while reading, by the file. A count or a file that differs
    from the last commit's, every point having passed, may be a writer's that stopped before its commit: named
    (files "not checked"), or, with ``record``, to be recorded as it is. Returns the points checked, those without
    a vector checksum, whether the manifest had its own checksum, and whether the shard is to be recorded."""
    recorded = QdrantCollectionConfig.from_manifest(manifest.index).resolved().given()
    check_settings(source, shard.recorded_settings(), recorded)
    checked = check_manifest(folder / MANIFEST_FILE, source)  # after the settings: those name the difference
    damage = opened.damage if opened is not None else None
    changed = edge_files.first_damage(manifest, shard.path, damage) if manifest.checksums else None
    try:
        count, unrecorded = check_every_point(source, manifest, _every_point(shard))
        check_count(source, count, shard.count())
    except EngineError as exc:
        raise (edge_files.damaged(source, changed) if changed else exc) from exc
    stale = count != manifest.count or changed is not None
    if stale and not record:
        counts = f"the shard holds {count} points; its manifest records {manifest.count} (the last commit's count)"
        raise edge_files.damaged(source, counts if count != manifest.count else str(changed))
    manifest.count = count
    return count, unrecorded, checked, stale


def _every_point(shard: EdgeShard) -> Iterator[list[EdgeRecord]]:
    """Every point with its whole payload and its vector, a batch at a time."""
    offset: str | None = None
    while True:
        records, offset = shard.scroll(offset, 256, True, True)
        if records:
            yield records
        if offset is None:
            return


def check_every_point(
    source: str, manifest: Manifest, batches: Iterable[Sequence[Any]]
) -> tuple[int, dict[str, dict[str, str]]]:
    """Every point, read with its whole payload and its vector, checked (:func:`check_points`); returns how many,
    and the points written before vectors had a checksum (:func:`unrecorded_vectors`)."""
    count, unrecorded = 0, {}
    for records in batches:
        check_points(source, manifest, records)
        unrecorded.update(unrecorded_vectors(records))
        count += len(records)
    return count, unrecorded


def unrecorded_vectors(records: Sequence[Any]) -> dict[str, dict[str, str]]:
    """Points written before vectors had a checksum: point id -> the checksum of the vector as it is now."""
    return {
        r.id: {VECTOR_CHECKSUM: vector_checksum(r.vector)}
        for r in records
        if VECTOR_CHECKSUM not in r.payload and r.vector is not None
    }


def check_count(source: str, read: int, counted: int) -> None:
    """The points read (every one checked) are the engine's own count."""
    if read != counted:
        raise StoreError(f"{source}: the engine counts {counted} points, but reading every point found {read}")


def unrecorded_lines(source: str, unrecorded: dict[str, Any], manifest: Manifest) -> list[str]:
    """What a store written by an earlier release lacks, one line each: its points' vector checksums
    (``unrecorded``: :func:`unrecorded_vectors`), its files' checksums (none in ``manifest``)."""
    fix = "`care-retriever verify --record-checksums` records them as they are"
    lines = []
    if unrecorded:
        lines.append(
            f"{source}: {len(unrecorded)} points have no vector checksum (written by an earlier release): their "
            f"texts and norms were checked; {fix}"
        )
    if not manifest.checksums:
        lines.append(
            f"{source}: its manifest records no checksums of the shard's files (written by an earlier release): "
            f"every point was checked, not the engine's bookkeeping; {fix}"
        )
    return lines


def unchecked_manifest(source: str) -> StoreError:
    """The line for a manifest written without its own checksum, once every other check has passed."""
    return StoreError(
        f"{source}: every point checked, but its manifest has no checksum (written by an earlier release), so the "
        "fingerprint, model and metric it records could not be; `care-retriever verify --record-checksums` records "
        "one for it as it is (the next write records it too)"
    )
