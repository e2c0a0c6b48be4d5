"""Store profiles: the settings a store gets from the size of what it will hold (``--profile`` of ``index`` and
``copy``).

* ``small``: the store's own defaults (FAISS flat, Qdrant HNSW with the vectors in RAM).
* ``large``: vectors on disk, compressed codes in RAM. FAISS: IVF lists (:func:`ivf_lists`) over PQ codes of
  ``dim / 4`` bytes (SQ8 where 4 does not divide the dimension), trained on a sample of :func:`training_sample`
  rows, each search rescoring 40 x k candidates exactly from ``vectors.f32``. Qdrant: on-disk vectors and int8
  codes kept in RAM; Qdrant Edge builds its graphs in segments of at most 1,000,000 KB of vectors.
* ``auto``: ``large`` when the corpus's float32 vectors would pass :data:`LARGE_FROM_BYTES`, else ``small``.

Memory of a FAISS ``large`` store of ``N`` vectors of ``dim`` dimensions (PQ codes; SQ8 codes take ``dim`` bytes a
vector instead of ``dim / 4``):

* serving: ``N x (dim / 4 + 8)`` bytes (codes and ids) + ``nlist x dim x 4`` (centroids); the rescored rows are
  read from ``vectors.f32`` by the page cache, never held. 10M x 768: 1.9 GiB + 6 MiB.
* building: the same, plus the training sample (``training_sample x dim x 4``: 80k x 768 is 240 MiB) while it is
  held, plus one batch written at a time (its vectors, ``batch x dim x 4``).

Any option given at other than its default wins over the profile (``--profile large --nprobe 64``).

Example:
    >>> from care_retriever.stores.config import FaissIndexConfig
    >>> config = profile_config("large", FaissIndexConfig(), n=10_000_000, dim=768)
    >>> (config.index_type.value, config.nlist, config.quantize.value, config.pq_m)
    ('ivf', 2048, 'pq', 192)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from care_retriever.model.settings import STORE_INDEX_PANEL, Choice, choice, meta
from care_retriever.stores.config import FaissIndexConfig, IndexType, QdrantCollectionConfig, QdrantQuantize, Quantize

# ``auto`` turns ``large`` past 6 GiB of float32 vectors (2M at 768 dims): the small profile holds them all in RAM
# (an HNSW graph or Qdrant's optimizer on top), which then passes a quarter of a 24 GiB machine's memory.
LARGE_FROM_BYTES = 6 * 2**30
LARGE_PQ_OVERSAMPLE = 40.0
# Qdrant Edge builds one segment's graph at a time, its peak memory growing with the segment
# (care_retriever/stores/qdrant/edge_memory.py): 1,000,000 KB (333,333 vectors of 768 dims) keeps 10M such points
# under 20 GiB, where one segment of every point passes it at 1.4M; each search visits every segment.
LARGE_EDGE_SEGMENT_KB = 1_000_000
PROFILE_HELP = (
    "auto | small | large: large keeps the vectors on disk and compressed codes in RAM (FAISS IVF + PQ, Qdrant "
    "int8); auto picks large past 6 GiB of float32 vectors (2M at 768 dims). Options given win over it."
)


class StoreProfile(Choice):
    AUTO = "auto"
    SMALL = "small"
    LARGE = "large"


@dataclass(frozen=True)
class ProfileConfig:
    """The ``--profile`` option of ``index`` and ``copy``.

    Args:
        profile: auto (by the corpus's size), small (the store's defaults) or large (vectors on disk).
    """

    cli_panel: ClassVar[str] = STORE_INDEX_PANEL

    profile: StoreProfile = field(default=StoreProfile.AUTO, metadata=meta(PROFILE_HELP))

    def __post_init__(self) -> None:
        object.__setattr__(self, "profile", choice(StoreProfile, self.profile, "store profile"))


def chosen_profile(profile: StoreProfile | str, n: int, dim: int) -> StoreProfile:
    """``profile``, with ``auto`` resolved from ``n`` vectors of ``dim`` dimensions (:data:`LARGE_FROM_BYTES`)."""
    profile = choice(StoreProfile, profile, "store profile")
    if profile is not StoreProfile.AUTO:
        return profile
    return StoreProfile.LARGE if n * dim * 4 > LARGE_FROM_BYTES else StoreProfile.SMALL


def ivf_lists(n: int) -> int:
    """IVF lists for ``n`` vectors: the power of two at or below sqrt(n), within [16, 65536]. Every vector added
    is compared with every list's centroid (n x nlist x dim at build), every search scans nprobe lists of n / nlist
    codes: sqrt(n) balances the two on a machine of few cores."""
    return min(max(2 ** int(math.log2(max(n, 1)) / 2), 16), 65536)


def ivf_probes(nlist: int) -> int:
    """Lists a search visits: 1/128 of them, at least 16 (and at most all); ``--nprobe`` raises it where the
    neighbours of a query spread over more lists (recall against search time)."""
    return min(max(nlist // 128, 16), nlist)


def training_sample(nlist: int) -> int:
    """Vectors the IVF lists and codes train on: 40 a list (FAISS's k-means wants 39 to 256; its cost grows with
    the sample), at least 65,536 (the PQ codebooks' 256 centroids each)."""
    return max(40 * nlist, 65_536)


def _given(config: Any) -> set[str]:
    """The fields of ``config`` set to other than their default: options the user gave, which a profile keeps."""
    return {f.name for f in dataclasses.fields(config) if getattr(config, f.name) != f.default}


def large_faiss(config: FaissIndexConfig, n: int, dim: int) -> FaissIndexConfig:
    """The large profile of a FAISS store of ``n`` vectors: IVF + PQ (SQ8 where 4 does not divide ``dim``)."""
    nlist = ivf_lists(n)
    pq = dim % 4 == 0
    settings: dict[str, Any] = {
        "index_type": IndexType.IVF,
        "nlist": nlist,
        "nprobe": ivf_probes(nlist),
        "quantize": Quantize.PQ if pq else Quantize.SQ8,
        # a byte per 4 dimensions: at 10M x 768 the exact top 10 were among the 300 best of these codes 0.978 of the
        # time, and 0.81 with a byte per 8 (benchmarks/large_codes.py)
        "pq_m": dim // 4 if pq else FaissIndexConfig.pq_m,
        "train_size": training_sample(nlist),
        "oversample": LARGE_PQ_OVERSAMPLE if pq else None,
    }
    given = _given(config)
    return dataclasses.replace(config, **{k: v for k, v in settings.items() if k not in given})


def large_qdrant(config: QdrantCollectionConfig) -> QdrantCollectionConfig:
    """The large profile of a Qdrant collection: original vectors on disk, int8 codes in RAM, and on Qdrant Edge
    segments of at most :data:`LARGE_EDGE_SEGMENT_KB` (their graphs built one at a time)."""
    settings: dict[str, Any] = {
        "on_disk": True,
        "quantize": QdrantQuantize.SQ8,
        "always_ram": True,
        "max_segment_size": LARGE_EDGE_SEGMENT_KB,
    }
    given = _given(config)
    return dataclasses.replace(config, **{k: v for k, v in settings.items() if k not in given})


def profile_config(
    profile: StoreProfile | str, config: FaissIndexConfig | QdrantCollectionConfig, *, n: int, dim: int
) -> FaissIndexConfig | QdrantCollectionConfig:
    """``config`` with the settings of ``profile`` for ``n`` vectors of ``dim`` dimensions (options given win).

    Args:
        profile: auto, small or large.
        config: the store's settings as given (a FAISS index or a Qdrant collection).
        n: documents the store will hold.
        dim: their vectors' dimension.
    """
    if chosen_profile(profile, n, dim) is StoreProfile.SMALL:
        return config
    if isinstance(config, FaissIndexConfig):
        return large_faiss(config, n, dim)
    return large_qdrant(config)
