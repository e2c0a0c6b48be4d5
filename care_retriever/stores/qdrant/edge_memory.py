"""How much memory Qdrant Edge's ``optimize()`` takes, and the one-line refusal of a write that would make it
pass the machine's memory.

``optimize()`` builds each segment's HNSW graph and int8 codes in memory: its peak grows with the points of the
largest segment it builds, on top of what every point keeps resident (codes, graph links, ids). Measured with
``python -m benchmarks.edge_scale`` (768-d vectors on disk, int8 codes in RAM; benchmarks/results/scale.md), peak
RSS while building is about::

    BASE + BUILD_PER_POINT x (points of the largest segment) + RESIDENT_PER_POINT x (all points)

per 768 dims (a wider vector costs proportionally more). Without ``max_segment_size`` a bulk write lands in one
segment, so the build term counts every point (15.2 KB a point: on a 23.5 GiB machine, 1.65M points); with it,
at most a segment's worth (1,000,000 KB: 333,333 points, 4.8 GB), and the store grows by 1.46 KB a point.

The machine's memory is its physical memory, or ``CARE_MEMORY_LIMIT_GIB`` where set (a share of a machine
others use, or a test's figure).
"""

from __future__ import annotations

import os

from care_retriever.errors import StoreError

MEMORY_LIMIT_ENV = "CARE_MEMORY_LIMIT_GIB"
REFERENCE_DIM = 768
# fitted to 100k / 250k / 500k points in one segment and 250k in 250,000 KB segments (within 0.1% of each); 500k in
# 1,000,000 KB segments, measured after, peaked 3% below what it gives
BASE = 205 * 10**6  # bytes: the process, the engine, the first pages
BUILD_PER_POINT = 13_700  # bytes per point of the segment being built, at 768 dims
RESIDENT_PER_POINT = 1_460  # bytes per point already built (codes, links, ids), at 768 dims
GIB = 2**30


def memory_limit() -> int:
    """The bytes an optimize() may take: ``CARE_MEMORY_LIMIT_GIB`` where set, else the machine's memory."""
    given = os.environ.get(MEMORY_LIMIT_ENV)
    if given:
        try:
            limit = float(given)
        except ValueError:
            raise StoreError(f"{MEMORY_LIMIT_ENV}={given!r}: expected a number of GiB (e.g. 20)") from None
        if not limit > 0:
            raise StoreError(f"{MEMORY_LIMIT_ENV}={given!r}: expected a positive number of GiB")
        return int(limit * GIB)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def segment_points(dim: int, max_segment_size_kb: int | None) -> int | None:
    """Points of ``dim`` float32 dims in a segment of at most ``max_segment_size_kb`` KB (None: no limit)."""
    return None if max_segment_size_kb is None else max(1, max_segment_size_kb * 1024 // (4 * dim))


def optimize_peak_bytes(points: int, dim: int, max_segment_size_kb: int | None = None) -> int:
    """Peak memory of an optimize() over a store of ``points`` vectors of ``dim`` dims (the formula above)."""
    per_dim = dim / REFERENCE_DIM
    largest = segment_points(dim, max_segment_size_kb)
    built = points if largest is None else min(points, largest)
    return int(BASE + per_dim * (BUILD_PER_POINT * built + RESIDENT_PER_POINT * points))


def check_room(
    source: str, points: int, dim: int, max_segment_size_kb: int | None, done: str = "nothing was written"
) -> None:
    """One line where an optimize() over ``points`` would pass the memory limit: the figure, ``done`` (what
    became of the write), and what to do."""
    need, limit = optimize_peak_bytes(points, dim, max_segment_size_kb), memory_limit()
    if need <= limit:
        return
    whose = f"{MEMORY_LIMIT_ENV} allows" if os.environ.get(MEMORY_LIMIT_ENV) else "this machine has"
    advice = (
        "a new collection with a smaller --max-segment-size"
        if max_segment_size_kb is not None
        else "a new collection with --max-segment-size 1000000 (graphs built a segment at a time)"
    )
    raise StoreError(
        f"{source}: Qdrant Edge's optimize() of {points / 1e6:.2f}M points of {dim} dims needs about "
        f"{need / GIB:.1f} GiB, {whose} {limit / GIB:.1f} GiB; {done}: use a FAISS store "
        f"(faiss:DIR --profile large) or {advice}"
    )
