"""Row readers of the corpus formats besides JSONL and plain text: JSON arrays, CSV/TSV, Parquet, saved Hugging
Face datasets. Each streams ``(line, row)`` pairs (a table's row numbered from 1), a row as a dict of its fields or
the :class:`InputError` of that row; an error of the whole file (not that format, a column missing) is raised.
:func:`care_retriever.indexing.corpus.read_corpus` turns the rows into documents.

Example:
    ```python
    for line, row in delimited_rows(Path("notes.csv"), ",", Columns()):
        ...
    ```
"""

from __future__ import annotations

import csv
import json
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from care_retriever.errors import InputError, at

CHUNK_CHARS = 1 << 20  # a JSON array is read this many characters at a time
BATCH_ROWS = 4096  # Parquet and dataset rows converted to Python at a time
CORPUS_EXTRA = "pip install 'care-retriever[corpus]'"
_SPACE = re.compile(r"\s*")
_COMMA = re.compile(r"\s*,\s*")

Row = tuple[int, "dict[str, Any] | InputError"]


@dataclass(frozen=True)
class Columns:
    """The columns a table must have: one of ``ids`` and ``text``; ``title`` when ``title_given``.

    :param ids: the id column's names, the first found is used.
    :param text: the text column's name.
    :param title: the title column's name.
    :param title_given: the title column was named (``--title-field``), so it must exist.
    """

    ids: Sequence[str] = ("_id", "id")
    text: str = "text"
    title: str = "title"
    title_given: bool = False
    own: frozenset[str] = field(init=False)  # the columns that are no metadata
    id_names: str = field(init=False)  # the id columns as an error line names them

    def __post_init__(self) -> None:
        object.__setattr__(self, "own", frozenset({*self.ids, self.text, self.title}))
        object.__setattr__(self, "id_names", " or ".join(f'"{n}"' for n in self.ids))

    def check(self, where: str, names: Sequence[str]) -> None:
        """One line naming ``where`` when ``names`` (a table's columns) lacks the id or text column."""
        have = ", ".join(names)
        if not any(name in names for name in self.ids):
            flag = "--id-field" if len(self.ids) > 1 else f"--id-field {self.ids[0]}"
            raise InputError(f"{where}: no id column {self.id_names} (columns: {have}); name it with {flag}")
        if self.text not in names:
            raise InputError(f'{where}: no text column "{self.text}" (columns: {have}); name it with --text-field')
        if self.title_given and self.title not in names:
            raise InputError(f'{where}: no title column "{self.title}" (columns: {have})')
        duplicated = sorted({n for n in names if list(names).count(n) > 1})
        if duplicated:
            raise InputError(f"{where}: the header names {', '.join(duplicated)} twice")


DEFAULT_COLUMNS = Columns()


def json_array_rows(file: Path) -> Iterator[Row]:
    """The elements of the JSON array in ``file``, each with the line it starts on, read a chunk at a time."""
    # the C scanner json.loads runs: (value, end) of the value at an index
    scan = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
    with file.open("r", encoding="utf-8-sig") as fh:
        buf, pos, line, eof = "", 0, 1, False

        def more() -> bool:
            nonlocal buf, pos, eof
            try:
                chunk = fh.read(CHUNK_CHARS)
            except UnicodeDecodeError as exc:
                raise InputError(f"{file}: not valid UTF-8 (near line {line})") from exc
            if pos > CHUNK_CHARS:  # keep the buffer near one chunk: what was read is dropped
                buf, pos = buf[pos:], 0
            buf += chunk
            eof = not chunk
            return bool(chunk)

        def skip_space() -> str:
            """The next character after spaces (reading on as needed), "" at the end of the file."""
            nonlocal pos, line
            while True:
                end = _SPACE.match(buf, pos).end()  # type: ignore[union-attr]
                line += buf.count("\n", pos, end)
                pos = end
                if pos < len(buf):
                    return buf[pos]
                if not more():
                    return ""

        if skip_space() != "[":
            raise InputError(f"{at(file, line)}: expected a JSON array ('[')")
        pos += 1
        after_element, first, at_value = False, True, False
        while True:
            char = "" if at_value else skip_space()
            if after_element:
                if char == "]":
                    pos += 1
                    break
                if char != ",":
                    raise InputError(f"{at(file, line)}: invalid JSON (expected ',' or ']' after an element)")
                pos, after_element = pos + 1, False
                continue
            if char == "]" and first and not at_value:
                pos += 1
                break
            while True:
                try:
                    value, end = scan(buf, pos)
                    if end < len(buf) or eof:
                        break
                except StopIteration as stop:  # the C scanner's "no value starts here"
                    if eof:
                        where = at(file, line + buf.count("\n", pos, stop.value))
                        raise InputError(f"{where}: invalid JSON (Expecting value)") from None
                except json.JSONDecodeError as exc:
                    if eof:
                        where = at(file, line + buf.count("\n", pos, exc.pos))
                        raise InputError(f"{where}: invalid JSON ({exc.msg})") from exc
                more()  # a value may run past the buffer: decoded again once more is read
            yield line, value
            # the common case, a comma and the next element in the buffer, without a call per step
            comma = _COMMA.match(buf, end)
            at_value = comma is not None and comma.end() < len(buf)
            following = comma.end() if at_value else end  # type: ignore[union-attr]
            line += buf.count("\n", pos, following)
            pos, first, after_element = following, False, not at_value
        if skip_space():
            raise InputError(f"{at(file, line)}: text after the JSON array's closing ']'")


def delimited_rows(file: Path, delimiter: str, columns: Columns) -> Iterator[Row]:
    """The rows of a CSV (``delimiter`` ",", quoted fields as Excel writes them) or TSV file (tabs, no quoting)
    with a header, each with the line it starts on."""
    csv.field_size_limit(sys.maxsize if sys.maxsize < 2**63 else 2**31 - 1)  # long documents fit in one field
    quoting: Literal[0, 3] = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
    with file.open("r", encoding="utf-8-sig", newline="") as fh:
        reader = csv.reader(fh, delimiter=delimiter, quoting=quoting, strict=True)
        try:
            header = next(reader, None)
            if header is None:
                return
            columns.check(at(file, 1), header)
            start = reader.line_num + 1
            for row in reader:
                line, start = start, reader.line_num + 1
                if not row:  # a blank line
                    continue
                if len(row) != len(header):
                    yield line, InputError(f"{at(file, line)}: {len(row)} fields, the header has {len(header)}")
                    continue
                yield line, dict(zip(header, row, strict=True))
        except csv.Error as exc:
            raise InputError(f"{at(file, reader.line_num)}: not valid {_kind(delimiter)} ({exc})") from exc
        except UnicodeDecodeError as exc:
            raise InputError(f"{file}: not valid UTF-8 (after line {reader.line_num})") from exc


def _kind(delimiter: str) -> str:
    return "TSV" if delimiter == "\t" else "CSV"


def parquet_rows(file: Path, columns: Columns) -> Iterator[Row]:
    """The rows of a Parquet file, numbered from 1, read a batch of a row group at a time (never the whole file)."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise InputError(f"{file}: reading Parquet needs pyarrow: {CORPUS_EXTRA}") from None
    try:
        parquet = pq.ParquetFile(file)
    except (pa.ArrowException, OSError) as exc:
        raise InputError(f"{file}: not a Parquet file ({str(exc).splitlines()[0]})") from exc
    with parquet:
        columns.check(at(file), parquet.schema_arrow.names)
        yield from _batches(
            {n: b.column(i).to_pylist() for i, n in enumerate(b.schema.names)}
            for b in parquet.iter_batches(batch_size=BATCH_ROWS)
        )


def hf_rows(folder: Path, columns: Columns) -> Iterator[Row]:
    """The rows of a dataset saved with ``datasets``' ``save_to_disk`` (memory-mapped Arrow), numbered from 1, a
    batch at a time."""
    try:
        import datasets
    except ImportError:
        raise InputError(f"{folder}: reading a Hugging Face dataset needs datasets: {CORPUS_EXTRA}") from None
    try:
        dataset = datasets.load_from_disk(str(folder))
    except (FileNotFoundError, ValueError, OSError) as exc:
        raise InputError(f"{folder}: not a saved Hugging Face dataset ({str(exc).splitlines()[0]})") from exc
    if isinstance(dataset, datasets.DatasetDict):
        splits = list(dataset)
        if len(splits) != 1:
            raise InputError(f"{folder}: the dataset has splits {', '.join(splits)}; give one's folder ({folder}/NAME)")
        dataset = dataset[splits[0]]
    columns.check(at(folder), dataset.column_names)
    yield from _batches(dataset.iter(batch_size=BATCH_ROWS))


def _batches(batches: Iterator[dict[str, list[Any]]]) -> Iterator[Row]:
    """Rows of column batches (each a dict of equal-length lists), numbered from 1 across the batches."""
    row = 0
    for batch in batches:
        names = list(batch)
        for values in zip(*batch.values(), strict=True):
            row += 1
            yield row, dict(zip(names, values, strict=True))
