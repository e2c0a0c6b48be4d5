"""What a FAISS store's checksums cost: on a bulk write, on a small in-place write, on open and in verify.

    python -m benchmarks.store_checksums --n 100000,300000      # 768 dims, flat index; prints a Markdown table
    python -m benchmarks.store_checksums --n 1000000 --json     # one JSON line per size instead

For each size, in one process: a store of N synthetic unit vectors (768 dims, as benchmarks/large_index.py)
with short Chinese texts is built through ``FaissStore`` (prepare, upserts of 50,000, finalize), then opened,
written in place (10 documents, one transaction) and verified. The time spent in the checksum code
(``care_retriever.stores.faiss.integrity``) is measured inside each operation, beside the operation's whole
time, by wrapping its functions with a timer:

* bulk write: ``seal`` (every file hashed before the publish) against ``finalize``;
* small write: ``seal`` (the docstore blocks the write changed, the delta's new blocks) against the
  transaction, median of 5 (the manifest, rewritten by every write before checksums were kept, is not counted);
* open: ``check_on_open`` + ``check_index`` (no byte hashed) against ``FaissStore(path)``, median of 5 (warm
  page cache);
* verify: ``check_files`` (every byte hashed) against ``verify``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from care_retriever.documents import Document
from care_retriever.stores.faiss import FaissStore, integrity

DIM = 768
CHUNK = 50_000
SPENT: dict[str, float] = defaultdict(float)


def _timed(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            SPENT[name] += time.perf_counter() - start

    return wrapper


for _name in ("seal", "check_on_open", "check_index", "check_files"):
    setattr(integrity, _name, _timed(_name, getattr(integrity, _name)))


def _documents(start: int, size: int) -> list[Document]:
    return [
        Document(id=f"d{i}", text=f"高血压患者第{i}号文档，低盐饮食，规律服药，定期监测血压。", metadata={"g": i % 7})
        for i in range(start, start + size)
    ]


def _vectors(rng: np.random.Generator, size: int) -> np.ndarray:
    vectors = rng.standard_normal((size, DIM), dtype=np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def _measure(folder: Path, n: int, verify: bool = True) -> dict[str, float]:
    rng = np.random.default_rng(0)
    store = FaissStore(folder)
    store.prepare(DIM, "bench" * 8, "bench")
    for start in range(0, n, CHUNK):
        size = min(CHUNK, n - start)
        store.upsert(_documents(start, size), _vectors(rng, size))
    SPENT.clear()
    start = time.perf_counter()
    store.finalize()
    row = {"bulk_s": time.perf_counter() - start, "bulk_seal_s": SPENT["seal"]}
    store.close()
    bytes_on_disk = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())

    opens, checks = [], []
    FaissStore(folder).close()  # warm the page cache
    for _ in range(5):
        SPENT.clear()
        start = time.perf_counter()
        reader = FaissStore(folder)
        opens.append(time.perf_counter() - start)
        checks.append(SPENT["check_on_open"] + SPENT["check_index"])
        reader.close()
    row.update(open_s=statistics.median(opens), open_checks_s=statistics.median(checks))

    writes, seals = [], []
    with FaissStore(folder) as writer:
        for k in range(6):
            SPENT.clear()
            start = time.perf_counter()
            with writer.transaction() as tx:
                tx.upsert(_documents(n + 10 * k, 10), _vectors(rng, 10))
            if k:  # the first write of a process reads the index whole (not a checksum cost)
                writes.append(time.perf_counter() - start)
                seals.append(SPENT["seal"])
    row.update(write_s=statistics.median(writes), write_seal_s=statistics.median(seals))

    row.update(verify_s=float("nan"), verify_hash_s=float("nan"))
    with FaissStore(folder) as checker:
        if not verify:
            return {**row, "gb": bytes_on_disk / 1e9}
        SPENT.clear()
        start = time.perf_counter()
        checker.verify()
        row.update(verify_s=time.perf_counter() - start, verify_hash_s=SPENT["check_files"])
    row["gb"] = bytes_on_disk / 1e9
    return row


def _json_fields(row: dict[str, float]) -> dict[str, float | None]:
    """The row with named units (ms for the small write and open, s for the rest); null where not measured."""
    fields = {
        "small_write_ms": row["write_s"] * 1e3,
        "small_write_checksum_ms": row["write_seal_s"] * 1e3,
        "open_ms": row["open_s"] * 1e3,
        "open_checks_ms": row["open_checks_s"] * 1e3,
        "bulk_s": row["bulk_s"],
        "bulk_checksum_s": row["bulk_seal_s"],
        "verify_s": row["verify_s"],
        "verify_hash_s": row["verify_hash_s"],
        "store_gb": row["gb"],
    }
    return {key: None if value != value else round(value, 3) for key, value in fields.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", default="100000,300000", help="Store sizes, comma-separated.")
    parser.add_argument("--no-verify", action="store_true", help="Skip verify (minutes at 1M: every norm).")
    parser.add_argument("--tmp", default=None, help="Folder for the stores (default: the system's temp folder).")
    parser.add_argument("--json", action="store_true", help="Print one JSON line per size instead of the table.")
    args = parser.parse_args()
    if not args.json:
        print(f"{DIM} dims, flat index, {time.strftime('%Y-%m-%d')}\n")
        print(
            "| vectors | store (GB) | bulk finalize (s) | its checksums (s) | open (ms) | its checks (ms) "
            "| 10-doc write (ms) | its checksums (ms) | verify (s) | its hashing (s) |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
    for n in (int(x) for x in args.n.split(",")):
        with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
            r = _measure(Path(tmp) / "store", n, verify=not args.no_verify)
        if args.json:
            print(json.dumps({"n": n, **_json_fields(r)}), flush=True)
            continue
        print(
            f"| {n:,} | {r['gb']:.2f} | {r['bulk_s']:.1f} | {r['bulk_seal_s']:.1f} | {r['open_s'] * 1e3:.1f} "
            f"| {r['open_checks_s'] * 1e3:.2f} | {r['write_s'] * 1e3:.0f} | {r['write_seal_s'] * 1e3:.0f} "
            f"| {r['verify_s']:.1f} | {r['verify_hash_s']:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
