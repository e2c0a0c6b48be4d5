"""Corpus input: the first stop of the data path (corpus -> document tower -> store).

Accepted: JSONL rows ``{"_id" | "id", "text", "title"?, "metadata"?}`` (a BEIR ``corpus.jsonl``
reads as is), a BEIR folder (its ``corpus.jsonl``), or plain text with one document per line (ids
are line numbers). Rows are validated as they stream, so a corpus larger than memory goes through,
and errors name the file and line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from care_retriever.documents import Document, document_text, empty_text_message, iter_jsonl
from care_retriever.errors import InputError, at

# Document, document_text and iter_jsonl live on the ground floor (care_retriever.documents) where the stores and
# the model read them too; imported here for the reader, and for code that imports them from here
# (care_retriever.old_paths lists these names with the release that drops them).
__all__ = ["Document", "corpus_file", "document_text", "iter_jsonl", "read_corpus"]


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
