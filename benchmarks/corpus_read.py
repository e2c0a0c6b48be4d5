"""How fast each corpus format is read into validated documents, side by side with JSONL.

    python -m benchmarks.corpus_read --n 100000            # a Markdown table
    python -m benchmarks.corpus_read --n 100000 --json     # one JSON line

N synthetic documents (an id, a title on every other one, a Chinese text of about 120 characters, one metadata
field) are written once in each format to a temporary folder: JSONL, a JSON array, CSV, TSV, Parquet (row groups of
10,000), a saved Hugging Face dataset, and plain text (the texts alone, one a line). Each is then read with
:func:`care_retriever.indexing.corpus.read_corpus`, exactly as ``index`` reads it (every row validated, duplicate
ids checked), best of ``--repeat`` runs; the table gives documents per second of the reading process's CPU time
(one thread: wall time on an idle machine, and steady on a shared one) and the ratio to JSONL's.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from care_retriever.indexing.corpus import read_corpus

WORDS = [
    "高血压",
    "糖尿病",
    "冠心病",
    "饮食",
    "运动",
    "药物",
    "剂量",
    "副作用",
    "症状",
    "诊断",
    "治疗",
    "预防",
    "患者",
    "医生",
    "检查",
    "指南",
]
ROW_GROUP = 10_000


def synthetic_rows(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` documents as dicts with ``_id``, ``title``, ``text`` and ``source``."""
    rng = random.Random(seed)
    return [
        {
            "_id": f"doc{i}",
            "title": f"指南 {i}" if i % 2 else "",
            "text": "".join(rng.choice(WORDS) for _ in range(40)),
            "source": f"s{i % 7}",
        }
        for i in range(n)
    ]


def write_all(folder: Path, rows: list[dict[str, Any]]) -> dict[str, Path]:
    """``rows`` written in every format; the path of each."""
    paths: dict[str, Path] = {}
    jsonl_rows = [
        {"_id": r["_id"], "title": r["title"], "text": r["text"], "metadata": {"source": r["source"]}} for r in rows
    ]
    paths["jsonl"] = folder / "corpus.jsonl"
    with paths["jsonl"].open("w", encoding="utf-8") as fh:
        for row in jsonl_rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    paths["json"] = folder / "corpus.json"
    paths["json"].write_text(json.dumps(jsonl_rows, ensure_ascii=False, indent=1), "utf-8")
    for fmt, delimiter in (("csv", ","), ("tsv", "\t")):
        paths[fmt] = folder / f"corpus.{fmt}"
        with paths[fmt].open("w", encoding="utf-8", newline="") as fh:
            writer = csv.DictWriter(fh, list(rows[0]), delimiter=delimiter, quoting=csv.QUOTE_MINIMAL)
            writer.writeheader()
            writer.writerows(rows)
    paths["text"] = folder / "corpus.txt"
    paths["text"].write_text("".join(r["text"] + "\n" for r in rows), "utf-8")
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq

        paths["parquet"] = folder / "corpus.parquet"
        pq.write_table(pa.Table.from_pylist(rows), paths["parquet"], row_group_size=ROW_GROUP)
    except ImportError:
        pass
    try:
        import datasets

        datasets.disable_progress_bars()
        paths["hf"] = folder / "dataset"
        datasets.Dataset.from_list(rows).save_to_disk(str(paths["hf"]))
    except ImportError:
        pass
    return paths


def read_rate(path: Path, n: int, repeat: int) -> float:
    """Documents per CPU second of :func:`read_corpus` over ``path``, best of ``repeat`` reads."""
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        count = sum(1 for _ in read_corpus(path))
        best = min(best, time.process_time() - start)
        if count != n:
            raise SystemExit(f"{path}: read {count} documents, wrote {n}")
    return n / best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000, help="Documents per format.")
    parser.add_argument("--repeat", type=int, default=5, help="Reads per format; the fastest counts.")
    parser.add_argument("--json", action="store_true", help="Print one JSON line instead of the table.")
    args = parser.parse_args(argv)
    rows = synthetic_rows(args.n)
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_all(Path(tmp), rows)
        rates = {fmt: read_rate(path, args.n, args.repeat) for fmt, path in paths.items()}
    ratios = {fmt: rate / rates["jsonl"] for fmt, rate in rates.items()}
    if args.json:
        print(
            json.dumps(
                {
                    "n": args.n,
                    "docs_per_s": {k: round(v) for k, v in rates.items()},
                    "ratio_to_jsonl": {k: round(v, 3) for k, v in ratios.items()},
                }
            )
        )
        return
    print(f"| format | docs/s, CPU time (n = {args.n}) | vs JSONL |")
    print("|---|---:|---:|")
    for fmt, rate in rates.items():
        print(f"| {fmt} | {rate:,.0f} | {ratios[fmt]:.2f}x |")


if __name__ == "__main__":
    main()
