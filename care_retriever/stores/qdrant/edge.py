"""The one adapter between this package and Qdrant Edge (``qdrant-edge-py``, pinned: its API changed at every 0.x
release). Every call into the engine goes through :class:`EdgeShard` here, in this package's own terms (plain
lists, dicts and :class:`EdgePoint`), so that a new Edge release is met in this file and its contract tests
(``tests/test_qdrant_edge_adapter.py``) alone.

What Edge 0.9 does, as verified against the engine (benchmarks/results/scale.md lists how):

* ``update()`` appends to the write-ahead log and returns without an fsync; ``load()`` replays the log, so what an
  update wrote survives the death of its process (kill -9), but not of the machine until ``flush()`` has returned:
  :meth:`EdgeShard.flush` is the store's commit point.
* One open shard per folder: the log is locked exclusively; a second open fails (:class:`ShardBusy`).
* Every call holds the GIL, ``optimize()`` included: async callers run it in a worker thread.
* HNSW graphs and quantized codes are built by ``optimize()`` only, for segments past the indexing threshold;
  until then a segment is searched by brute force.
* ``optimize()`` builds each segment in ``temp_segments/``, then moves it into ``segments/``. A build killed midway
  is left there, never removed by the engine: :meth:`EdgeShard.load` removes it, once it holds the folder's lock.
"""

from __future__ import annotations

import errno
import json
import logging
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from care_retriever.errors import StoreError
from care_retriever.stores.filters import FilterNode
from care_retriever.stores.qdrant.edge_filter import build_filter

logger = logging.getLogger("care_retriever")

SPARSE = "bm25"  # the named sparse vector of the BM25 side (care_retriever.sparse.qdrant_sparse.VECTOR)
# Qdrant's defaults for a graph the user did not size
DEFAULT_M, DEFAULT_EF_CONSTRUCT, FULL_SCAN_KB = 16, 100, 10_000
_OS_ERROR = re.compile(r"os error (\d+)")
TEMP_SEGMENTS = "temp_segments"  # where optimize() builds a segment (a killed build is left there)


class ShardBusy(StoreError):
    """The shard's folder is open in another process (or another object of this one)."""


class EngineError(StoreError):
    """The engine refused or failed a call (a damaged file can make it panic): its first line."""


@dataclass(frozen=True)
class EdgePoint:
    """A point as the store writes it: dense vector, optional BM25 terms (ids, weights), payload."""

    id: str
    vector: Sequence[float]
    payload: dict[str, Any]
    sparse: tuple[list[int], list[float]] | None = None


@dataclass(frozen=True)
class EdgeRecord:
    """A point as read back: id, payload (maybe partial), dense vector (when asked), score (of a query)."""

    id: str
    payload: dict[str, Any]
    vector: list[float] | None = None
    sparse: tuple[list[int], list[float]] | None = None
    score: float = 0.0


@dataclass(frozen=True)
class ShardSettings:
    """What a new shard is created with (from the store's QdrantCollectionConfig, resolved)."""

    dim: int
    metric: str  # "cosine" | "dot"
    quantize: str = "none"  # "none" | "sq8" | "binary"
    always_ram: bool | None = None
    on_disk: bool | None = None
    on_disk_payload: bool | None = None
    m: int | None = None
    ef_construct: int | None = None
    indexing_threshold_kb: int | None = None  # segments past it get HNSW and codes at optimize(); None: Qdrant's
    max_segment_size_kb: int | None = None  # no segment larger; None: Qdrant's (from the CPU count)


def os_error(exc: BaseException) -> OSError | None:
    """The OSError an engine error reports (Rust's ``... (os error 28)``), else None."""
    if isinstance(exc, OSError):
        return exc
    found = _OS_ERROR.search(str(exc))
    if found:
        code = int(found.group(1))
        return OSError(code, str(exc).splitlines()[0] if str(exc) else errno.errorcode.get(code, "os error"))
    lowered = str(exc).lower()
    # (the optimizer's own check: "Not enough space available for optimization, needed: ..., available: ...")
    if "no space left" in lowered or "not enough space available" in lowered:
        return OSError(errno.ENOSPC, str(exc).splitlines()[0])
    return None


def _engine() -> Any:
    try:
        import qdrant_edge
    except ImportError as exc:
        raise StoreError("qdrant:PATH stores need Qdrant Edge: pip install 'care-retriever[qdrant]'") from exc
    return qdrant_edge


def _config(settings: ShardSettings) -> Any:
    qe = _engine()
    quantization: Any = None
    if settings.quantize == "sq8":
        quantization = qe.ScalarQuantizationConfig(qe.ScalarType.Int8, always_ram=settings.always_ram)
    elif settings.quantize == "binary":
        quantization = qe.BinaryQuantizationConfig(always_ram=settings.always_ram)
    hnsw = qe.HnswIndexConfig(
        m=settings.m or DEFAULT_M,
        ef_construct=settings.ef_construct or DEFAULT_EF_CONSTRUCT,
        full_scan_threshold=FULL_SCAN_KB,
    )
    dense = qe.EdgeVectorParams(
        size=settings.dim,
        # cosine would renormalise the stored vectors: a model that scores by dot product gets Dot
        distance=qe.Distance.Dot if settings.metric == "dot" else qe.Distance.Cosine,
        on_disk=settings.on_disk,
        quantization_config=quantization,
        hnsw_config=hnsw,
    )
    tuned = {
        name: value
        for name, value in (
            ("indexing_threshold", settings.indexing_threshold_kb),
            ("max_segment_size", settings.max_segment_size_kb),
        )
        if value is not None
    }
    optimizers = qe.EdgeOptimizersConfig(**tuned) if tuned else None
    return qe.EdgeConfig(
        vectors=dense,
        sparse_vectors={SPARSE: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)},  # IDF computed by the engine
        on_disk_payload=settings.on_disk_payload,
        optimizers=optimizers,
    )


def _record(point: Any) -> EdgeRecord:
    vector, sparse = point.vector, None
    if isinstance(vector, dict):
        terms = vector.get(SPARSE)
        sparse = (list(terms.indices), list(terms.values)) if terms is not None else None
        vector = vector.get("")
    return EdgeRecord(
        id=str(point.id),
        payload=dict(point.payload or {}),
        vector=list(vector) if vector is not None else None,
        sparse=sparse,
        score=float(getattr(point, "score", 0.0)),
    )


def _payload(fields: bool | Sequence[str]) -> Any:
    return fields if isinstance(fields, bool) else _engine().PayloadSelector.Include(list(fields))


class EdgeShard:
    """One open Edge shard (a folder). Not thread-safe by itself: the store serialises calls."""

    def __init__(self, shard: Any, path: Path) -> None:
        self._shard = shard
        self.path = path

    @classmethod
    def create(cls, path: Path, settings: ShardSettings) -> EdgeShard:
        return cls(_call(lambda: _engine().EdgeShard.create(str(path), _config(settings)), path), path)

    @classmethod
    def load(cls, path: Path) -> EdgeShard:
        """Open the shard (its log replayed); holding its lock, remove what an optimize() killed mid-build left."""
        shard = cls(_call(lambda: _engine().EdgeShard.load(str(path)), path), path)
        shard.remove_unfinished_builds()
        return shard

    def unfinished_builds(self) -> list[Path]:
        """The segments an optimize() began and never finished (a killed process's), in ``temp_segments/``."""
        return sorted((self.path / TEMP_SEGMENTS).iterdir()) if (self.path / TEMP_SEGMENTS).is_dir() else []

    def remove_unfinished_builds(self) -> None:
        """Remove them; one that cannot be (a read-only or failing disk) is named in a warning: no read needs it."""
        for build in self.unfinished_builds():
            try:
                shutil.rmtree(build) if build.is_dir() and not build.is_symlink() else build.unlink()
            except OSError as exc:
                logger.warning("%s: cannot remove the half-built segment %s (%s)", self.path, build, exc)

    # ------------------------------------------------------------------ writes
    def upsert(self, points: Sequence[EdgePoint]) -> None:
        qe = _engine()
        converted = []
        for p in points:
            vector: dict[str, Any] = {"": list(p.vector)}
            if p.sparse is not None:
                vector[SPARSE] = qe.SparseVector(p.sparse[0], p.sparse[1])
            converted.append(qe.Point(p.id, vector, p.payload))
        _call(lambda: self._shard.update(qe.UpdateOperation.upsert_points(converted)), self.path)

    def set_sparse(self, terms: dict[str, tuple[list[int], list[float]]]) -> None:
        qe = _engine()
        vectors = [qe.PointVectors(i, {SPARSE: qe.SparseVector(t[0], t[1])}) for i, t in terms.items()]
        _call(lambda: self._shard.update(qe.UpdateOperation.update_vectors(vectors)), self.path)

    def set_payload(self, values: dict[str, dict[str, Any]]) -> None:
        """Set payload fields, point id -> {field: value} (the point's other fields are kept)."""
        qe = _engine()
        operations = [qe.UpdateOperation.set_payload([i], fields) for i, fields in values.items()]
        for operation in operations:
            _call(lambda op=operation: self._shard.update(op), self.path)

    def delete(self, ids: Sequence[str]) -> None:
        qe = _engine()
        _call(lambda: self._shard.update(qe.UpdateOperation.delete_points(list(ids))), self.path)

    def index_field(self, key: str, kind: str) -> None:
        """A payload index on ``key``: kind keyword | integer | float | bool."""
        qe = _engine()
        schema = {
            "keyword": qe.PayloadSchemaType.Keyword,
            "integer": qe.PayloadSchemaType.Integer,
            "float": qe.PayloadSchemaType.Float,
            "bool": qe.PayloadSchemaType.Bool,
        }[kind]
        _call(lambda: self._shard.update(qe.UpdateOperation.create_field_index(key, schema)), self.path)

    def flush(self) -> None:
        """The commit point: the log and the segments on disk (msync + fsync)."""
        _call(self._shard.flush, self.path)

    def optimize(self) -> bool:
        """Build HNSW and quantized codes for segments past the indexing threshold (holds the GIL)."""
        return bool(_call(self._shard.optimize, self.path))

    def close(self) -> None:
        _call(self._shard.close, self.path)

    # ------------------------------------------------------------------ reads
    def count(self, conditions: FilterNode | None = None) -> int:
        qe = _engine()
        request = qe.CountRequest(exact=True, filter=build_filter(qe, conditions))
        return int(_call(lambda: self._shard.count(request), self.path))

    def retrieve(
        self, ids: Sequence[str], payload: bool | Sequence[str] = True, vectors: bool = False
    ) -> list[EdgeRecord]:
        found = _call(lambda: self._shard.retrieve(list(ids), _payload(payload), vectors), self.path)
        return [_record(p) for p in found]

    def scroll(
        self, offset: str | None, limit: int, payload: bool | Sequence[str] = True, vectors: bool = False
    ) -> tuple[list[EdgeRecord], str | None]:
        qe = _engine()
        request = qe.ScrollRequest(offset=offset, limit=limit, with_payload=_payload(payload), with_vector=vectors)
        points, following = _call(lambda: self._shard.scroll(request), self.path)
        return [_record(p) for p in points], (str(following) if following is not None else None)

    def search_params(self, hnsw_ef: int | None, oversample: float | None) -> Any:
        """HNSW's ``ef``, rescoring of quantized codes, and ACORN for filtered searches: a graph search skips the
        neighbours a filter refuses, so a filter allowing a fraction of the points leaves a sparser graph whose
        walk misses allowed neighbours; ACORN also follows the refused neighbours' links. Qdrant uses it for filters
        it estimates to allow at most 40% of the points (its default); a filter allowing fewer points than its
        full-scan threshold is scanned through the payload index instead."""
        qe = _engine()
        quantization = (
            qe.QuantizationSearchParams(rescore=True, oversampling=oversample) if oversample is not None else None
        )
        return qe.SearchParams(hnsw_ef=hnsw_ef, quantization=quantization, acorn=qe.AcornSearchParams(enable=True))

    def dense_query(self, vector: Sequence[float]) -> Any:
        return _engine().Query.Nearest(list(vector))

    def sparse_query(self, terms: tuple[list[int], list[float]]) -> Any:
        qe = _engine()
        return qe.Query.Nearest(qe.SparseVector(terms[0], terms[1]), using=SPARSE)

    def request(
        self,
        query: Any,
        limit: int,
        *,
        conditions: FilterNode | None = None,
        payload: bool | Sequence[str] = True,
        params: Any = None,
    ) -> Any:
        """One query: ``query`` from :meth:`dense_query` / :meth:`sparse_query`."""
        qe = _engine()
        return qe.QueryRequest(
            limit=limit, query=query, filter=build_filter(qe, conditions), with_payload=_payload(payload), params=params
        )

    def fused_request(
        self,
        dense: Any,
        sparse: Any,
        limit: int,
        candidates: int,
        *,
        method: str,
        rrf_k: int = 60,
        conditions: FilterNode | None = None,
        payload: bool | Sequence[str] = True,
        params: Any = None,
    ) -> Any:
        """Dense and sparse candidates fused in the engine (prefetch + fusion): rrf or dbsf.

        Edge's RRF gives rank r (from 1) ``1 / (k + r - 1)``, as the server's; ours (and ranx's) ``1 / (k + r)``:
        the engine is handed ``k + 1``."""
        qe = _engine()
        flt = build_filter(qe, conditions)
        prefetches = [
            qe.Prefetch(limit=candidates, query=dense, filter=flt, params=params),
            qe.Prefetch(limit=candidates, query=sparse, filter=flt),
        ]
        fusion = qe.Fusion.Rrf(k=rrf_k + 1) if method == "rrf" else qe.Fusion.Dbsf()
        return qe.QueryRequest(limit=limit, query=fusion, prefetches=prefetches, with_payload=_payload(payload))

    def query_batch(self, requests: Sequence[Any]) -> list[list[EdgeRecord]]:
        if not requests:
            return []
        qe = _engine()
        answers = _call(lambda: self._shard.query_batch(qe.QueryBatchRequest(list(requests))), self.path)
        return [[_record(p) for p in points] for points in answers]

    def payload_indexes(self) -> dict[str, str]:
        """Payload fields the engine indexes, with their type (keyword, integer, ...)."""
        schema = _call(lambda: self._shard.info().payload_schema, self.path)
        return {key: str(info.data_type).rsplit(".", 1)[-1].lower() for key, info in schema.items()}

    def built(self) -> dict[str, Any]:
        """What the engine built, as it reports it: points, segments, indexed vectors (dense and sparse indexes
        counted), and for each segment the dense vector's index (plain | hnsw) and quantization, read from the
        segment's own ``segment.json``."""
        info = _call(self._shard.info, self.path)
        segments = []
        for config_file in sorted((self.path / "segments").glob("*/segment.json")):
            try:
                dense = json.loads(config_file.read_text())["config"]["vector_data"][""]
            except (OSError, ValueError, KeyError):
                continue  # a segment being replaced by the optimizer
            quantization = dense.get("quantization_config") or {}
            segments.append(
                {
                    "index": dense.get("index", {}).get("type", "plain"),
                    "quantization": "sq8" if "scalar" in quantization else next(iter(quantization), "none"),
                    "storage": dense.get("storage_type"),
                }
            )
        return {
            "points": int(info.points_count),
            "segments": int(info.segments_count),
            "indexed_vectors": int(info.indexed_vectors_count),
            "segment_indexes": segments,
        }

    def recorded_settings(self) -> dict[str, Any]:
        """The dense vector's settings the shard itself holds (``edge_config.json``): quantization, always_ram,
        on_disk, m, ef_construct, the metric, the BM25 vector's modifier (idf)."""
        config = json.loads((self.path / "edge_config.json").read_text())
        dense = config.get("vectors", {}).get("", {})
        quantization = dense.get("quantization_config") or {}
        kind = "sq8" if "scalar" in quantization else next(iter(quantization), "none")
        hnsw = dense.get("hnsw_config") or {}
        return {
            "quantize": kind,
            "always_ram": (quantization.get(kind if kind != "sq8" else "scalar") or {}).get("always_ram"),
            "on_disk": dense.get("on_disk"),
            "m": hnsw.get("m"),
            "ef_construct": hnsw.get("ef_construct"),
            "distance": dense.get("distance"),
            "sparse_modifier": (config.get("sparse_vectors", {}).get(SPARSE) or {}).get("modifier"),
        }


def _call(call: Any, path: Path) -> Any:
    """Run an engine call; its errors as an OSError (a file-system fault), :class:`ShardBusy` or
    :class:`EngineError`."""
    try:
        return call()
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    # the binding raises plain Exception for every engine error, and pyo3's PanicException (a BaseException) where
    # the engine panics, as it does on some damaged files: one line either way
    except BaseException as exc:
        text = str(exc)
        if "WouldBlock" in text or "Resource temporarily unavailable" in text:
            raise ShardBusy(f"{path}: the shard is open in another process (one owner per folder)") from exc
        fault = os_error(exc)
        if fault is not None and fault.errno in (errno.ENOSPC, errno.EIO, errno.EDQUOT, errno.EROFS, errno.EACCES):
            raise fault from exc
        raise EngineError(f"{path}: Qdrant Edge: {text.splitlines()[0] if text else type(exc).__name__}") from exc
