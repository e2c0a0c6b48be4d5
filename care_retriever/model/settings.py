"""The small helpers every typed config is written with: a field's command-line option (:func:`meta`,
:func:`flag_of`), a closed choice (:class:`Choice`, :func:`choice`) and the one-line checks of counts and ratios.

On the ground floor beside the batch defaults (:mod:`care_retriever.model.batch_limits`): the encoding config, the
store configs and the CLI read them; torch-free, it imports nothing of the package but its errors.
"""

from __future__ import annotations

import dataclasses
from enum import Enum
from typing import Any, TypeVar

from care_retriever.errors import InputError

E = TypeVar("E", bound=Enum)


# The panels of a command's --help (care_retriever.cli.panels): a config field or class names one of these.
COMMON_PANEL = "Options"  # typer's first panel: what most runs need
ADVANCED_PANEL = "Advanced"
CORPUS_PANEL = "Corpus"
ENCODING_PANEL = "Encoding"
STORE_INDEX_PANEL = "Store index"


def meta(
    help: str | None = None, *, flag: str | None = None, cli: bool = True, panel: str | None = None
) -> dict[str, Any]:
    """A config field's command-line option, as its ``metadata``: ``help`` (None: the help of another field with
    the same flag), ``flag`` (default: ``--`` and the field's name with dashes), ``cli=False`` for a setting with no
    flag (given through an integration's dict only), ``panel`` the ``--help`` panel it is listed in (None: its
    class's ``cli_panel``, else the command's "Advanced" panel; :mod:`care_retriever.cli.panels`)."""
    return {"help": help, "flag": flag, "cli": cli, "panel": panel}


class Choice(str, Enum):
    """A closed choice: compares equal to its value and prints as it (``f"{IndexType.FLAT}"`` is ``flat``)."""

    def __str__(self) -> str:
        return str(self.value)


def choice(kind: type[E], value: Any, what: str) -> E:
    """``value`` (a member or its string) as a member of ``kind``, or one line naming the valid values."""
    try:
        return kind(value)
    except (ValueError, TypeError):
        raise InputError(f"Unknown {what} {value!r}. Available: {[m.value for m in kind]}") from None


def count(value: Any, what: str) -> int:
    """An integer >= 1 (a bool is not one), or one line."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{what} must be an integer >= 1, got {value!r}")
    return value


def ratio(value: Any, what: str) -> float:
    """A number >= 1 as a float (oversampling), or one line."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 1:
        raise InputError(f"{what} must be a number >= 1, got {value!r}")
    return float(value)


def flag_of(f: dataclasses.Field[Any]) -> str:
    """The command-line flag of a config field."""
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")
