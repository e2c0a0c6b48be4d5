"""Corpus input: the first stop of the data path (corpus -> document tower -> store).

Accepted: JSONL rows ``{"_id" | "id", "text", "title"?, "metadata"?}`` (a BEIR ``corpus.jsonl``
reads as is), a BEIR folder (its ``corpus.jsonl``), or plain text with one document per line (ids
are line numbers). Rows are validated as they stream, so a corpus larger than memory goes through,
and errors name the file and line.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from care_retriever.errors import InputError, at
from care_retriever.indexing.text_rules import empty_text_message


def document_text(title: str, text: str) -> str:
    """What the document tower reads for a document: the title on its own line above the text.

    The one definition of the tower's input: the index writer, the eval task loader, the benchmarks and
    the framework adapters all call it, and the space fingerprint folds in any change to it
    (:func:`care_retriever.model.fingerprint.space_fingerprint`), so indexes built under another rule refuse
    searches instead of silently mismatching.
    """
    return f"{title}\n{text}" if title else text


@dataclass
class Document:
    id: str
    text: str
    title: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)

    def embedding_text(self) -> str:
        """What the document tower reads (:func:`document_text`)."""
        return document_text(self.title, self.text)

    def content_hash(self) -> str:
        """Changes when anything stored about the document changes (``--update`` re-encodes those)."""
        payload = json.dumps([self.text, self.title, self.metadata], ensure_ascii=False, sort_keys=True)
        return hashlib.blake2b(payload.encode("utf-8"), digest_size=16).hexdigest()


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


def _is_jsonl(path: Path) -> bool:
    if path.suffix in {".jsonl", ".json", ".ndjson"}:
        return True
    with path.open("rb") as fh:
        for raw in fh:
            if raw.strip():
                return raw.lstrip().startswith(b"{")
    return False


def read_corpus(path: str | Path, *, skip_invalid: bool = False, check_duplicates: bool = True) -> Iterator[Document]:
    """Stream validated :class:`Document` objects from ``path``.

    Empty text, missing ids, duplicate ids and undecodable bytes raise :class:`InputError` naming the
    line; with ``skip_invalid`` such rows are skipped instead (the count is logged by the writer).
    """
    file = corpus_file(path)
    jsonl = _is_jsonl(file)
    seen: set[str] = set()
    with file.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                doc = _parse_line(raw, lineno, file, jsonl)
                if doc is None:
                    continue
                if check_duplicates:
                    if doc.id in seen:
                        raise InputError(f"{at(file, lineno)}: duplicate document id {doc.id!r}")
                    seen.add(doc.id)
            except InputError:
                if skip_invalid:
                    continue
                raise
            yield doc


def _parse_line(raw: bytes, lineno: int, file: Path, jsonl: bool) -> Document | None:
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{at(file, lineno)}: not valid UTF-8 (byte {exc.start})") from exc
    if not line.strip():
        return None
    if not jsonl:
        text = line.rstrip("\r\n")
        return Document(id=str(lineno), text=_check_text(text, file, lineno))
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise InputError(f"{at(file, lineno)}: invalid JSON ({exc.msg})") from exc
    if not isinstance(row, dict):
        raise InputError(f"{at(file, lineno)}: expected a JSON object, got {type(row).__name__}")
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
    return Document(id=str(doc_id), text=text, title=title, metadata=metadata)


def _check_text(text: str, file: Path, lineno: int) -> str:
    if not text.strip():
        raise InputError(f"{at(file, lineno)}: empty text")
    return text


# ------------------------------------------------------------------
# Reading JSONL input files row by row, with errors that name the file and line.
#
# Corpora have their own reader (``corpus.py``: documents, plain text, BEIR folders); task files and training files
# share this one so a bad row reads the same wherever it is found.
def iter_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for every non-blank line; bad bytes, bad JSON or a non-object name the line."""
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(f"{at(path, lineno)}: not valid UTF-8 (byte {exc.start})") from exc
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"{at(path, lineno)}: invalid JSON ({exc.msg})") from exc
            if not isinstance(row, dict):
                raise InputError(f"{at(path, lineno)}: expected a JSON object, got {type(row).__name__}")
            yield lineno, row
