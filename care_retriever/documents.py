"""The ground floor of the data path: a document, the text the document tower reads for it, and JSONL rows.

Every room may import this module (the stores keep :class:`Document`, the model's fingerprint folds in
:func:`document_text`, the corpus reader, the eval tasks and training read JSONL with :func:`iter_jsonl`); it imports
nothing of the package but its errors, and nothing heavy.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from care_retriever.errors import InputError, at

__all__ = ["Document", "check_document_text", "document_text", "empty_text_message", "iter_jsonl"]


def document_text(title: str, text: str) -> str:
    """What the document tower reads for a document: the title on its own line above the text.

    The one definition of the tower's input: the index writer, the eval task loader, the benchmarks and
    the framework adapters all call it, and the space fingerprint folds in any change to it
    (:func:`care_retriever.model.fingerprint.space_fingerprint`), so indexes built under another rule refuse
    searches instead of silently mismatching.
    """
    return f"{title}\n{text}" if title else text


# What text a document must have to be stored: the one rule every door applies (the CLI's corpus reader, the Python
# writer, the Haystack and LangChain adapters), with one message. A document with neither text nor title would be
# embedded as an empty string (or, by an adapter, stored with a zero vector): it can never be found, and its vector
# says nothing. It is refused before anything is written.
def empty_text_message(doc_id: object) -> str:
    """The one line every door gives for a document without text."""
    return f"empty text for document {doc_id!r}"


def check_document_text(doc_id: object, text: str, title: str = "") -> None:
    """Refuse a document whose text and title are both empty or whitespace (one line, :class:`InputError`)."""
    if not (text.strip() or title.strip()):
        raise InputError(empty_text_message(doc_id))


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


# Reading JSONL input files row by row, with errors that name the file and line. Corpora have their own reader
# (:mod:`care_retriever.indexing.corpus`: documents, plain text, BEIR folders); task files and training files share
# this one so a bad row reads the same wherever it is found.
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
