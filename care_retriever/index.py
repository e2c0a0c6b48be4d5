"""``torchrun -m care_retriever.index ARGS`` (and ``python -m care_retriever.index ARGS``) is
``care-retriever index ARGS``: the entry torchrun starts on every rank."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Run ``care-retriever index`` with ``argv`` (default: the process's arguments)."""
    from care_retriever.cli.main import main as cli_main

    return cli_main(["index", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
