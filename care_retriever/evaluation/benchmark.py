"""``care-retriever bench``: query speed, indexing speed, search latency and memory, in one run.

For a CARE model the run covers the three configurations the paper compares (Table 4, Figure 1):
the asymmetric model (small query tower online), the small symmetric model (``DIR#query``: the
query tower on both sides) and the symmetric LLM path (``DIR#document``: queries through the
document tower), all on the same hardware and the same texts. Search latency is measured on the
project's stores (FAISS exact, FAISS HNSW with its recall@10 against exact, Qdrant local mode) at N
documents of the model's width; peak memory is that of fresh processes loading only the query tower
vs both towers.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from care_retriever.documents import document_text
from care_retriever.evaluation import speed
from care_retriever.model.protocols import Embedder
from care_retriever.runtime.batch_limits import DOCUMENT_BATCH_SIZE
from care_retriever.stores.config import FaissIndexConfig, IndexType

logger = logging.getLogger("care_retriever")

SAMPLE_DIR = Path(__file__).resolve().parents[1] / "data" / "sample"
ROLE = {
    "": "asymmetric",
    "#query": "small symmetric (query tower both sides)",
    "#document": "symmetric LLM (document tower both sides)",
}


@dataclass
class ModelBench:
    """One model's row: speeds, sizes, and (when given) accuracy."""

    name: str
    role: str
    dim: int
    query_params: int | None
    document_params: int | None
    query: dict[str, dict[str, Any]] = field(default_factory=dict)
    indexing_docs_per_s: float | None = None
    accuracy: float | None = None
    accuracy_tasks: list[str] = field(default_factory=list)

    @property
    def qps_batch1(self) -> float:
        return float(self.query.get("batch_1", {}).get("per_second", 0.0))


@dataclass
class BenchResult:
    hardware: dict[str, Any]
    models: list[ModelBench]
    search: list[dict[str, Any]] = field(default_factory=list)
    memory: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "hardware": self.hardware,
            "settings": self.settings,
            "models": [{**m.__dict__, "qps_batch1": round(m.qps_batch1, 3)} for m in self.models],
            "search": self.search,
            "memory": self.memory,
        }


def hardware() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "machine": platform.machine(),
        "processor": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    with contextlib.suppress(OSError):
        info["load_average_1m"] = round(os.getloadavg()[0], 2)
    return info


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def read_texts(path: Path, limit: int, fields: Sequence[str] = ("text", "query")) -> list[str]:
    """Texts from a JSONL file (``text``/``query`` field), a BEIR folder's queries, or a plain text file."""
    if path.is_dir():
        path = path / "queries.jsonl"
    out: list[str] = []
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            if line.startswith("{"):
                row = json.loads(line)
                text = next((row[f] for f in fields if isinstance(row.get(f), str)), "")
                title = row.get("title") if isinstance(row.get("title"), str) else ""
                text = document_text(title, text)
            else:
                text = line
            if text.strip():
                out.append(text)
    if not out:
        from care_retriever.errors import InputError

        raise InputError(f"{path}: no texts found")
    # Repeat to the requested count: timing needs enough calls, not distinct texts.
    return [out[i % len(out)] for i in range(limit)]


def read_documents(path: Path, limit: int) -> list[Any]:
    from care_retriever.documents import Document
    from care_retriever.indexing.corpus import read_corpus

    docs = []
    for doc in read_corpus(path):
        docs.append(doc)
        if len(docs) >= limit:
            break
    base = list(docs)
    i = 0
    while base and len(docs) < limit:  # repeat with new ids up to the requested count
        d = base[i % len(base)]
        docs.append(Document(id=f"{d.id}~{len(docs)}", text=d.text, title=d.title))
        i += 1
    return docs


def tower_params(embedder: Embedder) -> tuple[int, int]:
    """Parameters of the query tower and of the document tower (the same tower for one-tower models)."""
    return speed.count_parameters([embedder.query_model]), speed.count_parameters([embedder.document_model])


def bench_models(
    names: Sequence[str],
    *,
    queries: list[str],
    documents: list[Any],
    batches: Sequence[int] = (1, 32),
    doc_batch_size: int = DOCUMENT_BATCH_SIZE,
    device: str | None = None,
    labels: dict[str, str] | None = None,
    trust_remote_code: bool = False,
) -> list[ModelBench]:
    """Query encoding at each batch size and indexing docs/s for each model (a shared document tower
    is timed once: ``DIR`` and ``DIR#document`` index with the same tower)."""
    from care_retriever.model.baselines import load_embedder
    from care_retriever.sparse.bm25 import BM25Model

    rows: list[ModelBench] = []
    indexing_cache: dict[str, float] = {}
    for name in names:
        base, sep, tower = name.partition("#")
        role = ROLE.get(f"{sep}{tower}", "baseline")
        embedder = load_embedder(name, device=device, trust_remote_code=trust_remote_code)
        if isinstance(embedder, BM25Model):
            logger.warning("bench: %s has no dense towers to time; skipped", name)
            continue
        q_params, d_params = tower_params(embedder)
        row = ModelBench((labels or {}).get(name, name), role, int(embedder.dim), q_params, d_params)
        for b in batches:
            row.query[f"batch_{b}"] = speed.query_encoding(embedder, queries, b).to_dict()
            logger.info("bench %s: batch %d: %.1f queries/s", row.name, b, row.query[f"batch_{b}"]["per_second"])
        doc_tower_key = f"{base}#document" if tower in ("", "document") else name
        if documents:
            if doc_tower_key not in indexing_cache:
                indexing_cache[doc_tower_key] = speed.indexing(embedder, documents, batch_size=doc_batch_size)
            row.indexing_docs_per_s = indexing_cache[doc_tower_key]
        rows.append(row)
        del embedder
    return rows


def bench_search(
    query_vectors: np.ndarray,
    sizes: Sequence[int],
    *,
    top_k: int = 10,
    backends: Sequence[str] = ("faiss-flat", "faiss-hnsw", "qdrant-edge"),
    hnsw_m: int = 32,
    ef_search: int = 128,
) -> list[dict[str, Any]]:
    """Single-query search latency per backend and corpus size; HNSW recall@10 against exact search.

    The corpus is synthetic (``speed.clustered_unit_vectors``, the model's width): encoding 50k real
    documents with an LLM tower would dominate the benchmark, and search cost depends on N and the
    dimension only. Queries are noisy copies of corpus vectors, as many as ``query_vectors`` has
    rows, so that the recall of HNSW is measured on data with near neighbours, as real data has.
    """
    rows = []
    dim = query_vectors.shape[1]
    for n in sizes:
        vectors = speed.clustered_unit_vectors(n, dim, seed=n)
        queries = speed.near_queries(vectors, len(query_vectors), seed=n)
        exact_hits: list[list[str]] | None = None
        with tempfile.TemporaryDirectory(prefix="care-bench-search-") as tmp:
            for backend in backends:
                settings: dict[str, tuple[str, FaissIndexConfig | None]] = {
                    "faiss-flat": (f"faiss:{tmp}/flat", FaissIndexConfig(index_type=IndexType.FLAT)),
                    "faiss-hnsw": (
                        f"faiss:{tmp}/hnsw",
                        FaissIndexConfig(index_type=IndexType.HNSW, m=hnsw_m, ef_search=ef_search),
                    ),
                    # Qdrant Edge in a temporary folder: the engine and search code of a qdrant:PATH store.
                    "qdrant-edge": ("qdrant::memory:", None),
                }
                spec, options = settings[backend]
                if backend == "qdrant-edge":
                    try:
                        import qdrant_edge  # noqa: F401
                    except ImportError:
                        rows.append({"backend": backend, "n": n, "skipped": "qdrant-edge-py not installed"})
                        continue
                t0 = time.perf_counter()
                store = speed.fill_store(spec, vectors, index=options)
                build_s = time.perf_counter() - t0
                latency, hits = speed.search_latency(store, queries, top_k)
                store.close()
                row = {
                    "backend": backend,
                    "n": n,
                    "dim": dim,
                    "build_seconds": round(build_s, 2),
                    **{k: round(v, 4) if isinstance(v, float) else v for k, v in latency.to_dict().items()},
                }
                if backend == "faiss-flat":
                    exact_hits = hits
                elif exact_hits is not None:
                    row[f"recall@{top_k}_vs_exact"] = round(speed.recall_at_k(hits, exact_hits, top_k), 4)
                rows.append(row)
                logger.info("bench search %s n=%d: p50 %.2f ms", backend, n, latency.p50_ms)
    return rows


def bench_memory(model_dir: str | Path, trust_remote_code: bool = False) -> dict[str, Any]:
    """Peak RSS of fresh processes: the query tower alone vs both towers in use (one query and one
    document encoded; weights are paged in on first use, so merely loading a tower costs little)."""
    trust = trust_remote_code
    query_only = speed.tower_process_rss_mb(model_dir, "query", "query", trust)
    both_loaded = speed.tower_process_rss_mb(model_dir, "both", "query", trust)
    both = speed.tower_process_rss_mb(model_dir, "both", "query+document", trust)
    return {
        "query_only_mb": round(query_only, 1),
        "both_loaded_query_only_mb": round(both_loaded, 1),
        "both_towers_mb": round(both, 1),
        "ratio": round(query_only / both, 3),
    }


def attach_accuracy(rows: Sequence[ModelBench], results: Sequence[dict[str, Any]]) -> None:
    """Mean main score per model over its scored tasks (``eval --json`` objects, matched by model name)."""
    for row in rows:
        mine = [r for r in results if r.get("model") == row.name and r.get("main_score") is not None]
        if mine:
            row.accuracy = float(np.mean([r["main_score"] for r in mine]))
            row.accuracy_tasks = [r["task"] for r in mine]


def read_eval_json(path: Path) -> list[dict[str, Any]]:
    from care_retriever.errors import InputError, at

    out = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise InputError(f"{at(path, lineno)}: invalid JSON ({exc.msg})") from exc
    return out
