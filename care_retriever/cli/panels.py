"""The panels of a command's ``--help``: what most people need first, the rest under named panels.

An option declares its panel where it is declared: a config field in its metadata (``meta(..., panel=COMMON)``) or
its class's ``cli_panel``, a hand-written option with typer's ``rich_help_panel``. An option that declares none is
listed in the first panel when it is required or its command is short (:data:`SHORT` options or fewer), else
under "Advanced", which comes last. So ``care-retriever index --help`` opens with the handful of options a
first run needs.

Example:
    ```python
    model: Annotated[str, typer.Option(help="CARE model folder.", rich_help_panel=COMMON)]
    ```
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperOption

from care_retriever.model.settings import ADVANCED_PANEL as ADVANCED
from care_retriever.model.settings import COMMON_PANEL as COMMON
from care_retriever.model.settings import CORPUS_PANEL as CORPUS
from care_retriever.model.settings import ENCODING_PANEL as ENCODING
from care_retriever.model.settings import STORE_INDEX_PANEL as STORE_INDEX

HYBRID = "Hybrid search"  # --mode sparse|hybrid and its fusion
LIMITS = "Limits"  # the service's request and queue bounds

SHORT = 8  # a command with at most this many options lists them all in the first panel


def command_options(command: Any) -> list[TyperOption]:
    """The options of a typer click ``command`` a user gives (``--help`` aside)."""
    return [p for p in command.params if isinstance(p, TyperOption) and p.name != "help"]


def place_options(command: Any) -> None:
    """Give every option of a typer click ``command`` (and of its subcommands) that declares no panel its default
    one."""
    for sub in getattr(command, "commands", {}).values():
        place_options(sub)
    options = command_options(command)
    default = COMMON if len(options) <= SHORT else ADVANCED
    for option in options:
        if getattr(option, "rich_help_panel", None) is None:
            option.rich_help_panel = COMMON if option.required else default
    # --help lists the panels in the order their first option comes: the common one first, "Advanced" last
    rank = {COMMON: 0, ADVANCED: 2}
    command.params.sort(key=lambda p: rank.get(getattr(p, "rich_help_panel", None) or COMMON, 1))


def panels_of(command: Any) -> dict[str, list[str]]:
    """The panels of ``command``'s ``--help`` in the order it prints them, each with its options' first flags."""
    panels: dict[str, list[str]] = {COMMON: []}
    for option in command_options(command):
        panel: Any = getattr(option, "rich_help_panel", None)
        panels.setdefault(panel, []).append(option.opts[0] if option.opts else option.name or "")
    return panels


__all__ = [
    "ADVANCED",
    "COMMON",
    "CORPUS",
    "ENCODING",
    "HYBRID",
    "LIMITS",
    "SHORT",
    "STORE_INDEX",
    "command_options",
    "panels_of",
    "place_options",
]
