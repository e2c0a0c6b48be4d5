"""How fast does a FAISS store select the rows of a date range? N docstore rows, each with an ISO 8601 ``date`` a
few seconds apart; ranges matching 50%, 5%, 0.5% and 0.05% of them, each also written as a ``NOT``. For each: the
selection a filtered search reads (:meth:`~care_retriever.stores.faiss.field_index.FieldIndexes.select`, through
the field's index and the instants it keeps) against the same condition evaluated over every row
(:func:`~care_retriever.stores.faiss.filter_sql.condition`, the path with no index), side by side in one run, with
their counts checked equal. The first filter on the field builds its index; it is timed apart, and so is the first
filter after a small write.

    python -m benchmarks.filter_dates --n 1000000    # the table, into benchmarks/results/filter_dates.md
"""

from __future__ import annotations

import argparse
import json
import shlex
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from functools import partial
from pathlib import Path

from benchmarks.core_common import machine_line
from benchmarks.marked_sections import write_marked
from care_retriever.stores.faiss import docstore, filter_sql
from care_retriever.stores.faiss.field_index import FieldIndexes
from care_retriever.stores.filters import FilterNode, parse_filters

REPO = Path(__file__).resolve().parents[1]
LOG = REPO / "benchmarks" / "results" / "filter_dates.md"
TITLE = "# Date ranges on FAISS (benchmarks/filter_dates.py)\n"
SHARES = (0.5, 0.05, 0.005, 0.0005)
START = datetime(2000, 1, 1, tzinfo=timezone.utc)
STEP = timedelta(seconds=37, microseconds=125)  # rows a few seconds apart, at microsecond precision


def build(folder: Path, n: int) -> sqlite3.Connection:
    """A docstore of ``n`` rows, each with its ``date`` and a ``dept``."""
    db = docstore.connect(folder / "docstore.sqlite")
    rows = (
        (i, f"d{i}", "t", json.dumps({"date": (START + STEP * i).isoformat(), "dept": f"科{i % 50}"}), "")
        for i in range(n)
    )
    db.executemany("INSERT INTO documents (row_id, id, text, metadata, content_hash) VALUES (?, ?, ?, ?, ?)", rows)
    db.commit()
    return db


def best_of(call: Callable[[], int], repeats: int) -> tuple[float, int]:
    """The best time of ``repeats`` calls, and what the last returned."""
    times, found = [], 0
    for _ in range(repeats):
        began = time.perf_counter()
        found = call()
        times.append(time.perf_counter() - began)
    return min(times), found


def _selected(indexes: FieldIndexes, node: FilterNode) -> int:
    return len(indexes.select(node))


def _scanned(db: sqlite3.Connection, node: FilterNode) -> int:
    sql, args = filter_sql.condition(node)
    return int(db.execute(f"SELECT count(*) FROM documents WHERE {sql}", args).fetchone()[0])


def measure(n: int, repeats: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as folder:
        db = build(Path(folder), n)
        indexes = FieldIndexes(db)
        last = START + STEP * (n - 1)
        rows = []
        for position, share in enumerate(SHARES):
            bound = (last - STEP * int(n * share - 1)).isoformat()  # the newest share of the rows
            node = parse_filters({"field": "meta.date", "operator": ">=", "value": bound})
            first = best_of(partial(_selected, indexes, node), 1)[0] if position == 0 else None
            indexed_s, indexed = best_of(partial(_selected, indexes, node), repeats)
            scan_s, scan = best_of(partial(_scanned, db, node), repeats)
            if indexed != scan:
                raise SystemExit(f"share {share}: the index selects {indexed} rows, the scan {scan}")
            row = {"n": n, "share": share, "matching": indexed, "first_filter_s": first, "index_ms": indexed_s * 1e3}
            rows.append({**row, "scan_ms": scan_s * 1e3, "speedup": scan_s / indexed_s})
            # the same rows as every row but those before the bound: a NOT, through the index or over every row
            negated = parse_filters(
                {"operator": "NOT", "conditions": [{"field": "meta.date", "operator": "<", "value": bound}]}
            )
            indexed_s, indexed = best_of(partial(_selected, indexes, negated), repeats)
            scan_s, scan = best_of(partial(_scanned, db, negated), repeats)
            if not indexed == scan == rows[-1]["matching"]:
                raise SystemExit(f"NOT, share {share}: the index selects {indexed} rows, the scan {scan}")
            rows[-1].update(not_index_ms=indexed_s * 1e3, not_scan_ms=scan_s * 1e3)
        rows[0]["after_writes"] = after_writes(db, Path(folder), indexes, node)
        db.close()
    return rows


def after_writes(db: sqlite3.Connection, folder: Path, indexes: FieldIndexes, node: FilterNode) -> list[dict]:
    """The first date range after a small write: the indexes brought up to date on the connection that filtered
    before, against all of them built again on another connection (what every write cost before they were kept
    up to date), with their counts checked equal."""
    out = []
    for what, deleted in (("10 rows added", 0), ("10 rows replaced (added, 10 others deleted)", 10)):
        top = docstore.max_row_id(db)
        new = [
            (top + 1 + i, f"w{top + 1 + i}", "t", json.dumps({"date": (START + STEP * (top + 1 + i)).isoformat()}), "")
            for i in range(10)
        ]
        db.executemany("INSERT INTO documents (row_id, id, text, metadata, content_hash) VALUES (?, ?, ?, ?, ?)", new)
        docstore.delete_rows(db, list(range(top - 1000, top - 1000 + deleted)))
        db.commit()
        kept_s, kept = best_of(partial(_selected, indexes, node), 1)
        fresh = docstore.connect(folder / "docstore.sqlite")
        rebuilt_s, rebuilt = best_of(partial(_selected, FieldIndexes(fresh), node), 1)
        fresh.close()
        if kept != rebuilt:
            raise SystemExit(f"after {what}: the kept indexes select {kept} rows, the rebuilt ones {rebuilt}")
        out.append({"what": what, "kept_ms": kept_s * 1e3, "rebuilt_s": rebuilt_s})
    return out


def table(rows: list[dict], command: str) -> str:
    lines = [
        f"Measured on {rows[0]['n']:,} docstore rows with an ISO 8601 `date` ({machine_line()}) by `{command}`.",
        "",
        f"The first date range on the field built its index and instants in {rows[0]['first_filter_s']:.2f} s.",
        "After a small write, the next range reads only what changed into the indexes; building them again on",
        "another connection, side by side, is what every write cost before:",
        "",
        "| after | indexes kept up to date, ms | built again, s |",
        "|---|---|---|",
        *(f"| {w['what']} | {w['kept_ms']:.0f} | {w['rebuilt_s']:.2f} |" for w in rows[0]["after_writes"]),
        "",
        "The same rows as `NOT` (every row but those before the bound) in the last two columns.",
        "",
        "| matching | through the field index, ms | every row scanned, ms | ratio | NOT, index ms | NOT, scan ms |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['share']:.2%} ({row['matching']:,}) | {row['index_ms']:.2f} | {row['scan_ms']:.0f} | "
            f"{row['speedup']:.0f}x | {row['not_index_ms']:.0f} | {row['not_scan_ms']:.0f} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="docstore rows")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each selection; the best is kept")
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    args = parser.parse_args()
    command = shlex.join(["python", "-m", "benchmarks.filter_dates", *sys.argv[1:]])
    text = table(measure(args.n, args.repeats), command)
    print(text)
    if not args.no_write:
        write_marked(LOG, "filter_dates", text, add=True, title=TITLE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
