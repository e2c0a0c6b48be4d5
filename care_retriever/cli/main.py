"""Entry point of ``care-retriever``.

Errors caused by input (:class:`care_retriever.errors.CareError`) print one line and exit non-zero;
tracebacks are for bugs, and ``CARE_DEBUG=1`` shows them for everything.
"""

from __future__ import annotations

import importlib
import logging
import os
import sqlite3
import sys
from collections.abc import Callable
from typing import Any

import typer
import typer.main

app = typer.Typer(
    name="care-retriever",
    help="CARE: Chinese medical asymmetric retriever. Small query tower online, LLM document tower offline.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Command modules, each with ``register(app)``; kept light at import (heavy imports inside commands). Full
# names: the import-graph test reads them as this module's imports.
COMMAND_MODULES = (
    "care_retriever.cli.core",
    "care_retriever.cli.quickstart",
    "care_retriever.cli.train",
    "care_retriever.cli.data",
    "care_retriever.cli.eval",
    "care_retriever.cli.bench",
    "care_retriever.cli.serve",
    "care_retriever.cli.verify",
    "care_retriever.cli.copying",
    "care_retriever.cli.export",
    "care_retriever.cli.migrate",
)


# typer's click command (typer vendors its own click: only called here)
_COMMAND: Callable[..., Any] | None = None


def command() -> Callable[..., Any]:
    """The click command of ``app``, with every command module registered: built once per process.

    ``main`` may be called many times in one process (tests, notebooks, a program embedding the CLI), and typer
    rebuilds its command group from every registration: registering on each call would make each call slower."""
    global _COMMAND
    if _COMMAND is None:
        for module_name in COMMAND_MODULES:
            if importlib.util.find_spec(module_name) is not None:
                importlib.import_module(module_name).register(app)
        from care_retriever.cli.panels import place_options

        _COMMAND = typer.main.get_command(app)
        place_options(_COMMAND)
    return _COMMAND


def _quiet_libraries() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    logging.getLogger("care_retriever").setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    from care_retriever.errors import CareError

    _quiet_libraries()
    try:
        # standalone mode handles usage errors (exit 2 with usage) and --help itself.
        command()(args=argv, prog_name="care-retriever")
    except CareError as exc:
        if os.environ.get("CARE_DEBUG"):
            raise
        rank = os.environ.get("RANK")  # set by torchrun: say which process of the job failed
        typer.secho(f"error: {'rank ' + rank + ': ' if rank else ''}{exc}", err=True, fg="red")
        return exc.exit_code
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except (OSError, RuntimeError, sqlite3.OperationalError) as exc:
        # a file-system fault met outside a writer that names it (disk full, I/O error, permission denied,
        # read-only file system): one line naming the file, exit 2 (care_retriever.faults)
        from care_retriever.errors import WriteError
        from care_retriever.faults import reason_of

        reason = reason_of(exc)
        if reason is None or os.environ.get("CARE_DEBUG"):
            raise
        where = getattr(exc, "filename", None)
        typer.secho(f"error: {where + ': ' if where else ''}{reason}", err=True, fg="red")
        return WriteError.exit_code
    except ModuleNotFoundError as exc:
        # a torch-only command on the slim install (care_retriever.search.backends.slim): one line, no traceback
        from care_retriever.search.backends.slim import missing_full_dependency

        message = missing_full_dependency(exc, sys.argv[1:] if argv is None else argv)
        if message is None or os.environ.get("CARE_DEBUG"):
            raise
        typer.secho(f"error: {message}", err=True, fg="red")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
