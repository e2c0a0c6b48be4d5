"""Speed and memory measurements shared by ``care-retriever bench`` and ``benchmarks/core_*.py``.

Everything here times the project's real code paths (``embed_queries``, the index writer, the
stores' ``search``) with ``time.perf_counter`` after a warm-up, and reports medians and tails
rather than single runs: on a shared machine one run says little. Peak memory is measured on a
fresh child process (``os.wait4`` gives that child's own peak RSS), since a process never gives
memory back to the OS and cannot measure its own "search-only" footprint after loading more.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from care_retriever.runtime.batch_limits import DOCUMENT_BATCH_SIZE

if TYPE_CHECKING:
    from care_retriever.stores.config import StoreConfig


@dataclass
class Latency:
    """Latencies of repeated calls: per-call percentiles (ms) and throughput in items per second."""

    batch: int
    calls: int
    items: int
    seconds: float
    p50_ms: float
    p99_ms: float
    mean_ms: float

    @property
    def per_second(self) -> float:
        return self.items / self.seconds if self.seconds else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "per_second": round(self.per_second, 3)}


def measure(fn: Callable[[Sequence[Any]], Any], items: Sequence[Any], batch: int, *, warmup: int = 2) -> Latency:
    """Call ``fn`` on consecutive batches of ``items``; ``warmup`` batches first, untimed."""
    if not items:
        raise ValueError("nothing to measure")
    batches = [items[i : i + batch] for i in range(0, len(items), batch)]
    for b in batches[:warmup]:
        fn(b)
    times = []
    for b in batches:
        t0 = time.perf_counter()
        fn(b)
        times.append(time.perf_counter() - t0)
    ms = np.asarray(times) * 1000
    return Latency(
        batch,
        len(times),
        len(items),
        float(sum(times)),
        float(np.percentile(ms, 50)),
        float(np.percentile(ms, 99)),
        float(ms.mean()),
    )


def query_encoding(embedder: Any, queries: Sequence[str], batch: int, *, instruction: str | None = None) -> Latency:
    """``embed_queries`` latency per call and queries per second at ``batch`` queries per call."""
    return measure(
        lambda b: embedder.embed_queries(list(b), instruction=instruction, batch_size=batch),
        list(queries),
        batch,
    )


def indexing(
    embedder: Any,
    documents: Sequence[Any],
    *,
    batch_size: int = DOCUMENT_BATCH_SIZE,
    workdir: str | Path | None = None,
    show_progress: bool = False,
) -> float:
    """Documents per second of :class:`DocumentStoreWriter` encoding into a fresh FAISS store."""
    from care_retriever.indexing.config import EncodeConfig
    from care_retriever.indexing.writer import DocumentStoreWriter

    with tempfile.TemporaryDirectory(prefix="care-bench-index-", dir=workdir) as tmp:
        writer = DocumentStoreWriter(
            embedder,
            f"faiss:{tmp}/store",
            encode=EncodeConfig(batch_size=batch_size, chunk_size=max(len(documents), 1)),
            show_progress=show_progress,
            sparse=False,  # the document tower's speed: no BM25 side
        )
        t0 = time.perf_counter()
        report = writer.write(list(documents), total=len(documents))
        seconds = time.perf_counter() - t0
        writer.store.close()
    return report.encoded / seconds


def clustered_unit_vectors(n: int, dim: int, *, clusters: int = 0, seed: int = 0) -> np.ndarray:
    """Unit vectors around random centres: a synthetic corpus with the neighbourhood structure of real
    embeddings. Uniform random high-dimensional vectors have no near neighbours at all, which makes
    any ANN index (HNSW) look far worse than it is on real data; latency is the same either way."""
    rng = np.random.default_rng(seed)
    clusters = clusters or max(1, n // 50)
    centres = rng.standard_normal((clusters, dim), dtype=np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    out = centres[rng.integers(0, clusters, n)]
    out += 0.6 / np.sqrt(dim) * rng.standard_normal((n, dim), dtype=np.float32)
    out /= np.linalg.norm(out, axis=1, keepdims=True)
    return out


def near_queries(corpus: np.ndarray, count: int, *, seed: int = 0) -> np.ndarray:
    """Queries as noisy copies of random corpus vectors (a query lies near the documents it is about)."""
    rng = np.random.default_rng(seed + 1)
    base = corpus[rng.choice(len(corpus), min(count, len(corpus)), replace=False)]
    q = base + 0.3 / np.sqrt(corpus.shape[1]) * rng.standard_normal(base.shape, dtype=np.float32)
    return (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)


def fill_store(spec: str, vectors: np.ndarray, *, index: StoreConfig = None, chunk: int = 4096) -> Any:
    """A store at ``spec`` holding ``vectors`` as documents ``d0..dN`` (upserted directly: no encoding)."""
    from care_retriever.documents import Document
    from care_retriever.stores import open_store
    from care_retriever.stores.capabilities import WriteRuns

    store = WriteRuns.require(open_store(spec), "filling a benchmark store")
    store.prepare(vectors.shape[1], "bench-random-vectors", "bench", index)
    for start in range(0, len(vectors), chunk):
        block = vectors[start : start + chunk]
        store.upsert([Document(id=f"d{start + i}", text=f"doc {start + i}") for i in range(len(block))], block)
    store.finalize()
    return store


def search_latency(store: Any, queries: np.ndarray, top_k: int = 10) -> tuple[Latency, list[list[str]]]:
    """Single-query ``store.search`` latency, and the hit ids (for recall against exact search)."""
    hits: list[list[str]] = []

    def one(batch: Sequence[np.ndarray]) -> None:
        result = store.search(np.asarray(batch, dtype=np.float32), top_k)
        hits.extend([h.id for h in row] for row in result)

    latency = measure(one, list(queries), 1, warmup=0)
    return latency, hits


def recall_at_k(approx: list[list[str]], exact: list[list[str]], k: int = 10) -> float:
    """Share of the exact top-``k`` that the approximate search also returns."""
    found = [len(set(a[:k]) & set(e[:k])) / max(len(e[:k]), 1) for a, e in zip(approx, exact, strict=True)]
    return float(np.mean(found)) if found else 0.0


# Linux's ru_maxrss of a child is a maximum over its life *including the memory image it was forked
# from*: a child forked from a parent holding 3 GiB reports at least 3 GiB. So the measured command is
# started by a small launcher (``python -S``, a few MiB), whose wait4 sees only the command itself.
_LAUNCHER = (
    "import os, sys\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    os.execvp(sys.argv[2], sys.argv[2:])\n"
    "_, status, usage = os.wait4(pid, 0)\n"
    "open(sys.argv[1], 'w').write(str(usage.ru_maxrss))\n"
    "sys.exit(os.waitstatus_to_exitcode(status))\n"
)


def peak_rss_mb(argv: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 1800) -> float:
    """Peak resident memory (MiB) of a command run to completion; raises if it fails."""
    with tempfile.TemporaryDirectory(prefix="care-rss-") as tmp:
        report = Path(tmp) / "maxrss"
        with tempfile.TemporaryFile() as err:
            proc = subprocess.run(
                [sys.executable, "-S", "-c", _LAUNCHER, str(report), *argv],
                stdout=subprocess.DEVNULL,
                stderr=err,
                env={**os.environ, **(env or {})},
                timeout=timeout,
                check=False,
            )
            if proc.returncode != 0:
                err.seek(0)
                tail = err.read().decode("utf-8", "replace").strip().splitlines()[-3:]
                raise RuntimeError(f"{' '.join(argv[:4])} ... exited {proc.returncode}: {' | '.join(tail)}")
        return int(report.read_text()) / 1024  # Linux reports KiB


LOAD_AND_ENCODE = (
    "import sys; from care_retriever.model.embedder import AsymmetricEmbedder as A; "
    "m = A.from_pretrained(sys.argv[1], load=sys.argv[2], trust_remote_code=sys.argv[4] == 'trust'); "
    "'query' in sys.argv[3] and m.embed_queries(['高血压吃什么']); "
    "'document' in sys.argv[3] and m.embed_documents(['高血压患者应低盐饮食，规律服用降压药。'])"
)


def tower_process_rss_mb(
    model_dir: str | Path, load: str, encode: str = "query", trust_remote_code: bool = False
) -> float:
    """Peak RSS of a process that loads ``model_dir`` with ``load`` and encodes one query and/or one
    document (``encode``: "query", "document" or "query+document").

    Weights are memory-mapped from safetensors and paged in when first used, so a tower that is
    loaded but never run adds little RSS: "both towers in use" needs ``encode="query+document"``.
    """
    trust = "trust" if trust_remote_code else "no-trust"
    return peak_rss_mb([sys.executable, "-c", LOAD_AND_ENCODE, str(model_dir), load, encode, trust])


def count_parameters(modules: Sequence[Any] | None) -> int:
    """Parameters of a tower's modules (shared tensors counted once)."""
    seen: set[int] = set()
    total = 0
    for module in modules or []:
        for p in module.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                total += p.numel()
    return total
