"""mkdocs hook: the CLI reference rendered from the commands themselves.

A page holding the line ``::: cli-reference`` gets one section per command (and per subcommand), in the order
``care-retriever --help`` lists them, with a table of its arguments and options read from the command objects,
so the reference cannot drift from the options the code declares.
"""

from __future__ import annotations

from typing import Any

MARKER = "::: cli-reference"


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _param_row(param: Any) -> str:
    names = ", ".join(f"`{name}`" for name in [*param.opts, *getattr(param, "secondary_opts", [])])
    default = param.default
    shown = "required" if param.required else ("" if default is None or callable(default) else f"`{default}`")
    return f"| {names} | {_cell(getattr(param, 'help', None) or '')} | {shown} |"


def _command_section(command: Any, path: str, level: int) -> list[str]:
    lines = [f"{'#' * level} `{path}`", "", _cell(command.help or command.short_help or ""), ""]
    params = [param for param in command.params if not getattr(param, "hidden", False)]
    if params:
        lines += ["| option | what it sets | default |", "|---|---|---|", *map(_param_row, params), ""]
    if hasattr(command, "list_commands"):
        context = command.context_class(command, info_name=path)
        for name in command.list_commands(context):
            sub = command.get_command(context, name)
            if sub is not None and not sub.hidden:
                lines += _command_section(sub, f"{path} {name}", level + 1)
    return lines


def render_cli_reference() -> str:
    """Markdown: one section per command with a table of its arguments and options."""
    from care_retriever.cli.main import command

    group = command()
    context = group.context_class(group, info_name="care-retriever")
    lines: list[str] = []
    for name in group.list_commands(context):
        sub = group.get_command(context, name)
        if sub is not None and not sub.hidden:
            lines += _command_section(sub, f"care-retriever {name}", 2)
    return "\n".join(lines)


def on_page_markdown(markdown: str, **_: Any) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, render_cli_reference())
