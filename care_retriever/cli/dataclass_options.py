"""Command-line options generated from config dataclasses, as tevatron's HfArgumentParser does for its arguments.

A config field becomes one option: its default is the field's, its help and flag come from the field's metadata
(:func:`care_retriever.stores.config.option`), so an option is declared once, in its config class. Fields of
several classes that share a flag (``--quantize`` sets FAISS's and Qdrant's) are one option with one help text.
Values reach the config classes as typed on the command line (an enum as its string): the class checks them, so
a bad value gets the same one-line error from the CLI as from Python.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from care_retriever.model.settings import flag_of

T = TypeVar("T")
OPTIONS = "options"  # the parameter of a decorated command that receives the generated options' values


@dataclass(frozen=True)
class CliOption:
    """One generated option and the config fields it sets."""

    flag: str
    explicit: bool  # the flag is declared (a bool field without one gets typer's --x/--no-x pair)
    annotation: Any
    default: Any
    help: str
    fields: tuple[tuple[type, str], ...]
    panel: str | None = None  # its --help panel (None: the command's default, care_retriever.cli.panels)

    @property
    def name(self) -> str:
        """The Python name of its value (``--hnsw-m``: ``hnsw_m``)."""
        return self.flag.removeprefix("--").replace("-", "_")


def cli_fields(cls: type) -> list[dataclasses.Field[Any]]:
    """The fields of ``cls`` that have a command-line option."""
    return [f for f in dataclasses.fields(cls) if f.metadata.get("cli", False)]


def _cli_type(hint: Any) -> Any:
    """The type the command line parses for a field of type ``hint``: an enum (a closed choice), a mixed type such
    as ``int | str`` and a parsed one (a store spec) are read as text, which the config class checks and converts;
    a bool is a flag (its absence: the field's default)."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    args = [a for a in typing.get_args(hint) if a is not type(None)] if union else [hint]
    optional = union and len(args) < len(typing.get_args(hint))
    base = args[0] if len(args) == 1 else str
    if base not in (str, int, float, bool, Path):
        base = str
    return base | None if optional else base


def cli_options(*classes: type) -> list[CliOption]:
    """The options of ``classes``' fields in declaration order, fields with one flag merged into one option."""
    found: dict[str, CliOption] = {}
    for cls in classes:
        hints = typing.get_type_hints(cls)
        for f in cli_fields(cls):
            flag = flag_of(f)
            default = f.default if f.default is not dataclasses.MISSING else ...
            default = default.value if isinstance(default, Enum) else default
            option = CliOption(
                flag,
                bool(f.metadata.get("flag")),
                _cli_type(hints[f.name]),
                default,
                f.metadata.get("help") or "",
                ((cls, f.name),),
                f.metadata.get("panel") or getattr(cls, "cli_panel", None),
            )
            if flag in found:
                seen = found[flag]
                if seen.default != option.default:  # one flag, one default: anything else is a declaration bug
                    raise TypeError(
                        f"{flag}: {cls.__name__}.{f.name} defaults to {default!r}, another to {seen.default!r}"
                    )
                option = dataclasses.replace(
                    seen,
                    help=seen.help or option.help,
                    fields=seen.fields + option.fields,
                    panel=seen.panel or option.panel,
                )
            found[flag] = option
    for option in found.values():
        if not option.help:
            raise TypeError(f"{option.flag}: no field declares its help text")
    return list(found.values())


def values_for(cls: type[T], values: Mapping[str, Any], **given: Any) -> T:
    """An instance of ``cls`` from generated options' ``values`` (its own fields' options), plus ``given``."""
    kwargs = {f.name: values[_name(f)] for f in cli_fields(cls) if _name(f) in values}
    return cls(**{**kwargs, **given})


def _name(f: dataclasses.Field[Any]) -> str:
    return flag_of(f).removeprefix("--").replace("-", "_")


def with_options(*classes: type) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Decorate a typer command: the options of ``classes`` are added to its own parameters (after them), and their
    values come to its ``options`` parameter as a dict by option name (see :func:`values_for`)."""

    def decorate(command: Callable[..., T]) -> Callable[..., T]:
        own = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != OPTIONS]
        generated = cli_options(*classes)
        params = [
            inspect.Parameter(
                o.name,
                inspect.Parameter.KEYWORD_ONLY,
                annotation=Annotated[
                    o.annotation, typer.Option(*([o.flag] if o.explicit else []), help=o.help, rich_help_panel=o.panel)
                ],
                default=inspect.Parameter.empty if o.default is ... else o.default,
            )
            for o in generated
        ]
        required = [p for p in params if p.default is inspect.Parameter.empty]
        optional = [p for p in params if p.default is not inspect.Parameter.empty]
        names = {p.name for p in own}

        @functools.wraps(command)
        def run(**kwargs: Any) -> T:
            mine = {k: v for k, v in kwargs.items() if k in names}
            return command(**mine, **{OPTIONS: {k: v for k, v in kwargs.items() if k not in names}})

        signature = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own]
        run.__signature__ = inspect.Signature(required + optional + signature)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in run.__signature__.parameters.values()}  # type: ignore[attr-defined]
        del run.__wrapped__  # typer reads the signature above, not the command's own
        return run

    return decorate


__all__ = ["CliOption", "cli_fields", "cli_options", "values_for", "with_options"]
