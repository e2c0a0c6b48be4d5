"""What the engine changes as it opens a Qdrant Edge shard, and ``verify``'s check of the files before it does:
part of the store's file checksums (:mod:`edge_files`), kept in a file of its own.

The engine replays and removes its trackers' journals, completes ``edge_config.json``, rewrites an optimized
segment's ``id_tracker.versions`` after deletions and touches other files as it opens a shard. Each open records
what it changed, where the file was as the last commit left it, in ``opened.json`` beside the shard's files
(opening never writes the manifest: only a write does), and hashes, before the engine reads it, a file written
since the last commit, so that damage there is still named.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, NamedTuple

import care_retriever.faults as faults
from care_retriever.stores.base import Manifest
from care_retriever.stores.qdrant.common import collection_folder, is_server
from care_retriever.stores.qdrant.edge import TEMP_SEGMENTS
from care_retriever.stores.qdrant.edge_files import (
    OPENED,
    POINT_DATA,
    SHARD_FOLDER,
    checksum_of,
    current_checksum,
    damaged,
    first_damage,
    segment_of,
    shard_files,
    stamp_of,
    written_in_place,
)
from care_retriever.stores.qdrant.edge_manifest import MANIFEST_FILE, check_manifest, read_manifest


def check_before_open(location: str, collection: str, record: bool = False) -> None:
    """``verify``'s first step for ``qdrant:location``: every file of the collection's shard (and its manifest) as
    the last commit recorded them, before the engine reads any, or one line naming the first that differs. The
    stored texts and vectors (:data:`POINT_DATA`) are left to the checks of each point, which name its document,
    then hashed. Nothing to do for a server, a temporary store or a folder holding no shard (opening it says what
    it is); a store whose manifest records no file checksums (an earlier release's) passes here: ``verify`` names
    that. With ``record`` (``verify --record-checksums``), only the manifest is checked here."""
    folder = Path(location) / collection_folder(collection)
    if is_server(location) or location == ":memory:" or not (folder / SHARD_FOLDER).is_dir():
        return
    source = f"qdrant:{location} (collection {collection})"
    check_manifest(folder / MANIFEST_FILE, source)
    manifest = read_manifest(folder / MANIFEST_FILE, source)
    if record:
        return
    shard = folder / SHARD_FOLDER
    _, found, interrupted = _apply_opened(manifest, shard) if manifest.checksums else ({}, None, False)
    if found is not None:
        raise damaged(source, found)
    if manifest.checksums and _build_left(shard):
        _replaced_segments(manifest, shard, shard_files(shard))  # what a killed optimize() replaced: opened()
    # after an open that stopped before recording what the engine changed, the files written since are its
    found = first_damage(manifest, shard, skip=POINT_DATA, unwritten=interrupted) if manifest.checksums else None
    if found is not None:
        raise damaged(source, found)


def _build_left(shard: Path) -> bool:
    """Whether an optimize() killed mid-build left its segment in ``temp_segments/`` (the next open removes it)."""
    return (shard / TEMP_SEGMENTS).is_dir() and any((shard / TEMP_SEGMENTS).iterdir())


class Opening(NamedTuple):
    """The shard's files just before the engine opens it (:func:`before_open`)."""

    files: dict[str, tuple[tuple[int, int], str | None]]  # name -> (size, modification time), checksum or None
    rebuilt: bool  # an optimize() was killed mid-build: it may have replaced segments since the last commit
    changes: dict[str, list[Any] | None]  # what earlier opens changed since the last commit (opened.json)
    damage: str | None  # opened.json was changed
    interrupted: bool  # an earlier open stopped between the engine's open and recording what it changed


def before_open(manifest: Manifest, shard: Path, writable: bool) -> Opening:
    """Each shard file just before the engine opens the shard: its size and modification time, and its checksum
    where a write may have changed it since the last commit (:func:`written_in_place`, or another size or time
    than recorded); and whether an optimize() was killed mid-build. What earlier opens changed since the last
    commit (``opened.json``) is applied to ``manifest`` first; then ``opened.json`` says an open is under way
    (``writable``: not for a copy read on a full disk), so that an open that stops before :func:`opened` has
    recorded what the engine changed is known to the next."""
    changes, damage, interrupted = _apply_opened(manifest, shard) if manifest.checksums else ({}, None, False)
    found: dict[str, tuple[tuple[int, int], str | None]] = {}
    files = shard_files(shard) if manifest.checksums else {}
    in_place = written_in_place(manifest, shard, files)
    for name, stat in files.items():
        trusted = name not in in_place and stamp_of(stat) == (
            manifest.sizes.get(name),
            manifest.sealed.get(name),
        )
        found[name] = (
            stamp_of(stat),
            None if trusted else current_checksum(shard, name, manifest),
        )
    if writable and manifest.checksums:
        with faults.writing(shard / OPENED, "what opening the shard changes", unchanged="the store is unchanged"):
            _write_opened(shard, manifest, changes, opening=True)
    return Opening(found, _build_left(shard), changes, damage, interrupted)


class Opened(NamedTuple):
    """What :func:`opened` found."""

    damage: str | None  # the first file written since the last commit with another content, in words
    changes: dict[str, list[Any] | None] | None  # what opens changed since the last commit (opened.json)


def opened(manifest: Manifest, opening: Opening, shard: Path, writable: bool) -> Opened:
    """After the engine opened the shard: what it changed as it opened (journals replayed and removed, settings
    and trackers rewritten, files created), recorded in ``manifest`` where the file was as the last commit left
    it; names the first it changed that had been written since the last commit with another content (``opening``:
    :func:`before_open`). Where an optimize() was killed mid-build, the segments it finished (new since the last
    commit) are recorded as they are, and those it replaced dropped: their points are checked one by one. What
    changed is kept in ``opened.json`` beside the shard's files (``writable``: not for a copy read on a full disk),
    never in the manifest, which only a write changes; the next commit records it all."""
    if not manifest.checksums:
        return Opened(None, None)
    before, after, damage = opening.files, shard_files(shard), opening.damage
    changes = dict(opening.changes)
    if opening.rebuilt:
        changes.update(_replaced_segments(manifest, shard, after))
    for name in sorted(set(before) | set(after)):
        stamp, checksum = before.get(name, (None, None))
        unchanged = name in after and stamp_of(after[name]) == stamp
        if unchanged and (checksum is None or current_checksum(shard, name, manifest) == checksum):
            continue  # left as it was: checked by verify as it is
        if checksum is not None and checksum != manifest.checksums.get(name) and not opening.interrupted:
            damage = damage or (
                f"{name} no longer matches the checksum its last commit recorded (read before the engine's open)"
                if name in manifest.checksums
                else f"{name} was not written by a commit of this store (read before the engine's open)"
            )
            continue
        changes[name] = [checksum_of(shard, name), *stamp_of(after[name])] if name in after else None
        _apply(manifest, name, changes[name])
    if writable:
        with faults.writing(shard / OPENED, "what opening the shard changed", unchanged="the store is unchanged"):
            _write_opened(shard, manifest, changes, opening=False)
    return Opened(damage, changes)


def _apply(manifest: Manifest, name: str, entry: list[Any] | None) -> None:
    """Record one file as an open left it: [checksum, size, modification time], or None (removed)."""
    if entry is None:
        for record in (manifest.checksums, manifest.sizes, manifest.sealed):
            record.pop(name, None)
    else:
        manifest.checksums[name], manifest.sizes[name], manifest.sealed[name] = entry


def _opened_bytes(commit: float, changes: dict[str, list[Any] | None], opening: bool) -> bytes:
    fields = {"commit": commit, "files": changes, "opening": opening}
    body = json.dumps(fields, sort_keys=True)
    return json.dumps({**fields, "sha256": hashlib.sha256(body.encode()).hexdigest()}, sort_keys=True).encode()


def _write_opened(shard: Path, manifest: Manifest, changes: dict[str, list[Any] | None], *, opening: bool) -> None:
    temporary = shard / (OPENED + ".tmp")  # (shard_files() lists neither)
    try:
        temporary.write_bytes(_opened_bytes(manifest.updated_at, changes, opening))
        os.replace(temporary, shard / OPENED)
    finally:
        temporary.unlink(missing_ok=True)


def _apply_opened(manifest: Manifest, shard: Path) -> tuple[dict[str, list[Any] | None], str | None, bool]:
    """Apply to ``manifest`` what earlier opens changed since its commit (``opened.json``); returns those changes,
    the damage in words where the file was changed (its own checksum), and whether the last open stopped before
    recording what it changed. A file from before the last commit is ignored (the commit recorded everything)."""
    try:
        raw = (shard / OPENED).read_bytes()
    except FileNotFoundError:
        return {}, None, False
    try:
        data = json.loads(raw)
        changes = data["files"]
        intact = raw == _opened_bytes(data["commit"], changes, data["opening"])
    except (ValueError, KeyError, TypeError):
        intact = False
    if not intact:
        return {}, f"{shard.name}/{OPENED} no longer matches its own checksum", False
    if data["commit"] != manifest.updated_at:
        return {}, None, False
    for name, entry in changes.items():
        _apply(manifest, name, entry)
    return changes, None, bool(data["opening"])


def _replaced_segments(
    manifest: Manifest, shard: Path, files: dict[str, os.stat_result]
) -> dict[str, list[Any] | None]:
    """After an optimize() killed mid-build: the segments it finished, new since the last commit, are recorded as
    they are (their points are checked one by one), and those it replaced dropped; returns what changed."""
    recorded = {segment_of(n) for n in manifest.checksums} - {None}
    present = {segment_of(n) for n in files} - {None}
    changes: dict[str, list[Any] | None] = {n: None for n in manifest.checksums if segment_of(n) in recorded - present}
    for name, stat in files.items():
        if segment_of(name) in present - recorded:
            changes[name] = [checksum_of(shard, name), *stamp_of(stat)]
    for name, entry in changes.items():
        _apply(manifest, name, entry)
    return changes
