"""Reading JSONL input files row by row, with errors that name the file and line.

Corpora have their own reader (``corpus.py``: documents, plain text, BEIR folders); task files and
training files share this one so a bad row reads the same wherever it is found.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from care_retriever.errors import InputError, at


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
