"""FAISS indexes of a store: the index options, the index built for them (vectors, or compressed codes for
quantized stores), its training on the first batch, ids, reconstruction and search parameters."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import faiss
import numpy as np

from care_retriever.errors import InputError
from care_retriever.stores.config import (
    FaissIndexConfig,
    IndexType,
    Quantize,
    StoreConfig,
    as_faiss_config,
)

QUANTIZE = tuple(q.value for q in Quantize)
MIN_SQ_TRAIN = 256  # scalar codes take each dimension's range from the first batch: not from a handful of rows
# what a store's prepare/begin are handed: its config or None (a user's dict is read where it is handed in)
IndexOptions = StoreConfig


def checked_options(index: IndexOptions) -> FaissIndexConfig:
    """The index settings handed to a store: its config (checked when it was built), None its defaults; a dict or
    the other kind's config is one line."""
    return as_faiss_config(index)


def manifest_config(index: Mapping[str, Any] | None) -> FaissIndexConfig:
    """The config a store's manifest records under ``"index"`` (every shape written so far), read once per distinct
    dict: the functions below take the config only."""
    items = tuple(sorted((index or {}).items()))
    try:
        return _manifest_config(items)
    except TypeError:  # a value that cannot be a cache key (no option is one): read without the cache
        return FaissIndexConfig.from_manifest(index)


@functools.lru_cache(maxsize=64)
def _manifest_config(items: tuple[tuple[str, Any], ...]) -> FaissIndexConfig:
    return FaissIndexConfig.from_manifest(dict(items))


def quantization(config: FaissIndexConfig) -> str:
    """The store's code kind: "none" (the index holds the vectors) or sq8 / binary / pq (codes + vectors.f32)."""
    return config.quantization.value


def codes_index(dim: int, config: FaissIndexConfig) -> faiss.Index:
    """The compressed index of a quantized store (rescored from vectors.f32 at search time)."""
    quantize, kind = config.quantization, config.index_type
    sq8, m, pq_m, bits = faiss.ScalarQuantizer.QT_8bit, config.m, config.pq_m, config.pq_bits
    if quantize is Quantize.PQ and dim % pq_m:
        raise InputError(f"quantize=pq: pq_m={pq_m} must divide the dimension {dim}")
    ip = faiss.METRIC_INNER_PRODUCT
    if quantize is Quantize.BINARY:
        # RaBitQ: one bit per dimension of each vector's direction from the centroid of the first batch (plus
        # two floats), scored against the float query (8-bit FastScan lookup tables). Sign bits with Hamming
        # distance (IndexLSH) reduce the query to bits too and lost the exact top 10 on the dev tasks
        # (benchmarks/results/scale.md): embeddings share a large common component, which the centroid removes.
        return faiss.IndexIDMap(faiss.IndexRaBitQFastScan(dim, ip))
    if kind is IndexType.IVF:
        if quantize is Quantize.SQ8:
            return faiss.IndexIVFScalarQuantizer(faiss.IndexFlatIP(dim), dim, config.nlist, sq8, ip)
        return faiss.IndexIVFPQ(faiss.IndexFlatIP(dim), dim, config.nlist, pq_m, bits, ip)
    if kind is IndexType.HNSW:
        sq8_inner = quantize is Quantize.SQ8
        inner = faiss.IndexHNSWSQ(dim, sq8, m, ip) if sq8_inner else faiss.IndexHNSWPQ(dim, pq_m, m, bits, ip)
        inner.hnsw.efConstruction = config.ef_construction
        return faiss.IndexIDMap(inner)
    return faiss.IndexIDMap(
        faiss.IndexScalarQuantizer(dim, sq8, ip) if quantize is Quantize.SQ8 else faiss.IndexPQ(dim, pq_m, bits, ip)
    )


def build_index(dim: int, config: FaissIndexConfig) -> faiss.Index:
    if config.quantization is not Quantize.NONE:
        return codes_index(dim, config)
    kind = config.index_type
    if kind is IndexType.FLAT:
        inner = faiss.IndexFlatIP(dim)
    elif kind is IndexType.HNSW:
        inner = faiss.IndexHNSWFlat(dim, config.m, faiss.METRIC_INNER_PRODUCT)
        inner.hnsw.efConstruction = config.ef_construction
    elif kind is IndexType.IVF:
        # IVF stores ids itself; wrapping it in IndexIDMap breaks remove_ids (ids get out of step).
        quantizer = faiss.IndexFlatIP(dim)
        return faiss.IndexIVFFlat(quantizer, dim, config.nlist, faiss.METRIC_INNER_PRODUCT)
    else:  # ivfpq: pq_m bytes per vector instead of 4*dim (96 B vs 3 KB at 768 dims): the 10M-100M regime
        pq_m = config.pq_m
        if dim % pq_m:
            raise InputError(f"ivfpq: pq_m={pq_m} must divide the dimension {dim}")
        quantizer = faiss.IndexFlatIP(dim)
        return faiss.IndexIVFPQ(quantizer, dim, config.nlist, pq_m, config.pq_bits, faiss.METRIC_INNER_PRODUCT)
    # IndexIDMap, not IndexIDMap2: reading an IDMap2 rebuilds its id -> position hash map (about a second
    # per million vectors); stores of format 1 hold IDMap2 and are read as they are.
    return faiss.IndexIDMap(inner)


def supports_remove(config: FaissIndexConfig) -> bool:
    """HNSW cannot remove vectors: removed rows stay in it as tombstones that searches skip."""
    return config.supports_remove


def train_on_first_batch(index: faiss.Index, vectors: np.ndarray) -> None:
    """Train an untrained index on the first batch written to it (IVF lists, PQ codebooks, scalar ranges)."""
    inner = inner_index(index)
    if inner.is_trained:
        return
    needed = vectors_to_train(index)
    nlist = inner.nlist if isinstance(inner, faiss.IndexIVF) else 0
    if len(vectors) < needed:
        what = f" with nlist={nlist}" if nlist else ""
        raise InputError(
            f"{type(inner).__name__}{what} needs at least {needed} vectors in the first batch to train; "
            f"{'lower --nlist or ' if nlist else ''}raise the chunk size"
        )
    inner.train(vectors)


def vectors_to_train(index: faiss.Index) -> int:
    """How many vectors the first batch written to ``index`` must hold to train it (0: it needs no training)."""
    inner = inner_index(index)
    if inner.is_trained:
        return 0
    if isinstance(inner, faiss.IndexRaBitQFastScan):  # its training is the batch's mean: any batch will do
        return 1
    # Trained once, on the first batch: make the first chunk large (>= 39 * nlist, and >= 256 * 39
    # for PQ codebooks) for a good quantiser; scalar codes take their value ranges from it.
    pq = getattr(inner, "pq", None)
    nlist = inner.nlist if isinstance(inner, faiss.IndexIVF) else 0
    return max(nlist, 2**pq.nbits if pq is not None else 0, MIN_SQ_TRAIN if nlist == 0 else 0)


def takes_search_params(inner: faiss.Index) -> bool:
    """Whether a search can pass this index an id selector (IndexRaBitQFastScan and IndexPQ refuse search
    parameters)."""
    return not isinstance(inner, (faiss.IndexPQ, faiss.IndexRaBitQFastScan))


def inner_index(index: faiss.Index) -> faiss.Index:
    """The index doing the search: the one under an IndexIDMap, or the index itself (IVF)."""
    return faiss.downcast_index(index.index) if hasattr(index, "id_map") else faiss.downcast_index(index)


def index_ids(index: faiss.Index) -> np.ndarray:
    """External ids of all vectors in ``index`` (row ids of the docstore, tombstones included)."""
    if index.ntotal == 0:
        return np.zeros(0, dtype=np.int64)
    if hasattr(index, "id_map"):
        return faiss.vector_to_array(index.id_map)
    ivf = faiss.extract_index_ivf(index)
    lists = ivf.invlists
    parts = [
        faiss.rev_swig_ptr(lists.get_ids(i), lists.list_size(i)).copy() for i in range(ivf.nlist) if lists.list_size(i)
    ]
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class IdOrder:
    """Where each id of an IndexIDMap sits: its ids sorted, and their positions in that order (kept while the
    index is unchanged: sorting costs as much as a pass over the store)."""

    ids: np.ndarray
    positions: np.ndarray

    @classmethod
    def of(cls, index: faiss.IndexIDMap) -> IdOrder:
        stored = faiss.vector_to_array(index.id_map)
        positions = np.argsort(stored, kind="stable")
        return cls(stored[positions], positions)

    def find(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(whether each row is held, its position where it is)."""
        if not len(self.ids):
            return np.zeros(len(rows), dtype=bool), np.zeros(len(rows), dtype=np.int64)
        where = np.clip(np.searchsorted(self.ids, rows), 0, len(self.ids) - 1)
        return self.ids[where] == rows, self.positions[where]


def reconstruct(
    index: faiss.Index, rows: np.ndarray, id_order: IdOrder | None
) -> tuple[list[np.ndarray | None], IdOrder | None]:
    """The vectors stored under ``rows`` (row ids; -1 or a row the index lacks: None), and the :class:`IdOrder`
    of an IndexIDMap used to find them (pass it back in while the index is unchanged)."""
    if isinstance(index, faiss.IndexIDMap):  # no id -> position map: find positions in the sorted ids
        id_order = id_order or IdOrder.of(index)
        inner = faiss.downcast_index(index.index)
        held, positions = id_order.find(np.asarray(rows, dtype=np.int64))
        found = [inner.reconstruct(int(p)) if h else None for h, p in zip(held, positions, strict=True)]
        return found, id_order
    if not hasattr(index, "id_map"):  # IVF keeps ids itself; reconstructing by id needs its direct map
        ivf = faiss.extract_index_ivf(index)
        if ivf.direct_map.type == faiss.DirectMap.NoMap:
            ivf.set_direct_map_type(faiss.DirectMap.Hashtable)
    rows = np.asarray(rows, dtype=np.int64)
    stored = np.flatnonzero(rows >= 0)
    vectors: list[np.ndarray | None] = [None] * len(rows)
    for i, vector in zip(stored.tolist(), index.reconstruct_batch(rows[stored]) if len(stored) else [], strict=True):
        vectors[i] = vector  # one call for all the rows: a call a row costs more than the reconstruction
    return vectors, id_order


def float_rows(index: faiss.Index) -> np.ndarray | None:
    """A read-only view of the float vectors an IndexIDMap over a flat or HNSW-flat index stores, one row per
    position (no copy); None for any other index."""
    if not isinstance(index, faiss.IndexIDMap):
        return None
    inner = faiss.downcast_index(index.index)
    flat = faiss.downcast_index(inner.storage) if isinstance(inner, faiss.IndexHNSWFlat) else inner
    if not isinstance(flat, faiss.IndexFlat) or flat.ntotal == 0:
        return None
    return faiss.rev_swig_ptr(flat.get_xb(), flat.ntotal * flat.d).reshape(flat.ntotal, flat.d)


def stored_among(
    index: faiss.Index, rows: np.ndarray, id_order: IdOrder | None
) -> tuple[np.ndarray, np.ndarray, IdOrder | None]:
    """(the ``rows`` the index holds, their vectors as one matrix, the :class:`IdOrder` to pass back in): gathered
    at once where :func:`float_rows` gives a view, one reconstruction a row otherwise."""
    view = float_rows(index)
    if view is None:
        found, id_order = reconstruct(index, rows, id_order)
        kept = [i for i, v in enumerate(found) if v is not None]
        vectors = [v for v in found if v is not None]
        matrix = np.stack(vectors) if vectors else np.zeros((0, index.d), dtype=np.float32)
        return rows[kept], matrix.astype(np.float32, copy=False), id_order
    id_order = id_order or IdOrder.of(index)
    held, positions = id_order.find(rows)
    return rows[held], view[positions[held]], id_order


# Filters selecting at most this many rows are scored exactly over those rows (a flat or code search restricted
# to them still visits every row); above it the index searches with an id selector. HNSW: see exact_scan_rows.
EXACT_SCAN_ROWS = 20_000
BITMAP_ROWS = 4096  # selections of at least this many rows are a bitmap (one bit a row id), fewer a hash set


def _selector(row_ids: np.ndarray) -> tuple[faiss.IDSelector, np.ndarray | None]:
    """An id selector of ``row_ids`` and the bitmap it reads (None for a set): a bitmap is built in one numpy
    pass and tested without hashing, which counts where many rows are selected."""
    if len(row_ids) < BITMAP_ROWS:
        return faiss.IDSelectorBatch(row_ids), None
    bits = np.zeros(int(row_ids.max()) + 1, dtype=bool)
    bits[row_ids] = True
    bitmap = np.packbits(bits, bitorder="little")
    return faiss.IDSelectorBitmap(len(bitmap), faiss.swig_ptr(bitmap)), bitmap


def exact_scan_rows(index: faiss.Index, config: FaissIndexConfig) -> int:
    """Up to how many selected rows a filtered search scores them exactly rather than through ``index``.

    An HNSW search restricted to a fraction ``f`` of the rows finds about ``ef_search`` of them only when it
    visits ``ef_search / f`` nodes (:func:`search_params` widens it so), at ``m`` distances each; scanning the
    ``f x N`` rows costs one distance a row. The two cost the same at ``sqrt(ef_search x m x N)`` rows."""
    if isinstance(inner_index(index), faiss.IndexHNSW):
        return max(EXACT_SCAN_ROWS, math.isqrt(config.ef_search * config.m * index.ntotal))
    return EXACT_SCAN_ROWS


def search_params(index: faiss.Index, config: FaissIndexConfig, row_ids: np.ndarray | None, candidates: int = 0) -> Any:
    """FAISS search parameters for ``index`` (efSearch / nprobe from the store's ``config``), restricted to
    ``row_ids`` when given; None when the index's defaults do, False when no row is allowed. ``candidates``: an
    HNSW search keeps at least that many on its list (a widened search's)."""
    inner = inner_index(index)
    selector, held = None, None
    if row_ids is not None:
        if len(row_ids) == 0:
            return False
        selector, held = _selector(row_ids)
    if isinstance(inner, faiss.IndexHNSW):
        params = faiss.SearchParametersHNSW()
        params.efSearch = max(config.ef_search, candidates)
        if row_ids is not None:  # as many allowed rows among the visited as an unfiltered search finds
            params.efSearch = max(config.ef_search, math.ceil(config.ef_search * index.ntotal / len(row_ids)))
    elif isinstance(inner, faiss.IndexIVF):
        params = faiss.SearchParametersIVF()
        params.nprobe = config.nprobe
    elif selector is None:
        return None
    else:
        params = faiss.SearchParameters()
    if selector is not None:
        params.sel = selector
        params._care_selector_ref = (selector, held)  # keep the selector and its bitmap alive as long as params
    return params


def search_with(index: faiss.Index, vectors: np.ndarray, k: int, params: Any) -> tuple[np.ndarray, np.ndarray]:
    """(scores, ids) of each vector's ``k`` nearest; ``params`` None: the index's own settings."""
    return index.search(vectors, k, params=params) if params is not None else index.search(vectors, k)
