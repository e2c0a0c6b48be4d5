"""FAISS indexes of a store: the index options, the index built for them (vectors, or compressed codes for
quantized stores), its training on the first batch, ids, reconstruction and search parameters."""

from __future__ import annotations

from typing import Any

import faiss
import numpy as np

from care_retriever.errors import InputError
from care_retriever.stores.base import FAISS_INDEX_TYPES

INDEX_TYPES = FAISS_INDEX_TYPES
QUANTIZE = ("none", "sq8", "binary", "pq")
# Candidates taken from the codes per result wanted, by quantization (measured: docs/scale.md); a store's
# own value is kept in its manifest (index option "oversample") and FaissStore(oversample=...) overrides it.
DEFAULT_OVERSAMPLE = {"sq8": 4.0, "binary": 100.0, "pq": 50.0}
MIN_SQ_TRAIN = 256  # scalar codes take each dimension's range from the first batch: not from a handful of rows


def quantization(options: dict[str, Any]) -> str:
    """The store's code kind: "none" (the index holds the vectors) or sq8 / binary / pq (codes + vectors.f32)."""
    return str(options.get("quantize", "none"))


def checked_options(index: dict[str, Any] | None) -> dict[str, Any]:
    """The index options of a new store, checked (type, quantize, oversample) and completed with defaults."""
    options = {"type": "flat", **(index or {})}
    if options["type"] not in INDEX_TYPES:
        raise InputError(f"Unknown FAISS index type {options['type']!r}. Available index types: {list(INDEX_TYPES)}")
    quantize = options.get("quantize")
    if quantize is not None and quantize not in QUANTIZE:
        raise InputError(f"Unknown FAISS quantize {quantize!r}. Available: {list(QUANTIZE)}")
    oversample = options.get("oversample")
    if oversample is not None and (
        isinstance(oversample, bool) or not isinstance(oversample, (int, float)) or not oversample >= 1
    ):
        raise InputError(f"oversample must be a number >= 1, got {oversample!r}")
    if quantize in (None, "none"):  # today's store (no key, no vector file, format 2), or keep the store's
        options.pop("quantize", None)
        if quantize == "none" or oversample is None:
            options.pop("oversample", None)
        return options
    if options["type"] == "ivfpq":
        raise InputError("index type ivfpq already stores PQ codes; use --index-type ivf --quantize pq to rescore")
    if quantize == "binary" and options["type"] != "flat":
        raise InputError(f"quantize=binary works with index type flat only, not {options['type']!r}")
    options["oversample"] = float(DEFAULT_OVERSAMPLE[quantize] if oversample is None else oversample)
    return options


def codes_index(dim: int, options: dict[str, Any]) -> faiss.Index:
    """The compressed index of a quantized store (rescored from vectors.f32 at search time)."""
    quantize, kind = quantization(options), options.get("type", "flat")
    sq8, m = faiss.ScalarQuantizer.QT_8bit, int(options.get("m", 32))
    pq_m, bits = int(options.get("pq_m", 96)), int(options.get("pq_bits", 8))
    if quantize == "pq" and dim % pq_m:
        raise InputError(f"quantize=pq: pq_m={pq_m} must divide the dimension {dim}")
    ip = faiss.METRIC_INNER_PRODUCT
    if quantize == "binary":
        # RaBitQ: one bit per dimension of each vector's direction from the centroid of the first batch (plus
        # two floats), scored against the float query (8-bit FastScan lookup tables). Sign bits with Hamming
        # distance (IndexLSH) reduce the query to bits too and lost the exact top 10 on the dev tasks
        # (docs/scale.md): embeddings share a large common component, which the centroid removes.
        return faiss.IndexIDMap(faiss.IndexRaBitQFastScan(dim, ip))
    if kind == "ivf":
        nlist = int(options.get("nlist", 1024))
        if quantize == "sq8":
            return faiss.IndexIVFScalarQuantizer(faiss.IndexFlatIP(dim), dim, nlist, sq8, ip)
        return faiss.IndexIVFPQ(faiss.IndexFlatIP(dim), dim, nlist, pq_m, bits, ip)
    if kind == "hnsw":
        inner = faiss.IndexHNSWSQ(dim, sq8, m, ip) if quantize == "sq8" else faiss.IndexHNSWPQ(dim, pq_m, m, bits, ip)
        inner.hnsw.efConstruction = int(options.get("ef_construction", 200))
        return faiss.IndexIDMap(inner)
    return faiss.IndexIDMap(
        faiss.IndexScalarQuantizer(dim, sq8, ip) if quantize == "sq8" else faiss.IndexPQ(dim, pq_m, bits, ip)
    )


def build_index(dim: int, options: dict[str, Any]) -> faiss.Index:
    if quantization(options) != "none":
        return codes_index(dim, options)
    kind = options.get("type", "flat")
    if kind == "flat":
        inner = faiss.IndexFlatIP(dim)
    elif kind == "hnsw":
        inner = faiss.IndexHNSWFlat(dim, int(options.get("m", 32)), faiss.METRIC_INNER_PRODUCT)
        inner.hnsw.efConstruction = int(options.get("ef_construction", 200))
    elif kind == "ivf":
        # IVF stores ids itself; wrapping it in IndexIDMap breaks remove_ids (ids get out of step).
        quantizer = faiss.IndexFlatIP(dim)
        return faiss.IndexIVFFlat(quantizer, dim, int(options.get("nlist", 1024)), faiss.METRIC_INNER_PRODUCT)
    elif kind == "ivfpq":
        # pq_m bytes per vector instead of 4*dim (96 B vs 3 KB at 768 dims): the 10M-100M regime (docs/scale.md).
        pq_m, bits = int(options.get("pq_m", 96)), int(options.get("pq_bits", 8))
        if dim % pq_m:
            raise InputError(f"ivfpq: pq_m={pq_m} must divide the dimension {dim}")
        quantizer = faiss.IndexFlatIP(dim)
        return faiss.IndexIVFPQ(quantizer, dim, int(options.get("nlist", 1024)), pq_m, bits, faiss.METRIC_INNER_PRODUCT)
    else:
        raise InputError(f"Unknown FAISS index type {kind!r}. Available index types: {list(INDEX_TYPES)}")
    # IndexIDMap, not IndexIDMap2: reading an IDMap2 rebuilds its id -> position hash map (about a second
    # per million vectors); stores of format 1 hold IDMap2 and are read as they are.
    return faiss.IndexIDMap(inner)


def supports_remove(options: dict[str, Any]) -> bool:
    """HNSW cannot remove vectors: removed rows stay in it as tombstones that searches skip."""
    return options.get("type", "flat") != "hnsw"


def train_on_first_batch(index: faiss.Index, vectors: np.ndarray) -> None:
    """Train an untrained index on the first batch written to it (IVF lists, PQ codebooks, scalar ranges)."""
    inner = inner_index(index)
    if inner.is_trained:
        return
    # Trained once, on the first batch: make the first chunk large (>= 39 * nlist, and >= 256 * 39
    # for PQ codebooks) for a good quantiser; scalar codes take their value ranges from it.
    pq = getattr(inner, "pq", None)
    nlist = inner.nlist if isinstance(inner, faiss.IndexIVF) else 0
    needed = max(nlist, 2**pq.nbits if pq is not None else 0, MIN_SQ_TRAIN if nlist == 0 else 0)
    if isinstance(inner, faiss.IndexRaBitQFastScan):  # its training is the batch's mean: any batch will do
        needed = 1
    if len(vectors) < needed:
        what = f" with nlist={nlist}" if nlist else ""
        raise InputError(
            f"{type(inner).__name__}{what} needs at least {needed} vectors in the first batch to train; "
            f"{'lower --nlist or ' if nlist else ''}raise the chunk size"
        )
    inner.train(vectors)


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


def reconstruct(
    index: faiss.Index, rows: np.ndarray, id_order: np.ndarray | None
) -> tuple[list[np.ndarray | None], np.ndarray | None]:
    """The vectors stored under ``rows`` (row ids; -1 or a row the index lacks: None), and the argsort of an
    IndexIDMap's ids used to find them (pass it back in while the index is unchanged: sorting costs)."""
    if isinstance(index, faiss.IndexIDMap):  # no id -> position map: find positions in the sorted ids
        stored = faiss.vector_to_array(index.id_map)
        if id_order is None:
            id_order = np.argsort(stored, kind="stable")
        inner = faiss.downcast_index(index.index)
        where = np.clip(np.searchsorted(stored[id_order], rows), 0, max(len(stored) - 1, 0))
        positions = id_order[where] if len(stored) else where
        found = [
            None if r < 0 or stored[p] != r else inner.reconstruct(int(p)) for r, p in zip(rows, positions, strict=True)
        ]
        return found, id_order
    if not hasattr(index, "id_map"):  # IVF keeps ids itself; reconstructing by id needs its direct map
        ivf = faiss.extract_index_ivf(index)
        if ivf.direct_map.type == faiss.DirectMap.NoMap:
            ivf.set_direct_map_type(faiss.DirectMap.Hashtable)
    return [None if r < 0 else index.reconstruct(int(r)) for r in rows], id_order


def search_params(index: faiss.Index, options: dict[str, Any], row_ids: np.ndarray | None) -> Any:
    """FAISS search parameters for ``index`` (efSearch / nprobe from the store's ``options``), restricted to
    ``row_ids`` when given; None when the index's defaults do, False when no row is allowed."""
    inner = inner_index(index)
    selector = None
    if row_ids is not None:
        if len(row_ids) == 0:
            return False
        selector = faiss.IDSelectorBatch(row_ids)
    if isinstance(inner, faiss.IndexHNSW):
        params = faiss.SearchParametersHNSW()
        params.efSearch = int(options.get("ef_search", 128))
    elif isinstance(inner, faiss.IndexIVF):
        params = faiss.SearchParametersIVF()
        params.nprobe = int(options.get("nprobe", 32))
    elif selector is None:
        return None
    else:
        params = faiss.SearchParameters()
    if selector is not None:
        params.sel = selector
        params._care_selector_ref = selector  # keep the selector alive as long as params
    return params


def search_with(index: faiss.Index, vectors: np.ndarray, k: int, params: Any) -> tuple[np.ndarray, np.ndarray]:
    """(scores, ids) of each vector's ``k`` nearest; ``params`` None: the index's own settings."""
    return index.search(vectors, k, params=params) if params is not None else index.search(vectors, k)
