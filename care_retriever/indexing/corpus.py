"""Corpus input: the first stop of the data path (corpus -> document tower -> store).

Accepted: JSONL rows ``{"_id" | "id", "text", "title"?, "metadata"?}`` (a BEIR ``corpus.jsonl``
reads as is), a BEIR folder (its ``corpus.jsonl``), or plain text with one document per line (ids
are line numbers). Rows are validated as they stream, so a corpus larger than memory goes through,
and errors name the file and line.

Which of the two a file is (:func:`corpus_format`): the name decides when it says JSONL (``.jsonl``, ``.ndjson``,
``.json``); otherwise the content does: JSONL when the first non-blank line, after a UTF-8 byte-order mark and
spaces, starts with ``{``, plain text otherwise. A plain-text corpus whose first line starts with ``{`` is thus read
as JSONL and refused at its first line that is not a JSON object (one line, nothing indexed): text is never indexed
as the wrong format with exit 0. Such a corpus is given as JSONL (``{"id": ..., "text": ...}`` per line).
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from care_retriever.documents import (
    Document,
    decode_line,
    document_text,
    empty_text_message,
    iter_jsonl,
    metadata_json,
)
from care_retriever.errors import InputError, at
from care_retriever.model.protocols import check_unicode

# Document, document_text and iter_jsonl live on the ground floor (care_retriever.documents) where the stores and
# the model read them too; imported here for the reader.
__all__ = ["Document", "corpus_file", "corpus_format", "document_text", "iter_jsonl", "read_corpus"]

JSONL_SUFFIXES = frozenset({".jsonl", ".ndjson", ".json"})
CorpusFormat = Literal["jsonl", "text"]


def corpus_file(path: str | Path) -> Path:
    """Resolve a corpus argument: a file, or a BEIR folder holding ``corpus.jsonl``."""
    p = Path(path)
    if p.is_dir():
        candidate = p / "corpus.jsonl"
        if not candidate.is_file():
            raise InputError(f"{p}: folder has no corpus.jsonl (expected a BEIR folder or a corpus file)")
        return candidate
    if not p.is_file():
        raise InputError(f"corpus not found: {p}")
    return p


def corpus_format(path: Path) -> CorpusFormat:
    """``"jsonl"`` when the name says so, else when the first non-blank line starts with ``{`` (a UTF-8 byte-order
    mark and spaces before it skipped); ``"text"`` otherwise (the module's docstring gives the rule and why)."""
    if path.suffix.lower() in JSONL_SUFFIXES:
        return "jsonl"
    with path.open("rb") as fh:
        for raw in fh:
            line = raw.removeprefix(codecs.BOM_UTF8).strip()
            if line:
                return "jsonl" if line.startswith(b"{") else "text"
    return "text"


@dataclass
class SkippedRows:
    """The invalid rows ``read_corpus(skip_invalid=True)`` skipped: how many, and the first one's line."""

    count: int = 0
    first: str = ""

    def add(self, reason: str) -> None:
        self.count += 1
        self.first = self.first or reason


def read_corpus(
    path: str | Path, *, skip_invalid: bool = False, check_duplicates: bool = True, skipped: SkippedRows | None = None
) -> Iterator[Document]:
    """Stream validated :class:`Document` objects from ``path``.

    Empty text, missing ids, duplicate ids, undecodable bytes and text that is not Unicode (a lone surrogate)
    raise :class:`InputError` naming the line; with ``skip_invalid`` such rows are skipped instead, each counted
    in ``skipped`` (``index`` reports the count and the first).
    """
    file = corpus_file(path)
    jsonl = corpus_format(file) == "jsonl"
    # where the content chose JSONL, a line that is not JSON says why the file was read as JSONL
    why = "" if file.suffix.lower() in JSONL_SUFFIXES else " (read as JSONL: its first line starts with '{')"
    seen: set[str] = set()
    with file.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                doc = _parse_line(raw, lineno, file, jsonl, why)
                if doc is None:
                    continue
                if check_duplicates:
                    if doc.id in seen:
                        raise InputError(f"{at(file, lineno)}: duplicate document id {doc.id!r}")
                    seen.add(doc.id)
            except InputError as exc:
                if skip_invalid:
                    if skipped is not None:
                        skipped.add(str(exc))
                    continue
                raise
            yield doc


def _parse_line(raw: bytes, lineno: int, file: Path, jsonl: bool, why: str = "") -> Document | None:
    line = decode_line(raw, lineno, file)
    if not line.strip():
        return None
    if not jsonl:
        text = line.rstrip("\r\n")
        return Document(id=str(lineno), text=_check_text(text, file, lineno))
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise InputError(f"{at(file, lineno)}: invalid JSON ({exc.msg}){why}") from exc
    if not isinstance(row, dict):
        raise InputError(f"{at(file, lineno)}: expected a JSON object, got {type(row).__name__}{why}")
    doc_id = row.get("_id", row.get("id"))
    if doc_id is None or (isinstance(doc_id, str) and not doc_id.strip()):
        raise InputError(f'{at(file, lineno)}: missing document id ("_id" or "id")')
    if not isinstance(doc_id, (str, int)) or isinstance(doc_id, bool):
        raise InputError(f"{at(file, lineno)}: document id must be a string or integer")
    if "text" not in row:
        raise InputError(f'{at(file, lineno)}: missing field "text"')
    text, title, metadata = row["text"], row.get("title") or "", row.get("metadata") or {}
    if not isinstance(text, str):
        raise InputError(f'{at(file, lineno)}: "text" must be a string')
    if not isinstance(title, str):
        raise InputError(f'{at(file, lineno)}: "title" must be a string')
    if not isinstance(metadata, dict):
        raise InputError(f'{at(file, lineno)}: "metadata" must be an object')
    if not (text.strip() or title.strip()):
        raise InputError(f"{at(file, lineno)}: {empty_text_message(doc_id)}")
    # JSON escapes may spell what UTF-8 cannot hold (a lone surrogate such as \ud800), and Python's json reads NaN
    # and Infinity, which JSON has not: refused here, naming the line, before the writer sees the corpus
    try:
        for name, value in (("id", str(doc_id)), ("text", text), ("title", title)):
            check_unicode(value, f'"{name}"')
        if metadata:
            check_unicode(metadata_json(doc_id, metadata), '"metadata"')
    except InputError as exc:
        raise InputError(f"{at(file, lineno)}: {exc}") from exc
    return Document(id=str(doc_id), text=text, title=title, metadata=metadata)


def _check_text(text: str, file: Path, lineno: int) -> str:
    if not text.strip():
        raise InputError(f"{at(file, lineno)}: empty text")
    return text  # decoded from UTF-8 bytes: no lone surrogate can be in it
