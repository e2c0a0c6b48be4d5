"""Indexes of the metadata fields a FAISS store is filtered on, kept in its docstore connection's temp schema.

A filter evaluated over the docstore's ``metadata`` JSON reads every row. Instead, the first filter on a field
copies the field's values (one row per scalar, one per element of a stored list: row id, JSON type, value) into a
temp table indexed on (type, value); every filter on that field then reads its candidate rows from the index, and
the exact condition of :mod:`.filter_sql` decides each candidate. The candidates are a superset of the matches, so
the answer is the one a full scan gives.

Why temp tables, not indexes in the docstore: they never change the store's file, so a read-only open filters the
same way and the docstore's checksums, verify and copies are untouched. When the docstore changes (a write on
this connection, or another connection's commit, which SQLite's ``data_version`` counts), the next filter brings
them up to it by reading the rows added since and dropping the entries of rows deleted: a small write into a large
store does not cost a rebuild.

Example:
    ```python
    indexes = FieldIndexes(db)
    rows = indexes.select(parse_filters({"field": "meta.year", "operator": ">=", "value": 2020}))
    ```
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections import OrderedDict
from collections.abc import Iterator, Sized
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np

from care_retriever.stores.faiss import filter_sql
from care_retriever.stores.filters import Comparison, Constant, FilterNode, instant

MAX_FIELDS = 16  # fields indexed at once per connection; the least recently filtered one is dropped first
# rows a filter's share of the store is estimated on: a decision between plans, not a count (a few hundred
# rows read by their primary key cost a fraction of a millisecond at any store size)
SAMPLE_ROWS = 256
MIN_SAMPLED = 32  # fewer live rows among those drawn (a store mostly deleted): no estimate
MAX_ESTIMATES = 256  # filters whose estimate is kept for the docstore's version
Query = tuple[str, list[Any]]


class FieldIndexes:
    """The field indexes of one docstore connection, and the filtered selection that reads them.

    Call under the store's lock (the connection is shared).

    :param db: the docstore connection (a read-only one included).
    """

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self._tables: OrderedDict[tuple[str, ...], str] = OrderedDict()
        self._made = 0
        self._seen: tuple[int, int] | None = None
        self._unbuilt: set[tuple[str, ...]] = set()  # fields whose index could not be built on this version
        self._read_upto: tuple[int, int] | None = None  # the indexes hold the rows up to this row id (how many)
        self._sample: tuple[tuple[int, int], str, bool] | None = None  # (version drawn on, row ids as JSON, all?)
        self._estimates: dict[str, float | None] = {}  # each filter's share of the sample, while it is drawn

    def select(self, node: FilterNode) -> np.ndarray:
        """Row ids (ascending) of the documents whose metadata match ``node``, read through the field indexes
        where the tree allows it (a full scan where it does not: ``== None``, and a ``NOT`` over one)."""
        sql, args = self._query(node)
        # one string of ids parsed in C: a tuple a row costs more than the query at large selections
        (joined,) = self.db.execute(f"SELECT group_concat(row_id) FROM ({sql})", args).fetchone()
        if not joined:
            return np.zeros(0, dtype=np.int64)
        rows = np.sort(np.fromstring(joined, dtype=np.int64, sep=","))
        return rows[np.concatenate(([True], rows[1:] != rows[:-1]))]  # a list may match by two elements

    def fraction(self, node: FilterNode) -> float | None:
        """The share of the stored rows ``node`` lets through, estimated on a fixed random sample of them (every
        row of a store whose row ids stay below twice :data:`SAMPLE_ROWS`), drawn again when the docstore changes;
        None inside an open transaction or where too few sampled rows are live."""
        if self.db.in_transaction:
            return None
        version = self._version()
        if self._sample is None or self._sample[0] != version:
            self._sample = (version, *self._draw_sample())
            self._estimates.clear()
        key = repr(node)  # not the node itself: True == 1 as a key, but a filter tells the two apart
        if key not in self._estimates:
            if len(self._estimates) >= MAX_ESTIMATES:
                self._estimates.clear()
            sql, args = filter_sql.condition(node)
            live, matching = self.db.execute(
                f"SELECT count(*), total({sql}) FROM documents WHERE row_id IN (SELECT value FROM json_each(?))",
                [*args, self._sample[1]],
            ).fetchone()
            every_row = self._sample[2]
            self._estimates[key] = None if live < (1 if every_row else MIN_SAMPLED) else float(matching) / live
        return self._estimates[key]

    def _draw_sample(self) -> tuple[str, bool]:
        """Row ids to estimate on, as a JSON list, and whether they are every row: all of a small store's, else
        :data:`SAMPLE_ROWS` drawn at random (a fixed seed: the same filter gets the same plan) from 0 to the
        largest row id."""
        (top,) = self.db.execute("SELECT max(row_id) FROM documents").fetchone()
        if top is None:
            return "[]", True
        if top < 2 * SAMPLE_ROWS:
            return json.dumps(list(range(top + 1))), True
        picks = np.unique(np.random.default_rng(0).integers(0, top + 1, SAMPLE_ROWS))
        return json.dumps(picks.tolist()), False

    def matching(self, node: FilterNode, rows: np.ndarray) -> np.ndarray:
        """The ``rows`` (row ids) that ``node`` lets through, ascending: each read by its primary key, so the cost
        grows with ``rows``, not with the store or the filter's matches."""
        if not len(rows):
            return np.zeros(0, dtype=np.int64)
        sql, args = filter_sql.condition(node)
        (joined,) = self.db.execute(
            f"SELECT group_concat(row_id) FROM documents WHERE row_id IN (SELECT value FROM json_each(?)) AND ({sql})",
            [json.dumps(np.unique(rows).tolist()), *args],
        ).fetchone()
        return np.sort(np.fromstring(joined, dtype=np.int64, sep=",")) if joined else np.zeros(0, dtype=np.int64)

    def plan(self, node: FilterNode) -> list[str]:
        """SQLite's query plan of :meth:`select` for ``node`` (the detail column, one line per step)."""
        sql, args = self._query(node)
        return [row[3] for row in self.db.execute(f"EXPLAIN QUERY PLAN {sql}", args)]

    def _query(self, node: FilterNode) -> Query:
        """The SELECT of the matching row ids: the index alone where its candidates are the matches, the exact
        condition over the candidates where they are a superset, the exact condition over all rows otherwise."""
        narrowed = self._candidates(node) if self._usable() else None
        if narrowed is not None and narrowed.exact:
            return narrowed.sql, narrowed.args
        sql, args = filter_sql.condition(node)
        if narrowed is not None:
            sql, args = f"row_id IN ({narrowed.sql}) AND ({sql})", [*narrowed.args, *args]
        return f"SELECT row_id FROM documents WHERE {sql}", args

    @property
    def fields(self) -> list[tuple[str, ...]]:
        """The field paths indexed now, least recently filtered first."""
        return list(self._tables)

    def _usable(self) -> bool:
        """Whether the indexes may be read (brought up to the docstore first if it changed since they were last
        read). Never inside an open transaction: its rows are not committed, and refreshing would commit it."""
        if self.db.in_transaction:
            return False
        if self._seen is not None and self._seen != self._version():
            self._refresh()
        return True

    def _version(self) -> tuple[int, int]:
        (data_version,) = self.db.execute("PRAGMA data_version").fetchone()
        return int(data_version), self.db.total_changes

    def _refresh(self) -> None:
        """Bring every index up to the docstore as it is now, reading only what changed. A docstore row is added
        (its row id above all before it) or deleted, never changed in place, so the rows past the last row id
        read are the new ones, and the count of the rows up to it tells whether any were deleted."""
        self._unbuilt.clear()
        if self._read_upto is None or not self._tables:
            self._drop_all()
            return
        last, kept = self._read_upto
        foreign = False
        try:
            with self._temp_writes():
                (total,) = self.db.execute("SELECT count(*) FROM documents").fetchone()
                (added,) = self.db.execute("SELECT count(*) FROM documents WHERE row_id > ?", [last]).fetchone()
                foreign = total - added > kept  # a row under a row id already read: not written by this store
                for path, table in [] if foreign else self._tables.items():
                    if total - added < kept:  # rows were deleted: their entries go
                        self.db.execute(
                            f"DELETE FROM temp.{table} WHERE NOT EXISTS "
                            f"(SELECT 1 FROM main.documents AS d WHERE d.row_id = temp.{table}.row_id)"
                        )
                    if added:
                        self.db.execute(*self._fill(table, path, above=last))
                (top,) = self.db.execute("SELECT max(row_id) FROM documents").fetchone()
                self._read_upto = (last if top is None else max(last, int(top)), total)
        except sqlite3.OperationalError:
            foreign = True
        if foreign:
            self._drop_all()

    def _now(self) -> tuple[int, int]:
        """(the highest row id, the number of rows) of the docstore; (-1, 0) when it is empty."""
        top, rows = self.db.execute("SELECT max(row_id), count(*) FROM documents").fetchone()
        return (-1 if top is None else int(top)), int(rows)

    def _fill(self, table: str, path: tuple[str, ...], *, above: int = -1, upto: int | None = None) -> Query:
        """The INSERT of the field's entries of the rows in (``above``, ``upto``] into ``table``: a scalar field is
        one entry (key NULL), a list one per element (key its index); an object's members (key their name) match
        no comparison of the field and are left out. A table that keeps instants (:meth:`_instants`) gets those
        of the new entries too."""
        instant = "NULL"
        if self._keeps_instants(table):
            date = f"e.type = 'text' AND e.value GLOB '{filter_sql.DATE_PREFIX}'"
            instant = f"CASE WHEN {date} THEN {filter_sql.INSTANT}(e.value) END"
        bound, args = ("", []) if upto is None else (" AND d.row_id <= ?", [upto])
        return (
            f"INSERT INTO temp.{table} SELECT d.row_id, e.type, e.value, {instant} FROM documents AS d, "
            f"json_each(d.metadata, ?) AS e WHERE typeof(e.key) != 'text' AND d.row_id > ?{bound}",
            [filter_sql.json_path(path), above, *args],
        )

    def _table(self, path: tuple[str, ...]) -> str | None:
        """The temp table indexing ``path``, built on first use; None where SQLite refused to build it (the
        filter then reads every row, as it would without the index)."""
        if path in self._tables:
            self._tables.move_to_end(path)
            return self._tables[path]
        if path in self._unbuilt:
            return None
        if len(self._tables) >= MAX_FIELDS:
            _, oldest = self._tables.popitem(last=False)
            with self._temp_writes():
                self.db.execute(f"DROP TABLE IF EXISTS temp.{oldest}")
        name = f"care_field_{self._made}"
        self._made += 1
        try:
            with self._temp_writes():
                self.db.execute(
                    f"CREATE TEMP TABLE {name} (row_id INTEGER NOT NULL, type TEXT NOT NULL, value, instant INTEGER)"
                )
                # the rows the other indexes hold (they are refreshed together), or all of them for the first
                upto = None if self._read_upto is None else self._read_upto[0]
                self.db.execute(*self._fill(name, path, upto=upto))
                self.db.execute(f"CREATE INDEX temp.{name}_type_value ON {name} (type, value)")
                if self._read_upto is None:
                    self._read_upto = self._now()
        except sqlite3.OperationalError:
            self._unbuilt.add(path)
            return None
        self._tables[path] = name
        return name

    def _keeps_instants(self, table: str) -> bool:
        index = f"{table}_instant"
        return bool(self.db.execute("SELECT 1 FROM sqlite_temp_master WHERE name = ?", [index]).fetchone())

    def _instants(self, table: str) -> bool:
        """Whether ``table`` keeps the instant of each of its dates (indexed), read now on the field's first date
        range, so that a field filtered only by equality never parses its dates; False where SQLite refused (the
        range then reads every row)."""
        if self._keeps_instants(table):
            return True
        try:
            with self._temp_writes():
                self.db.execute(
                    f"UPDATE temp.{table} SET instant = {filter_sql.INSTANT}(value) "
                    f"WHERE type = 'text' AND value GLOB '{filter_sql.DATE_PREFIX}'"
                )
                self.db.execute(f"CREATE INDEX temp.{table}_instant ON {table} (instant) WHERE instant IS NOT NULL")
        except sqlite3.OperationalError:
            return False
        return True

    @contextlib.contextmanager
    def _temp_writes(self) -> Iterator[None]:
        """One transaction that writes the temp schema only, and reads the docstore as it is at one moment (the
        version the indexes are then up to); a reader's connection (query_only) allows it for the while, since the
        store's file is not written. Rolled back whole on an error."""
        (query_only,) = self.db.execute("PRAGMA query_only").fetchone()
        self.db.execute("PRAGMA query_only=0")
        data_version = None
        try:
            self.db.execute("BEGIN")
            self.db.execute("SELECT 1 FROM documents LIMIT 1").fetchall()  # the moment the docstore is read at
            (data_version,) = self.db.execute("PRAGMA data_version").fetchone()
            try:
                yield
            except BaseException:
                self.db.rollback()
                raise
            self.db.commit()
        finally:
            self.db.execute(f"PRAGMA query_only={int(query_only)}")
            if data_version is not None:  # also after a refused build: the next change lets it try again
                self._seen = (int(data_version), self.db.total_changes)

    def _drop_all(self) -> None:
        with self._temp_writes():
            for name in self._tables.values():
                self.db.execute(f"DROP TABLE IF EXISTS temp.{name}")
        self._tables.clear()
        self._unbuilt.clear()
        self._read_upto = None
        self._seen = None

    def _candidates(self, node: FilterNode) -> Candidates | None:
        """The rows ``node`` may match, read from the indexes, or None where the tree gives no narrower set
        than all rows."""
        if isinstance(node, Constant):
            return None if node.matches else Candidates("SELECT NULL WHERE 0", [], exact=True)
        if isinstance(node, Comparison):
            return self._comparison(node)
        parts = [self._candidates(child) for child in node.conditions]
        if node.operator == "NOT":  # not all of them: every row but those the conditions exactly select
            exact = [p for p in parts if p is not None and p.exact]
            if not parts or len(exact) < len(parts):
                return None  # all rows but a superset of the matches would lose rows that match
            return Candidates(
                "SELECT row_id FROM documents WHERE row_id NOT IN "
                f"({' INTERSECT '.join(f'SELECT * FROM ({p.sql})' for p in exact)})",
                [a for p in exact for a in p.args],
                exact=True,
            )
        known = [p for p in parts if p is not None]
        if not known or (node.operator == "OR" and len(known) < len(parts)):
            return None
        joint = " INTERSECT " if node.operator == "AND" else " UNION "
        return Candidates(
            joint.join(f"SELECT * FROM ({c.sql})" for c in known),
            [a for c in known for a in c.args],
            exact=len(known) == len(parts) and all(c.exact for c in known),
        )

    def _comparison(self, node: Comparison) -> Candidates | None:
        """The rows whose field (or an element of its list) compares as ``node`` asks: exactly the matches, since
        the table holds a scalar field's value and a list's elements (objects and their members are left out)."""
        values = list(node.value) if node.operator == "in" else [node.value]
        if any(v is None for v in values):
            return None  # a missing field matches (== None): no row of the index stands for it
        table = self._table(node.path)
        if table is None:
            return None
        if isinstance(node.value, datetime):  # a date in range, but not in a list that holds a number
            if not self._instants(table):
                return None
            sql = (
                f"SELECT row_id FROM temp.{table} WHERE instant {node.operator} ? EXCEPT "
                f"SELECT row_id FROM temp.{table} WHERE type IN ('integer', 'real')"
            )
            return Candidates(sql, [instant(node.value)], exact=True)
        if node.operator in (">", ">=", "<", "<="):
            sql = f"SELECT row_id FROM temp.{table} WHERE type IN ('integer', 'real') AND value {node.operator} ?"
            return Candidates(sql, [node.value], exact=True)
        parts: list[Query] = []
        strings = [v for v in values if isinstance(v, str)]
        numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        flags = sorted({"true" if v else "false" for v in values if isinstance(v, bool)})
        if strings:
            parts.append((f"type = 'text' AND value IN ({_marks(strings)})", list(strings)))
        if numbers:
            parts.append((f"type IN ('integer', 'real') AND value IN ({_marks(numbers)})", list(numbers)))
        if flags:
            parts.append((f"type IN ({_marks(flags)})", list(flags)))
        return Candidates(
            " UNION ".join(f"SELECT row_id FROM temp.{table} WHERE {sql}" for sql, _ in parts),
            [a for _, args in parts for a in args],
            exact=True,
        )


@dataclass(frozen=True)
class Candidates:
    """A SELECT of row ids from the field indexes, its arguments, and whether its rows are exactly the matches
    (else a superset that the exact condition narrows)."""

    sql: str
    args: list[Any]
    exact: bool


def _marks(values: Sized) -> str:
    return ",".join("?" * len(values))
