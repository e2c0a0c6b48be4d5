"""What ``care-retriever copy`` costs: a synthetic store copied between kinds, nothing encoded.

    python -m benchmarks.copy_store                      # 100,000 x 768 FAISS source; HNSW and Qdrant legs smaller
    python -m benchmarks.copy_store --n 20000 --hnsw-n 5000 --qdrant-n 1000 --sparse

Builds a FAISS flat store of ``--n`` unit vectors (768-d, short Chinese texts) straight through the store
protocol, then times, side by side in one run: reading the whole store as the copy reads it
(``StoredIteration.iter_stored``, the capability's method built from ``iter_documents`` + ``vectors`` +
``content_hashes``), and ``copy_store`` into a FAISS flat store, a FAISS HNSW + sq8 store (a source of
``--hnsw-n`` documents: the HNSW build is FAISS's own cost), a local Qdrant store (``--qdrant-n``) and back, and
an unchanged re-run. Prints a Markdown table (documents per second).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from care_retriever.documents import Document
from care_retriever.stores import open_store
from care_retriever.stores.config import FaissIndexConfig, IndexType, Quantize
from care_retriever.stores.copying import copy_store

WORDS = ["高血压", "糖尿病", "冠心病", "肺炎", "胃炎", "偏头痛", "哮喘", "贫血", "湿疹", "痛风", "失眠", "肝炎"]


def build(spec: str, n: int, dim: int, sparse: bool, block: int = 20_000) -> None:
    rng = np.random.default_rng(0)
    store = open_store(spec)
    store.prepare(dim, "benchmark-space", "benchmark-model")
    if sparse:
        store.enable_sparse()
    for start in range(0, n, block):
        size = min(block, n - start)
        words = rng.integers(0, len(WORDS), size=(size, 6))
        docs = [
            Document(id=f"d{start + i}", text=" ".join(WORDS[w] for w in words[i]) + f" 第{start + i}例")
            for i in range(size)
        ]
        vectors = rng.standard_normal((size, dim)).astype(np.float32)
        store.upsert(docs, vectors / np.linalg.norm(vectors, axis=1, keepdims=True))
    store.finalize()
    store.close()


def timed(label: str, docs: int, rows: list[tuple[str, int, float]], run) -> None:
    start = time.perf_counter()
    run()
    seconds = time.perf_counter() - start
    rows.append((label, docs, seconds))
    print(f"{label}: {docs} docs in {seconds:.2f}s", flush=True)


def read_all(spec: str, batch: int) -> None:
    store = open_store(spec)
    try:
        for _ in store.iter_stored(batch):
            pass
    finally:
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--hnsw-n", type=int, default=20_000)
    parser.add_argument("--qdrant-n", type=int, default=10_000)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--sparse", action="store_true", help="give the source a BM25 side (rebuilt on each target)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="copy-bench-"))
    rows: list[tuple[str, int, float]] = []
    try:
        source, small, medium = (f"faiss:{root / name}" for name in ("source", "small", "medium"))
        timed(
            "build the FAISS source (protocol upserts)",
            args.n,
            rows,
            lambda: build(source, args.n, args.dim, args.sparse),
        )
        build(small, args.qdrant_n, args.dim, args.sparse)
        build(medium, args.hnsw_n, args.dim, args.sparse)
        timed("read: iter_stored (FAISS flat)", args.n, rows, lambda: read_all(source, args.batch))
        timed(
            "copy FAISS flat -> FAISS flat",
            args.n,
            rows,
            lambda: copy_store(source, f"faiss:{root / 'flat'}", batch=args.batch),
        )
        timed(
            "copy FAISS flat -> FAISS HNSW + sq8",
            args.hnsw_n,
            rows,
            lambda: copy_store(
                medium,
                f"faiss:{root / 'hnsw'}",
                index=FaissIndexConfig(index_type=IndexType.HNSW, quantize=Quantize.SQ8),
                batch=args.batch,
            ),
        )
        timed("re-run, unchanged (FAISS -> FAISS)", args.n, rows, lambda: copy_store(source, f"faiss:{root / 'flat'}"))
        timed(
            "re-run, unchanged, no verify",
            args.n,
            rows,
            lambda: copy_store(source, f"faiss:{root / 'flat'}", verify=False),
        )
        qdrant = f"qdrant:{root / 'qdrant'}"
        timed("copy FAISS -> Qdrant (qdrant:PATH)", args.qdrant_n, rows, lambda: copy_store(small, qdrant))
        timed("read: iter_stored (qdrant:PATH)", args.qdrant_n, rows, lambda: read_all(qdrant, args.batch))
        timed(
            "copy Qdrant (qdrant:PATH) -> FAISS", args.qdrant_n, rows, lambda: copy_store(qdrant, f"faiss:{root / 'b'}")
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"\n{args.dim}-d vectors, batch {args.batch}, BM25 side {'rebuilt' if args.sparse else 'none'}, verify on\n")
    print("| step | documents | seconds | documents/s |")
    print("|---|---:|---:|---:|")
    for label, docs, seconds in rows:
        print(f"| {label} | {docs:,} | {seconds:.2f} | {docs / seconds:,.0f} |")


if __name__ == "__main__":
    main()
