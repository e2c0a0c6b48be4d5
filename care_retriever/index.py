"""``torchrun -m care_retriever.index ARGS`` (and ``python -m care_retriever.index ARGS``) is
``care-retriever index ARGS``: the entry torchrun starts on every rank (care_retriever.indexing.distributed).

The names this module held before the folders along the data path (``IndexSettings``, ``run_index``, ...) are
read from :mod:`care_retriever.indexing.distributed`, with a DeprecationWarning, until the release
:mod:`care_retriever.old_paths` names for them.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from typing import Any


def main(argv: list[str] | None = None) -> int:
    from care_retriever.cli.main import main as cli_main

    return cli_main(["index", *(sys.argv[1:] if argv is None else argv)])


def __getattr__(name: str) -> Any:
    from care_retriever.old_paths import removal

    moved = importlib.import_module("care_retriever.indexing.distributed")
    if not hasattr(moved, name):
        raise AttributeError(f"module 'care_retriever.index' has no attribute {name!r}")
    warnings.warn(
        f"care_retriever.index.{name} moved to care_retriever.indexing.distributed.{name}; the old path goes in "
        f"release {removal('care_retriever.index:*')}",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(moved, name)


if __name__ == "__main__":
    sys.exit(main())
