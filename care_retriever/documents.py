"""The ground floor of the data path: a document, the text the document tower reads for it, and JSONL rows.

Every room may import this module (the stores keep :class:`Document`, the model's fingerprint folds in
:func:`document_text`, the corpus reader, the eval tasks and training read JSONL with :func:`iter_jsonl`); it imports
nothing of the package but its errors and the JSON rule (:mod:`care_retriever.strict_json`), and nothing heavy.
"""

from __future__ import annotations

import codecs
import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from care_retriever.errors import InputError, at
from care_retriever.strict_json import non_finite_field

__all__ = [
    "Document",
    "check_document_text",
    "check_metadata_keys",
    "decode_line",
    "document_text",
    "empty_text_message",
    "iter_jsonl",
    "metadata_json",
]


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


def dotted_key(metadata: object) -> str | None:
    """The first metadata key (at any depth) holding a ``.``, else None: filters name nested fields by dotted paths
    (``meta.src.kind``), the same on every engine, so a key with a dot would be a field no filter could name."""
    if isinstance(metadata, Mapping):
        for key, value in metadata.items():
            if isinstance(key, str) and "." in key:
                return key
            if (found := dotted_key(value)) is not None:
                return found
    elif isinstance(metadata, list):
        for value in metadata:
            if (found := dotted_key(value)) is not None:
                return found
    return None


def _refuse_dotted_key(doc_id: object, metadata: object) -> None:
    if (dotted := dotted_key(metadata)) is not None:
        raise InputError(
            f"document {doc_id!r}: metadata key {dotted!r} holds a '.', which filters read as a step into a nested "
            "object: rename it (e.g. with '_') or nest it"
        )


def check_metadata_keys(documents: Iterable[Document]) -> None:
    """Refuse, in one line naming the document and the key (:class:`InputError`), the first of ``documents`` whose
    metadata holds a key with a ``.`` (:func:`dotted_key`): what a store's ``upsert`` checks before it writes, as
    :func:`metadata_json` does for the writer, the corpus reader and the framework adapters."""
    for document in documents:
        _refuse_dotted_key(document.id, document.metadata)


# What metadata a document may carry: what strict JSON holds, the one rule every door applies (the corpus reader
# naming the file and line, the Python writer, the Haystack and LangChain adapters). Python's json reads and writes
# NaN and Infinity, which JSON has not: stored, they would come back in `search --json` and the service's bodies as
# tokens a strict parser refuses. Refused before anything is written, naming the field, rather than changed to null
# behind the user's back.
def metadata_json(doc_id: object, metadata: Mapping[str, Any]) -> str:
    """``metadata`` as JSON text (the form the stores keep), or one line (:class:`InputError`) naming the field that
    holds a NaN or an infinite number or a key with a dot, or saying what is not JSON at all."""
    _refuse_dotted_key(doc_id, metadata)
    try:
        return json.dumps(metadata, ensure_ascii=False, allow_nan=False)
    except ValueError as exc:
        found = non_finite_field(metadata)
        if found is None:  # not a number: a circular reference
            raise InputError(f"document {doc_id!r}: metadata is not JSON ({exc})") from exc
        field_path, number = found
        token = "NaN" if number != number else ("Infinity" if number > 0 else "-Infinity")
        raise InputError(
            f"document {doc_id!r}: metadata.{field_path} is {token}: JSON has no NaN or Infinity "
            "(write null, or the number as a string)"
        ) from exc
    except TypeError as exc:
        raise InputError(f"document {doc_id!r}: metadata is not JSON-serialisable ({exc})") from exc


@dataclass
class Document:
    """One document of a corpus: what the document tower encodes and a store keeps.

    Usage example:
    ```python
    from care_retriever import Document

    doc = Document(id="bp-1", text="高血压的一线用药包括利尿剂。", title="高血压", metadata={"dept": "心内科"})
    assert doc.embedding_text().startswith("高血压")
    print(doc.content_hash())
    ```

    :param id: the document id (a store keeps one document per id).
    :param text: the text.
    :param title: the title (the document tower reads it before the text).
    :param metadata: JSON metadata, for filters.
    """

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


# Input files are UTF-8. Editors on Windows start a UTF-8 file with a byte-order mark: it is not part of the first
# line. A UTF-16 or UTF-32 file (Notepad's "Unicode") is refused at its first line, saying which encoding it is; one
# without a byte-order mark shows NUL bytes, which no UTF-8 text line holds (JSON writes the character as \u0000).
_WIDE_BOMS = (
    (codecs.BOM_UTF32_LE, "UTF-32"),
    (codecs.BOM_UTF32_BE, "UTF-32"),
    (codecs.BOM_UTF16_LE, "UTF-16"),
    (codecs.BOM_UTF16_BE, "UTF-16"),
)


def decode_line(raw: bytes, lineno: int, path: Path) -> str:
    """Line ``lineno`` of an input file as text: UTF-8, a UTF-8 byte-order mark at the start of the file skipped;
    undecodable bytes or a NUL byte are one line naming the file and line (:class:`InputError`)."""
    if lineno == 1 and raw.startswith(codecs.BOM_UTF8):
        raw = raw[len(codecs.BOM_UTF8) :]
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        wide = next((name for bom, name in _WIDE_BOMS if lineno == 1 and raw.startswith(bom)), None)
        hint = f": the file is {wide} (it starts with a {wide} byte-order mark); save it as UTF-8" if wide else ""
        if not wide and b"\x00" in raw:
            hint = " (a UTF-16 or binary file? save it as UTF-8)"
        raise InputError(f"{at(path, lineno)}: not valid UTF-8 (byte {exc.start}){hint}") from exc
    nul = line.find("\x00")
    if nul >= 0:
        raise InputError(f"{at(path, lineno)}: NUL byte at character {nul} (a UTF-16 or binary file? save it as UTF-8)")
    return line


# Reading JSONL input files row by row, with errors that name the file and line. Corpora have their own reader
# (:mod:`care_retriever.indexing.corpus`: documents, plain text, BEIR folders); task files and training files share
# this one so a bad row reads the same wherever it is found.
def iter_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for every non-blank line; bad bytes, bad JSON or a non-object name the line."""
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            line = decode_line(raw, lineno, path)
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"{at(path, lineno)}: invalid JSON ({exc.msg})") from exc
            if not isinstance(row, dict):
                raise InputError(f"{at(path, lineno)}: expected a JSON object, got {type(row).__name__}")
            yield lineno, row
