"""A store copied into another of any kind, re-encoding nothing: :func:`copy_store` (``care-retriever copy``).

The vectors are the expensive part of a store (an LLM tower's hours on a GPU); this moves them, with each
document's id, text, title and metadata, from FAISS to Qdrant (a folder or a server), Qdrant to FAISS, or into a
FAISS index of another kind (HNSW, compressed codes), through the store protocol only
(:meth:`~care_retriever.stores.capabilities.StoredIteration.iter_stored` reads, ``prepare`` / ``upsert`` / ``commit`` /
``finalize`` write). The target records the source's space fingerprint, width, metric and model name, so it
answers the same query tower; each content hash is recomputed on the target from the same text, title and
metadata and checked equal to the source's stored one. The BM25 side is rebuilt on the target from the copied
texts with the shared tokenizer (:mod:`care_retriever.sparse`) where the source has one: FAISS keeps postings in
SQLite and Qdrant sparse vectors, so there is no format to carry.

A copy is an idempotent upsert keyed by id and content hash, as ``index`` is: documents the target already holds
with the source's hash are skipped, so a copy killed anywhere is finished by running it again (a FAISS target
resumes from its last checkpoint, ``checkpoint_every``), and an unchanged re-run writes nothing. Documents the
target holds that the source lacks are kept.

A FAISS target's staging copy belongs to the copy that made it (:class:`~care_retriever.stores.runs.RunTag`:
command ``copy``, the source resolved, its model, the target's index settings and BM25 side): only the same copy
resumes it; another copy, an ``index`` or a ``delete`` into that target is refused in one line naming it, and a
copy into a target where another run is pending is refused likewise. A copy that stops on an error says what it
left staged (``care-retriever copy --to DIR --discard-pending`` drops it) or, on Qdrant, what stays written.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from care_retriever.documents import Document
from care_retriever.errors import InputError, StoreError
from care_retriever.stores import open_store
from care_retriever.stores.base import Manifest, StoredBatch, VectorStore
from care_retriever.stores.capabilities import (
    IndexBuilding,
    SparseSearch,
    StoredIteration,
    Verification,
    WriteRuns,
)
from care_retriever.stores.config import (
    FaissIndexConfig,
    IndexType,
    StoreConfig,
    StoreKind,
    StoreSpec,
    store_config,
)
from care_retriever.stores.profiles import StoreProfile, chosen_profile, profile_config
from care_retriever.stores.runs import RunTag
from care_retriever.stores.training_sample import require_training_sample

# Documents a new FAISS target that trains its index on its first vectors (IVF lists, compressed codes) is given
# in its first write: the training sample (as many as ``index``'s first chunk gives by default).
TRAIN_SAMPLE = 65_536
# Documents copied between checkpoints of the target. Not ``index``'s (8,192 encoded documents, each costing a tower
# pass): a FAISS checkpoint rewrites the whole index, and a copy writes tens of thousands of documents a second.
COPY_CHECKPOINT_EVERY = 50_000
COPY_BATCH = 1000  # documents read and written at a time

StoreLike = str | StoreSpec | VectorStore


@dataclass
class CopyReport:
    """What a copy did: documents written and skipped, the target's count after it, and what moved with them."""

    source: str
    target: str
    copied: int = 0  # documents written to the target (missing there, or stored with another content hash)
    unchanged: int = 0  # documents the target already held with the source's content hash
    count: int = 0  # the target's live documents after the copy
    verified: int | None = None  # what the target's verify() counted (None: not verified)
    sparse: str = "none"  # the target's BM25 side: "rebuilt" from the copied texts, "kept" (it had one), "none"
    dim: int = 0
    metric: str = ""
    space_fingerprint: str = ""
    model_name: str = ""
    index: dict[str, Any] | None = None  # the target's index settings, as its manifest records them
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "seconds": round(self.seconds, 3)}


def copy_store(
    source: StoreLike,
    target: StoreLike,
    *,
    source_collection: str | None = None,
    target_collection: str | None = None,
    index: StoreConfig = None,
    sparse: bool | None = None,
    batch: int = COPY_BATCH,
    checkpoint_every: int = COPY_CHECKPOINT_EVERY,
    verify: bool = True,
    show_progress: bool = False,
    profile: StoreProfile | str | None = None,
) -> CopyReport:
    """Copy every document of ``source`` with its stored vector into ``target``, encoding nothing.

    ``source`` / ``target``: store specs (``faiss:DIR``, ``qdrant:PATH``, ``qdrant:http(s)://...``), or stores
    already open (those stay open: the caller's). ``index``: the target's settings when it is created, the config
    of its kind (:class:`~care_retriever.stores.config.FaissIndexConfig`, e.g. ``index_type=hnsw``,
    ``quantize=sq8``; :class:`~care_retriever.stores.config.QdrantCollectionConfig`); None: the source's own where
    both are of one kind, else the target kind's defaults (an existing target keeps its own). ``sparse``: give the
    target a BM25 side (None: where the source has one). ``verify``: read the whole target afterwards
    (:meth:`~care_retriever.stores.capabilities.Verification.verify`). ``profile``: a new target's settings from
    the source's size (:mod:`~care_retriever.stores.profiles`; ``index``'s options win over it; None: none).

    A target holding another model's space, another width or another metric is refused in one line before
    anything is written.
    """
    if batch < 1 or checkpoint_every < 1:
        raise InputError(f"batch and checkpoint_every must be >= 1, got {batch} and {checkpoint_every}")
    start = time.perf_counter()
    source_spec, target_spec = _spec(source, source_collection), _spec(target, target_collection)
    if source_spec is not None and target_spec is not None and _identity(source_spec) == _identity(target_spec):
        raise InputError(f"copy: source and target are the same store ({source_spec}); name another target")
    src = _open_source(source, source_spec)
    dst: VectorStore | None = None
    try:
        manifest = src.require_manifest()
        _check_source(src, manifest)
        dst = target if isinstance(target, VectorStore) else open_store(target_spec or str(target))
        # two stores opened on one folder or server collection (two in-memory stores are two stores)
        if dst is src or (dst.describe() == src.describe() and ":memory:" not in dst.describe()):
            raise InputError(f"copy: source and target are the same store ({src.describe()}); name another target")
        _check_target(src, manifest, dst)
        # what the copy needs of each side, said in one line before anything is written
        reader = StoredIteration.require(src, "copy (its source)")
        writer = WriteRuns.require(dst, "copy (its target)")
        want_sparse = bool(manifest.sparse) if sparse is None else sparse
        if want_sparse:
            SparseSearch.require(dst, "copy with a BM25 side (its target)")
        checker = Verification.require(dst, "copy --verify") if verify else None
        report = CopyReport(
            source=src.describe(),
            target=dst.describe(),
            dim=manifest.dim,
            metric=manifest.metric,
            space_fingerprint=manifest.space_fingerprint,
            model_name=manifest.model_name,
        )
        copier = _Copier(reader, writer, manifest, report, batch)
        total = src.count()
        if copier.differs(want_sparse):
            config = _target_config(src, dst, index, profile, total)
            # a new index that trains on its first vectors gets enough of them, or one line says what to do instead
            require_training_sample(dst, manifest.dim, config, total, src.describe(), profile)
            run = _run_tag(source_spec, src, manifest, config, want_sparse)
            copier.write(run, config, want_sparse, total, checkpoint_every, show_progress)
        else:
            report.unchanged = total
        held = dst.require_manifest()
        report.sparse = "rebuilt" if report.copied and held.sparse else ("kept" if held.sparse else "none")
        report.index = dict(held.index)
        report.count = dst.count()
        if checker is not None:
            report.verified = checker.verify()
            if report.verified < total:
                raise StoreError(
                    f"{dst.describe()}: verify counts {report.verified} documents after the copy, the source holds "
                    f"{total}; run the copy again"
                )
        report.seconds = time.perf_counter() - start
        return report
    finally:
        # stores opened here are closed (a FAISS target keeps its checkpoint for the re-run); the caller's stay open
        if dst is not None and not isinstance(target, VectorStore):
            dst.close()
        if not isinstance(source, VectorStore):
            src.close()


class _Copier:
    """One copy's reads and writes: what the target lacks, and writing it."""

    def __init__(
        self, src: StoredIteration, dst: WriteRuns, manifest: Manifest, report: CopyReport, batch: int
    ) -> None:
        self.src, self.dst, self.manifest, self.report, self.batch = src, dst, manifest, report, batch

    def differs(self, want_sparse: bool) -> bool:
        """Whether the target lacks anything of the source: a document, a content hash, the BM25 side. Stops at the
        first difference (a new target: at once), so only an unchanged re-run reads every id; nothing is written
        otherwise (a FAISS bulk write would first copy the whole published store)."""
        held = self.dst.manifest
        if held is None or (want_sparse and not held.sparse):
            return True
        ids: list[str] = []
        for document in self.src.iter_documents(self.batch):
            ids.append(document.id)
            if len(ids) == self.batch:
                if self.src.content_hashes(ids) != self.dst.content_hashes(ids):
                    return True
                ids = []
        return bool(ids) and self.src.content_hashes(ids) != self.dst.content_hashes(ids)

    def write(
        self,
        run: RunTag,
        config: StoreConfig,
        want_sparse: bool,
        total: int,
        checkpoint_every: int,
        show_progress: bool,
    ) -> None:
        """Prepare the target with the source's space as this copy's run (it resumes only its own staging copy),
        then upsert what it lacks, checkpointing; publish. An error mid-way says what the copy left behind."""
        dst, manifest = self.dst, self.manifest
        trains = isinstance(dst, IndexBuilding) and dst.trains_on_first_vectors(config)
        dst.claim_run(run)
        dst.prepare(manifest.dim, manifest.space_fingerprint, manifest.model_name, config, metric=manifest.metric)
        try:
            self._upsert_missing(want_sparse, total, checkpoint_every, show_progress, trains)
        except (InputError, StoreError) as exc:  # with what stays staged or written (same type: same exit code)
            raise type(exc)(f"{exc}; {dst.left_behind(self.report.copied, 'fix the source')}") from exc
        dst.finalize()

    def _upsert_missing(
        self, want_sparse: bool, total: int, checkpoint_every: int, show_progress: bool, trains: bool
    ) -> None:
        src, dst, report = self.src, self.dst, self.report
        if want_sparse and isinstance(dst, SparseSearch):  # checked in copy_store
            dst.enable_sparse()  # tokenised from the texts as they are written (and from any the target held)
        since_checkpoint = 0
        batches = _stored_batches(src, self.batch, TRAIN_SAMPLE if trains else self.batch)
        with tqdm(total=total, desc="Copying", unit="doc", disable=not show_progress, dynamic_ncols=True) as bar:
            for stored in batches:
                documents, vectors = _missing(stored, dst)
                report.unchanged += len(stored) - len(documents)
                if documents:
                    dst.upsert(documents, vectors)
                    report.copied += len(documents)
                    since_checkpoint += len(documents)
                    if since_checkpoint >= checkpoint_every:
                        dst.commit()
                        since_checkpoint = 0
                bar.update(len(stored))


def _stored_batches(src: StoredIteration, batch: int, first: int) -> Iterator[StoredBatch]:
    """The source's batches, the first ones joined up to ``first`` documents (a training sample)."""
    stored = src.iter_stored(batch)
    head: list[StoredBatch] = []
    for item in stored:
        head.append(item)
        if sum(map(len, head)) >= first:
            break
    if head:
        yield StoredBatch(
            [d for b in head for d in b.documents],
            np.concatenate([b.vectors for b in head]),
            [h for b in head for h in b.content_hashes],
        )
    yield from stored


def _missing(stored: StoredBatch, dst: VectorStore) -> tuple[list[Document], np.ndarray]:
    """The documents of ``stored`` the target lacks (or holds with another content hash), with their vectors."""
    for document, digest in zip(stored.documents, stored.content_hashes, strict=True):
        if document.content_hash() != digest:  # the stored hash no longer describes the stored document
            raise StoreError(
                f"content hash mismatch for {document.id!r} in the source: its stored document is corrupted "
                "(run `care-retriever verify` on it)"
            )
    held = dst.content_hashes([d.id for d in stored.documents])
    keep = [
        i for i, (d, h) in enumerate(zip(stored.documents, stored.content_hashes, strict=True)) if held.get(d.id) != h
    ]
    return [stored.documents[i] for i in keep], stored.vectors[keep]


def _check_source(src: VectorStore, manifest: Manifest) -> None:
    """A source whose full vectors are not stored (an IVF-PQ index keeps codes only) cannot be copied exactly."""
    faiss = manifest.backend == StoreKind.FAISS.value
    if faiss and FaissIndexConfig.from_manifest(manifest.index).index_type is IndexType.IVFPQ:
        raise StoreError(
            f"{src.describe()}: an ivfpq index keeps only product-quantized codes, not the vectors; a copy would "
            "carry approximations: index the corpus into the target instead"
        )


def _check_target(src: VectorStore, manifest: Manifest, dst: VectorStore) -> None:
    """Refuse, before anything is written, a target of another space, width or metric (one line)."""
    held = dst.manifest
    if held is None:
        return
    differ = [
        f"{what} {theirs} (source {ours})"
        for what, theirs, ours in (
            ("dimension", held.dim, manifest.dim),
            ("space fingerprint", held.space_fingerprint[:12], manifest.space_fingerprint[:12]),
            ("metric", held.metric, manifest.metric),
        )
        if theirs != ours
    ]
    if differ:
        raise StoreError(
            f"{dst.describe()}: holds another model's vectors: {', '.join(differ)}; nothing was copied: copy into "
            "a new store"
        )


def _run_tag(spec: StoreSpec | None, src: VectorStore, manifest: Manifest, config: StoreConfig, sparse: bool) -> RunTag:
    """This copy, as the target's staging copy records it: the source (its folder resolved, or its server and
    collection), its model, and what decides what is written (the target's index settings, its BM25 side). The
    source's contents are not part of it: a re-run after the source changed resumes by content hash, as ``index``
    of an edited corpus file does."""
    source = src.describe()  # a server's URL without credentials, with its collection
    if spec is not None and _local(spec.location):
        collection = getattr(src, "collection", None)  # a Qdrant folder's (its default where none was named)
        source = f"{spec.kind.value}:{os.path.realpath(spec.location)}" + (
            f" (collection {collection})" if collection else ""
        )
    settings = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else None
    return RunTag(
        command="copy",
        corpus=source,
        space_fingerprint=manifest.space_fingerprint,
        model_name=manifest.model_name,
        options={"index": settings, "sparse": sparse},
    )


def _target_config(
    src: VectorStore, dst: VectorStore, index: StoreConfig, profile: StoreProfile | str | None, n: int
) -> StoreConfig:
    """The settings the target is prepared with: a new target's profile for ``n`` documents where it resolves to
    large (over the options given), else those given, else a new target of the source's kind gets the source's own
    (an existing target keeps its own; another kind's target its defaults)."""
    dim = src.require_manifest().dim
    if dst.manifest is None and profile is not None and chosen_profile(profile, n, dim) is StoreProfile.LARGE:
        given = index if index is not None else store_config(dst.backend, {})
        assert given is not None
        return profile_config(StoreProfile.LARGE, given, n=n, dim=dim)
    if index is not None or dst.manifest is not None or dst.backend != src.backend:
        return index
    return store_config(dst.backend, src.require_manifest().index)


def _spec(store: StoreLike, collection: str | None) -> StoreSpec | None:
    if isinstance(store, VectorStore):
        return None
    if isinstance(store, StoreSpec):
        return store if collection is None else StoreSpec(store.kind, store.location, collection)
    return StoreSpec.parse(store, collection)


def _local(location: str) -> bool:
    return location != ":memory:" and not location.startswith(("http://", "https://"))


def _identity(spec: StoreSpec) -> tuple[str, str, str]:
    """What names one store: its kind, its folder resolved (or its URL) and its collection."""
    location = os.path.realpath(spec.location) if _local(spec.location) else spec.location.rstrip("/")
    return spec.kind.value, location, spec.collection or ""


def _open_source(source: StoreLike, spec: StoreSpec | None) -> VectorStore:
    """The source store; a local Qdrant folder that does not exist is refused before opening (opening creates)."""
    if isinstance(source, VectorStore):
        return source
    assert spec is not None
    if spec.kind is StoreKind.QDRANT and spec.location == ":memory:":
        raise InputError(f"copy: {spec} is a new empty store in this process; nothing to copy from")
    if spec.kind is StoreKind.QDRANT and _local(spec.location) and not Path(spec.location).exists():
        raise StoreError(f"{spec}: no store there; nothing to copy")
    return open_store(spec)
