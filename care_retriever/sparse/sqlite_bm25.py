"""BM25 over an inverted index kept as tables in the FAISS store's SQLite docstore.

The postings live in the same database, on the same connection, as the ``documents`` table, so a
write of both sides commits (or rolls back) in one SQLite transaction: the two sides cannot drift
apart, and a killed build leaves nothing behind but an uncommitted transaction. Writes are
incremental: adding or removing a document touches its own postings and the document frequencies
of its tokens, never the rest of the corpus.

Scores are the Lucene variant of BM25 exactly as ``bm25s`` computes them (the ``bm25`` eval
baseline), over the tokens of :mod:`care_retriever.sparse.tokenizer`::

    idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5))
    score(q, d) = sum over query tokens t (repeats count) of idf(t) * tf / (tf + k1 * (1 - b + b * |d| / avgdl))

Query time (:meth:`SqliteBM25.top`): a process's first query of a version of the index is scored in SQL
(a one-shot search pays no load); from its second query on, the postings of that version are held in
memory as arrays with the term weights precomputed (:class:`PostingsSnapshot`), much faster than SQL. Any
commit to the docstore, by this connection or another process, is a new version. An index of more than
``MEMORY_POSTINGS`` postings stays in SQL.
"""

from __future__ import annotations

import heapq
import sqlite3
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import TypeVar

import numpy as np

from care_retriever.sparse.tokenizer import tokenize

K1, B = 1.5, 0.75
MEMORY_POSTINGS = 20_000_000  # ~240 MB as arrays; a larger index is scored in SQL on every query
TABLES = ("sparse_postings", "sparse_lengths", "sparse_terms", "sparse_stats")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS sparse_postings (token TEXT NOT NULL, row_id INTEGER NOT NULL, tf INTEGER NOT NULL,
                                            PRIMARY KEY (token, row_id)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS sparse_postings_row ON sparse_postings(row_id);
CREATE TABLE IF NOT EXISTS sparse_lengths (row_id INTEGER PRIMARY KEY, length INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS sparse_terms (token TEXT PRIMARY KEY, df INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sparse_stats (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""


def corpus_stats(db: sqlite3.Connection) -> tuple[int, float]:
    """(number of documents, average document length in tokens) of the index."""
    stats = dict(db.execute("SELECT name, value FROM sparse_stats").fetchall())
    n_docs, n_tokens = stats.get("docs", 0), stats.get("tokens", 0)
    return n_docs, (n_tokens / n_docs if n_tokens else 1.0)


def idf(n_docs: int, df):
    """``ln(1 + (N - df + 0.5) / (df + 0.5))`` (a number or an array of document frequencies)."""
    return np.log(1 + (n_docs - df + 0.5) / (df + 0.5))


def term_weight(tf, length, avgdl: float, k1: float, b: float):
    """``tf / (tf + k1 * (1 - b + b * |d| / avgdl))``: a posting's share of its token's idf."""
    return tf / (tf + k1 * (1 - b + b * length / avgdl))


class SqliteBM25:
    """The sparse side of a FAISS store: postings keyed by the docstore's row ids. The caller commits."""

    def __init__(self, db: sqlite3.Connection, k1: float = K1, b: float = B) -> None:
        self.db = db
        self.k1, self.b = k1, b
        self._snapshot: PostingsSnapshot | None = None
        self._seen: tuple[int, int] | None = None  # the version the last query was scored on

    def create(self) -> None:
        for statement in _SCHEMA.split(";"):  # not executescript: it would commit the caller's transaction
            if statement.strip():
                self.db.execute(statement)

    def clear(self) -> None:
        """Drop every posting (before a rebuild: a killed earlier build may have left some committed)."""
        self.create()
        for table in TABLES:
            self.db.execute(f"DELETE FROM {table}")

    def _bump_stats(self, docs: int, tokens: int) -> None:
        self.db.executemany(
            "INSERT INTO sparse_stats(name, value) VALUES (?, ?) "
            "ON CONFLICT(name) DO UPDATE SET value = value + excluded.value",
            [("docs", docs), ("tokens", tokens)],
        )

    def add(self, row_ids: Sequence[int], texts: Sequence[str], tokens: Sequence[list[str]] | None = None) -> None:
        """Index new rows (their row ids must not be indexed yet: remove a replaced row first)."""
        tokens = tokenize(texts) if tokens is None else tokens
        postings, lengths, df = [], [], Counter[str]()
        for row_id, toks in zip(row_ids, tokens, strict=True):
            counts = Counter(toks)
            postings += [(t, int(row_id), n) for t, n in counts.items()]
            lengths.append((int(row_id), len(toks)))
            df.update(counts.keys())
        self.db.executemany("INSERT INTO sparse_postings(token, row_id, tf) VALUES (?, ?, ?)", postings)
        self.db.executemany("INSERT INTO sparse_lengths(row_id, length) VALUES (?, ?)", lengths)
        self.db.executemany(
            "INSERT INTO sparse_terms(token, df) VALUES (?, ?) ON CONFLICT(token) DO UPDATE SET df = df + excluded.df",
            list(df.items()),
        )
        self._bump_stats(len(lengths), sum(n for _, n in lengths))

    def remove(self, row_ids: Sequence[int]) -> None:
        """Forget rows (ids that were never indexed are ignored)."""
        for marks, chunk in in_chunks(list(row_ids)):
            gone = self.db.execute(
                f"SELECT COUNT(*), COALESCE(SUM(length), 0) FROM sparse_lengths WHERE row_id IN ({marks})", chunk
            ).fetchone()
            if not gone[0]:
                continue
            df = self.db.execute(
                f"SELECT token, COUNT(*) FROM sparse_postings WHERE row_id IN ({marks}) GROUP BY token", chunk
            ).fetchall()
            self.db.executemany("UPDATE sparse_terms SET df = df - ? WHERE token = ?", [(n, t) for t, n in df])
            self.db.executemany("DELETE FROM sparse_terms WHERE token = ? AND df <= 0", [(t,) for t, _ in df])
            self.db.execute(f"DELETE FROM sparse_postings WHERE row_id IN ({marks})", chunk)
            self.db.execute(f"DELETE FROM sparse_lengths WHERE row_id IN ({marks})", chunk)
            self._bump_stats(-gone[0], -gone[1])

    def size(self) -> int:
        row = self.db.execute("SELECT value FROM sparse_stats WHERE name = 'docs'").fetchone()
        return int(row[0]) if row else 0

    def _version(self) -> tuple[int, int]:
        """Changes when anything is committed: by another connection (data_version) or by this one."""
        return int(self.db.execute("PRAGMA data_version").fetchone()[0]), self.db.total_changes

    def top(self, tokens: Sequence[str], k: int, allowed: np.ndarray | None = None) -> list[tuple[int, float]]:
        """The ``k`` best (row id, score) for ``tokens``, best first, ties by row id; ``allowed``: the row ids
        a filter lets through (None: every row)."""
        version = self._version()
        if self._snapshot is None or self._snapshot.version != version:
            self._snapshot = None
            repeat, self._seen = self._seen == version, version
            n_docs, avgdl = corpus_stats(self.db)
            if not repeat or n_docs * avgdl > MEMORY_POSTINGS:  # the token count bounds the postings from above
                allowed_set = None if allowed is None else {int(r) for r in allowed}
                scores = self._scores(tokens, allowed_set, n_docs, avgdl)
                return heapq.nsmallest(k, scores.items(), key=lambda item: (-item[1], item[0]))
            self._snapshot = PostingsSnapshot(self.db, self.k1, self.b, version)
        return self._snapshot.top(tokens, k, allowed)

    def scores(self, tokens: Sequence[str], allowed: set[int] | None = None) -> dict[int, float]:
        """BM25 score of every row that holds one of ``tokens`` (and is in ``allowed``, when given)."""
        return self._scores(tokens, allowed, *corpus_stats(self.db))

    def _scores(self, tokens: Sequence[str], allowed: set[int] | None, n_docs: int, avgdl: float) -> dict[int, float]:
        if not tokens or not n_docs:
            return {}
        weights = Counter(tokens)
        dfs: dict[str, int] = {}
        for marks, chunk in in_chunks(list(weights)):
            dfs.update(self.db.execute(f"SELECT token, df FROM sparse_terms WHERE token IN ({marks})", chunk))
        if not dfs:
            return {}
        token_weight = {t: weights[t] * float(idf(n_docs, df)) for t, df in dfs.items()}
        rows = self.db.execute(
            f"SELECT p.token, p.row_id, p.tf, l.length FROM sparse_postings p JOIN sparse_lengths l USING (row_id) "
            f"WHERE p.token IN ({','.join('?' * len(dfs))})",
            list(dfs),
        ).fetchall()
        if not rows:
            return {}
        token_idf = np.fromiter((token_weight[r[0]] for r in rows), dtype=np.float64, count=len(rows))
        row_ids = np.fromiter((r[1] for r in rows), dtype=np.int64, count=len(rows))
        tf = np.fromiter((r[2] for r in rows), dtype=np.float64, count=len(rows))
        length = np.fromiter((r[3] for r in rows), dtype=np.float64, count=len(rows))
        partial = token_idf * term_weight(tf, length, avgdl, self.k1, self.b)
        unique, inverse = np.unique(row_ids, return_inverse=True)
        totals = np.bincount(inverse, weights=partial)
        out = dict(zip(unique.tolist(), totals.tolist(), strict=True))
        if allowed is not None:
            out = {r: s for r, s in out.items() if r in allowed}
        return out


class PostingsSnapshot:
    """One version of the inverted index in memory: per token a slice of row ids and of precomputed
    :func:`term_weight`, and the token's :func:`idf`."""

    def __init__(self, db: sqlite3.Connection, k1: float, b: float, version: tuple[int, int]) -> None:
        self.version = version
        n_docs, avgdl = corpus_stats(db)
        # Both reads follow the postings' primary key (token, row_id): one token's postings are contiguous.
        counts = db.execute("SELECT token, COUNT(*) FROM sparse_postings GROUP BY token ORDER BY token").fetchall()
        self.slot = {token: i for i, (token, _) in enumerate(counts)}
        df = np.fromiter((n for _, n in counts), dtype=np.int64, count=len(counts))
        self.offsets = np.concatenate([[0], np.cumsum(df)])
        self.idf = idf(n_docs, df)
        rows = db.execute(
            "SELECT p.row_id, p.tf, l.length FROM sparse_postings p JOIN sparse_lengths l USING (row_id) "
            "ORDER BY p.token, p.row_id"
        ).fetchall()
        table = np.array(rows, dtype=np.float64).reshape(-1, 3)
        self.rows = table[:, 0].astype(np.int64)
        tf, length = table[:, 1], table[:, 2]
        self.weights = term_weight(tf, length, avgdl, k1, b)

    def top(self, tokens: Sequence[str], k: int, allowed: np.ndarray | None) -> list[tuple[int, float]]:
        rows, weights = [], []
        for token, n in Counter(tokens).items():
            if (i := self.slot.get(token)) is not None:
                start, stop = self.offsets[i], self.offsets[i + 1]
                rows.append(self.rows[start:stop])
                weights.append(self.weights[start:stop] * (n * self.idf[i]))
        if not rows:
            return []
        if len(rows) == 1:
            unique, totals = rows[0], weights[0]
        else:
            unique, inverse = np.unique(np.concatenate(rows), return_inverse=True)
            totals = np.bincount(inverse, weights=np.concatenate(weights))
        if allowed is not None:
            keep = np.isin(unique, allowed)
            unique, totals = unique[keep], totals[keep]
        if len(totals) > k:  # every row scoring at least the k-th best, ties included, then an exact order
            kth = np.partition(totals, len(totals) - k)[len(totals) - k]
            keep = totals >= kth
            unique, totals = unique[keep], totals[keep]
        order = np.lexsort((unique, -totals))[:k]
        return list(zip(unique[order].tolist(), totals[order].tolist(), strict=True))


# SQL ``IN (...)`` lists over many values, in chunks SQLite accepts: SQLite caps the bound parameters of one
# statement, and a list of ids from a caller can be any length.
T = TypeVar("T")

# Under the oldest limit (999) with room for the statement's other parameters.
MAX_IN_PARAMS = 500


def in_chunks(values: Sequence[T], size: int = MAX_IN_PARAMS) -> Iterator[tuple[str, list[T]]]:
    """``(placeholders, chunk)`` for consecutive chunks of ``values``: ``("?,?,?", [a, b, c])``."""
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    for start in range(0, len(values), size):
        chunk = list(values[start : start + size])
        yield ",".join("?" * len(chunk)), chunk
