"""Section (h) of docs/benchmarks.md: small writes and opening a large FAISS store, today vs 285535d.

    nice python -m benchmarks.store_small_writes                 # 100k / 200 docs, 1M vectors; writes docs
    python -m benchmarks.store_small_writes --large 200000 --no-write   # a quick look

Both code versions run here, side by side, in fresh subprocesses: this checkout, and the code of
main 285535d (the old FAISS store, `git archive`d into a temporary folder and put first on
PYTHONPATH). Each builds its own stores with its own code (random unit vectors, short Chinese texts;
32 dims, the tiny test model's width) and times:

* a 10-document LangChain ``add_texts`` (``DeterministicFakeEmbedding``: the embedding costs ~nothing,
  so the time is the store's) into a large and a small store: median of repeated calls;
* opening the 1M-vector store and answering one query (warm page cache: each timed open follows an
  untimed one), median of repeated fresh processes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OLD_COMMIT = "285535d"
DIM = 32
DOC = REPO / "docs" / "benchmarks.md"


# ---------------------------------------------------------------------------- worker (either code version)
def _build(folder: Path, n: int) -> None:
    import numpy as np

    from care_retriever.documents import Document
    from care_retriever.stores.faiss import FaissStore

    rng = np.random.default_rng(0)
    store = FaissStore(folder)
    store.prepare(DIM, "bench" * 8, "bench")
    for start in range(0, n, 50_000):
        size = min(50_000, n - start)
        vectors = rng.normal(size=(size, DIM)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        store.upsert(
            [
                Document(id=f"d{i}", text=f"高血压患者第{i}号文档，低盐饮食，规律服药。", metadata={"g": i % 7})
                for i in range(start, start + size)
            ],
            vectors,
        )
    store.finalize()
    store.close()


def _time_writes(folder: Path, calls: int) -> list[float]:
    from langchain_core.embeddings import DeterministicFakeEmbedding

    from care_retriever.integrations.langchain.vectorstore import CareVectorStore

    store = CareVectorStore(f"faiss:{folder}", DeterministicFakeEmbedding(size=DIM))
    times = []
    for call in range(calls + 1):
        texts = [f"新文档 {call}-{j}：咳嗽发热" for j in range(10)]
        start = time.perf_counter()
        store.add_texts(texts, ids=[f"new-{call}-{j}" for j in range(10)])
        if call:  # the first call warms caches (and, for a format-1 store, converts it); not timed
            times.append(time.perf_counter() - start)
    store.close()
    return times


def _time_open(folder: Path) -> float:
    import numpy as np

    from care_retriever.stores.faiss import FaissStore

    query = np.random.default_rng(1).normal(size=(1, DIM)).astype(np.float32)
    query /= np.linalg.norm(query)
    start = time.perf_counter()
    store = FaissStore(folder)
    hits = store.search(query, 10)[0]
    elapsed = time.perf_counter() - start
    assert len(hits) == 10
    store.close()
    return elapsed


def worker(args: argparse.Namespace) -> None:
    folder = Path(args.folder)
    if args.task == "build":
        _build(folder, args.n)
        out: object = None
    elif args.task == "writes":
        out = _time_writes(folder, args.calls)
    else:
        out = _time_open(folder)
    print(json.dumps(out))


# ---------------------------------------------------------------------------- driver
def _run(version: str, old_tree: Path, *task: str) -> object:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if version == "old":
        env["PYTHONPATH"] = str(old_tree)
    # Run as a file, not with -m: -m would put the working directory (this checkout's care_retriever) on
    # sys.path ahead of PYTHONPATH's old tree. The worker imports nothing from `benchmarks`.
    proc = subprocess.run([sys.executable, __file__, "--worker", *task], env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{version} {task}: {proc.stderr.strip().splitlines()[-1]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _old_tree(tmp: Path) -> Path:
    tree = tmp / "old"
    tree.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", OLD_COMMIT, "care_retriever", "integrations"],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    # The wheel maps integrations/ to care_retriever.integrations (pyproject package-dir); mirror that.
    (tree / "care_retriever" / "integrations").symlink_to(tree / "integrations")
    return tree


def section(rows: list[tuple[str, float, float]], args: argparse.Namespace, checks: list[str]) -> str:
    lines = [
        "### (h) FAISS store: small writes and opening",
        "",
        f"Generated by `python -m benchmarks.store_small_writes`: this checkout vs the code of main {OLD_COMMIT}, each "
        f"in fresh processes building its own stores ({DIM}-dim random unit vectors). Writes: 10-document "
        f"LangChain `add_texts`, median of {2 * args.calls} calls. Open: new process, open the {args.large:,}-vector "
        f"store and answer one query, median of {args.opens} (warm page cache).",
        "",
        "| measurement | 285535d | now | now / 285535d |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {name} | {old * 1000:.1f} ms | {new * 1000:.1f} ms | {new / old:.3f}x |" for name, old, new in rows]
    lines += ["", *checks]
    return "\n".join(lines)


def write_section(text: str) -> None:
    body = DOC.read_text(encoding="utf-8") if DOC.is_file() else "# Core benchmarks\n\n"
    parts = re.split(r"(?m)^(?=### \()", body)
    kept = [p for p in parts if not p.startswith("### (h)")]
    DOC.write_text(
        "".join(p.rstrip() + "\n\n" for p in kept).rstrip() + "\n\n" + text.rstrip() + "\n", encoding="utf-8"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs="*", help=argparse.SUPPRESS)
    parser.add_argument("--big", type=int, default=100_000, help="documents in the large write store")
    parser.add_argument("--small", type=int, default=200, help="documents in the small write store")
    parser.add_argument("--large", type=int, default=1_000_000, help="vectors in the store timed for open")
    parser.add_argument("--calls", type=int, default=15)
    parser.add_argument("--opens", type=int, default=5)
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md as it is")
    args = parser.parse_args()
    if args.worker is not None:
        task, folder, *rest = args.worker
        ns = argparse.Namespace(
            task=task,
            folder=folder,
            n=int(rest[0]) if task == "build" else 0,
            calls=int(rest[0]) if task == "writes" else 0,
        )
        worker(ns)
        return 0
    with tempfile.TemporaryDirectory(prefix="care-store-bench-") as tmp_name:
        tmp = Path(tmp_name)
        old_tree = _old_tree(tmp)
        medians: dict[tuple[str, str], float] = {}
        sizes = {"big": args.big, "small": args.small, "large": args.large}
        for version in ("old", "new"):
            for label, n in sizes.items():
                print(f"{version}: building {n:,} documents ...", file=sys.stderr, flush=True)
                _run(version, old_tree, "build", str(tmp / f"{version}-{label}"), str(n))
        # Versions alternate (two rounds of writes, interleaved opens), so load from other processes
        # on a shared machine falls on both sides alike.
        samples: dict[tuple[str, str], list[float]] = {}
        for _round in range(2):
            for version in ("old", "new"):
                for label in ("big", "small"):
                    times = _run(version, old_tree, "writes", str(tmp / f"{version}-{label}"), str(args.calls))
                    samples.setdefault((version, label), []).extend(times)
        for version in ("old", "new"):
            _run(version, old_tree, "open", str(tmp / f"{version}-large"))  # warm the page cache
        for _ in range(args.opens):
            for version in ("old", "new"):
                samples.setdefault((version, "open"), []).append(
                    _run(version, old_tree, "open", str(tmp / f"{version}-large"))
                )
        medians = {key: statistics.median(values) for key, values in samples.items()}
    rows = [
        (f"add_texts(10) into {args.big:,} docs", medians[("old", "big")], medians[("new", "big")]),
        (f"add_texts(10) into {args.small:,} docs", medians[("old", "small")], medians[("new", "small")]),
        (f"open {args.large:,} vectors + 1 query", medians[("old", "open")], medians[("new", "open")]),
    ]
    write_ratio = {v: medians[(v, "big")] / medians[(v, "small")] for v in ("old", "new")}
    open_ratio = medians[("new", "open")] / medians[("old", "open")]
    checks = [
        f"- large / small write: 285535d {write_ratio['old']:.1f}x, now {write_ratio['new']:.2f}x "
        f"(target <= 2x): {'met' if write_ratio['new'] <= 2 else 'NOT met'}.",
        f"- open + query, now / 285535d: {open_ratio:.3f}x (target <= 0.1x): "
        f"{'met' if open_ratio <= 0.1 else 'NOT met'}.",
    ]
    text = section(rows, args, checks)
    print(text)
    if not args.no_write:
        write_section(text)
        print(f"wrote section (h) of {DOC}", file=sys.stderr)
    return 0 if write_ratio["new"] <= 2 and open_ratio <= 0.1 else 1


if __name__ == "__main__":
    sys.exit(main())
