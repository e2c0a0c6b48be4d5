"""Alignment data for Stage I: every query and every document, each later paired with itself.

CARE's Stage I trains the query tower to reproduce the frozen document tower on the *same* text,
for query-like and document-like texts alike (the paper used 2.8M query-side and 5.6M
document-side texts). This builder collects those texts from pair files (any format of
:mod:`care_retriever.training.pairs`) and BEIR corpora, de-duplicates them and writes
``{"text", "side": "query" | "document"}`` rows, the ``alignment`` format a recipe reads.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from care_retriever.errors import InputError
from care_retriever.training.pairs import PairSet, unique


def alignment_rows(pairsets: Iterable[PairSet], corpus_texts: Iterable[str] = ()) -> list[dict[str, str]]:
    queries: list[str] = []
    documents: list[str] = []
    for pairset in pairsets:
        queries.extend(pairset.queries())
        documents.extend(pairset.documents())
    documents.extend(corpus_texts)
    queries, documents = unique(queries), unique(documents)
    if not queries and not documents:
        raise InputError("alignment: no texts found in the inputs")
    return [{"text": t, "side": "query"} for t in queries] + [{"text": t, "side": "document"} for t in documents]


def write_rows(rows: list[dict], path: Path, *, force: bool = False) -> None:
    """Write JSONL atomically; an existing file is only replaced with ``force``."""
    if path.exists() and not force:
        raise InputError(f"{path}: exists (use --force to replace it)")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(path)
