"""Corpus input: the first stop of the data path (corpus -> document tower -> store).

Accepted, each streamed so a corpus larger than memory goes through:

- JSONL rows ``{"_id" | "id", "text", "title"?, "metadata"?}`` (a BEIR ``corpus.jsonl`` reads as is), or a BEIR
  folder (its ``corpus.jsonl``);
- a JSON array of such objects, whatever the file's name;
- CSV and TSV with a header: the columns ``_id``/``id``, ``text`` and ``title``, the rest as metadata;
- Parquet, read a row group at a time (pyarrow), and a saved Hugging Face dataset folder (``datasets``), with the
  same columns;
- plain text, one document per line (ids are line numbers): only a ``.txt`` file or ``--format text``.

:class:`~care_retriever.indexing.config.CorpusConfig` names other columns (``--id-field``, ``--text-field``,
``--title-field``) or the format. Which format a file is (:func:`corpus_format`): its content when it starts with
``{`` (JSONL) or ``[`` (a JSON array), after a UTF-8 byte-order mark and spaces; else its suffix. So text is never
indexed as the wrong format with exit 0: a file that looks like one format and is not is refused in one line naming
file:line, nothing indexed.

Example:
    ```python
    from care_retriever.indexing.config import CorpusConfig
    from care_retriever.indexing.corpus import read_corpus

    for document in read_corpus("pubmed.csv", CorpusConfig(id_field="pmid", text_field="abstract")):
        ...
    ```
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from care_retriever.documents import (
    Document,
    decode_line,
    document_text,
    empty_text_message,
    iter_jsonl,
    metadata_json,
)
from care_retriever.errors import InputError, at
from care_retriever.indexing import corpus_readers
from care_retriever.indexing.config import CorpusConfig
from care_retriever.indexing.corpus_readers import DEFAULT_COLUMNS, Columns
from care_retriever.model.text_checks import check_unicode

__all__ = [
    "Document",
    "SkippedRows",
    "corpus_file",
    "corpus_format",
    "document_text",
    "iter_jsonl",
    "read_corpus",
]

JSONL_SUFFIXES = frozenset({".jsonl", ".ndjson", ".json"})
TABLE_SUFFIXES = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".parquet": "parquet", ".pq": "parquet"}
HF_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")  # what datasets.save_to_disk writes
FORMATS_HINT = "give --format jsonl|json|csv|tsv|parquet|hf|text"


def corpus_file(path: str | Path, given: str = "auto") -> Path:
    """Resolve a corpus argument: a file, a BEIR folder (its ``corpus.jsonl``), or a saved Hugging Face dataset
    (the folder; ``given`` "hf" takes a folder as one whatever else it holds)."""
    p = Path(path)
    if p.is_dir():
        candidate = p / "corpus.jsonl"
        if given == "hf":
            return p
        if candidate.is_file():
            return candidate
        if any((p / marker).is_file() for marker in HF_MARKERS):
            return p
        raise InputError(
            f"{p}: folder has no corpus.jsonl and is no saved Hugging Face dataset "
            "(expected a BEIR folder, a dataset saved with save_to_disk, or a corpus file)"
        )
    if not p.is_file():
        raise InputError(f"corpus not found: {p}")
    return p


def corpus_format(path: Path, given: str = "auto") -> str:
    """The format of the corpus at ``path`` (a resolved :func:`corpus_file`): ``given`` unless it is ``"auto"``;
    otherwise a folder is ``"hf"``, a file starting with ``{`` ``"jsonl"``, with ``[`` ``"json"`` (a UTF-8
    byte-order mark and spaces before it skipped), else its suffix decides (``.txt``: ``"text"``)."""
    if given == "beir":
        return "jsonl"
    if given != "auto":
        return given
    if path.is_dir():
        return "hf"
    suffix = path.suffix.lower()
    if TABLE_SUFFIXES.get(suffix) == "parquet" or _starts_with(path, b"PAR1"):
        return "parquet"
    first = _first_byte(path)
    if first == b"{":
        return "jsonl"
    if first == b"[":
        return "json"
    if suffix in TABLE_SUFFIXES:
        return TABLE_SUFFIXES[suffix]
    if suffix in JSONL_SUFFIXES:
        return "jsonl"
    if suffix == ".txt" or first == b"":
        return "text"
    raise InputError(
        f"{path}: cannot tell the corpus format (not .txt, .jsonl, .json, .csv, .tsv or .parquet, and its first line "
        f"is no JSON); {FORMATS_HINT}"
    )


def _starts_with(path: Path, magic: bytes) -> bool:
    with path.open("rb") as fh:
        return fh.read(len(magic)) == magic


def _first_byte(path: Path) -> bytes:
    with path.open("rb") as fh:
        for raw in fh:
            line = raw.removeprefix(codecs.BOM_UTF8).strip()
            if line:
                return line[:1]
    return b""


@dataclass
class SkippedRows:
    """The invalid rows ``read_corpus(skip_invalid=True)`` skipped: how many, and the first one's line."""

    count: int = 0
    first: str = ""

    def add(self, reason: str) -> None:
        self.count += 1
        self.first = self.first or reason


def read_corpus(
    path: str | Path,
    config: CorpusConfig | None = None,
    *,
    skip_invalid: bool = False,
    check_duplicates: bool = True,
    skipped: SkippedRows | None = None,
) -> Iterator[Document]:
    """Stream validated :class:`Document` objects from the corpus at ``path``.

    Empty text, missing ids, duplicate ids, undecodable bytes and text that is not Unicode (a lone surrogate)
    raise :class:`InputError` naming the file and line (a table's row); with ``skip_invalid`` such rows are skipped
    instead, each counted in ``skipped`` (``index`` reports the count and the first).

    Usage example:
    ```python
    from care_retriever import read_corpus

    documents = list(read_corpus("corpus.jsonl"))
    print(len(documents), documents[0].id, documents[0].title)
    ```

    :param path: a corpus file or folder (:func:`corpus_file`).
    :param config: its format and column names (default: recognised, the JSONL field names).
    :param skip_invalid: skip an invalid row instead of stopping.
    :param check_duplicates: refuse an id seen before in the corpus.
    :param skipped: where the skipped rows are counted.
    """
    config = config or CorpusConfig()
    file = corpus_file(path, config.format)
    fmt = corpus_format(file, config.format)
    seen: set[str] = set()
    columns = _columns(config)
    rows = _lines(file, fmt == "jsonl", columns) if fmt in ("jsonl", "text") else _documents(file, fmt, columns)
    for lineno, doc in rows:
        try:
            if isinstance(doc, InputError):
                raise doc
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


def _documents(file: Path, fmt: str, columns: Columns) -> Iterator[tuple[int, Document | InputError]]:
    """Each row of a JSON array or a table ``file`` with its line, as a document or the row's error (the caller
    stops or skips it); an error of the file as a whole (not that format, a column missing) is raised."""
    if fmt == "json":
        rows: Iterator[tuple[int, Any]] = corpus_readers.json_array_rows(file)
    elif fmt in ("csv", "tsv"):
        rows = corpus_readers.delimited_rows(file, "\t" if fmt == "tsv" else ",", columns)
    elif fmt == "parquet":
        rows = corpus_readers.parquet_rows(file, columns)
    else:
        rows = corpus_readers.hf_rows(file, columns)
    table = fmt != "json"
    for lineno, row in rows:
        if isinstance(row, InputError):
            yield lineno, row
            continue
        try:
            document = document_from_row(row, columns, table=table)
        except InputError as exc:
            yield lineno, _error(file, lineno, str(exc))
            continue
        yield lineno, document


def _columns(config: CorpusConfig) -> Columns:
    return Columns(
        ids=(config.id_field,) if config.id_field else ("_id", "id"),
        text=config.text_field or "text",
        title=config.title_field or "title",
        title_given=config.title_field is not None,
    )


def _lines(file: Path, jsonl: bool, columns: Columns) -> Iterator[tuple[int, Document | InputError]]:
    # where the content chose JSONL, a line that is not JSON says why the file was read as JSONL
    why = "" if file.suffix.lower() in JSONL_SUFFIXES else " (read as JSONL: its first line starts with '{')"
    loads = json.loads
    with file.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                line = decode_line(raw, lineno, file)
            except InputError as exc:
                yield lineno, exc
                continue
            if not line.strip():
                continue
            if not jsonl:
                text = line.rstrip("\r\n")
                yield (
                    lineno,
                    Document(id=str(lineno), text=text) if text.strip() else _error(file, lineno, "empty text"),
                )
                continue
            try:
                row = loads(line)
            except json.JSONDecodeError as exc:
                yield lineno, _error(file, lineno, f"invalid JSON ({exc.msg}){why}")
                continue
            try:
                document = document_from_row(row, columns, why=why)
            except InputError as exc:
                yield lineno, _error(file, lineno, str(exc))
                continue
            yield lineno, document  # decoded from UTF-8 bytes: a plain line holds no lone surrogate


def _error(file: Path, lineno: int, message: str) -> InputError:
    return InputError(f"{at(file, lineno)}: {message}")


def document_from_row(row: Any, columns: Columns | None = None, *, table: bool = False, why: str = "") -> Document:
    """The document of one corpus row (a JSON object, or a table's row as a dict), or one line saying what is wrong
    with it (the caller adds where).

    A JSON row's metadata is its ``metadata`` object; a table row's is every column besides the id, text and title
    (empty cells left out).

    :param row: the row.
    :param columns: the names of its id, text and title fields (default: ``_id``/``id``, ``text``, ``title``).
    :param table: a table's row (its other columns are the metadata).
    :param why: said after a row that is no JSON object (why the file was read as JSON).
    """
    columns = columns or DEFAULT_COLUMNS
    if not isinstance(row, dict):
        raise InputError(f"expected a JSON object, got {type(row).__name__}{why}")
    ids = columns.ids
    doc_id = row.get(ids[0])
    if doc_id is None and len(ids) > 1:
        doc_id = row.get(ids[1])
    if doc_id is None or (isinstance(doc_id, str) and not doc_id.strip()):
        raise InputError(f"missing document id ({columns.id_names})")
    if not isinstance(doc_id, (str, int)) or isinstance(doc_id, bool):
        raise InputError("document id must be a string or integer")
    text = row.get(columns.text)
    if text is None and columns.text not in row:
        raise InputError(f'missing field "{columns.text}"')
    title = row.get(columns.title) or ""
    if table:
        own = columns.own
        metadata = {k: v for k, v in row.items() if k not in own and v is not None and v != ""}
    else:
        metadata = row.get("metadata") or {}
    if not isinstance(text, str):
        raise InputError(f'"{columns.text}" must be a string')
    if not isinstance(title, str):
        raise InputError(f'"{columns.title}" must be a string')
    if not isinstance(metadata, dict):
        raise InputError('"metadata" must be an object')
    if not (text.strip() or title.strip()):
        raise InputError(empty_text_message(doc_id))
    # JSON escapes may spell what UTF-8 cannot hold (a lone surrogate such as \ud800), and Python's json reads NaN
    # and Infinity, which JSON has not: refused here, naming the line, before the writer sees the corpus
    doc_id = str(doc_id)
    check_unicode(doc_id, '"id"')
    check_unicode(text, '"text"')
    check_unicode(title, '"title"')
    if metadata:
        check_unicode(metadata_json(doc_id, metadata), '"metadata"')
    return Document(id=doc_id, text=text, title=title, metadata=metadata)
