"""mkdocs hook: the configuration reference rendered from the config dataclasses themselves.

A page holding the line ``::: config-reference`` gets one section per class of ``CONFIGS``: where it lives, its
summary, and a table of its fields (type, default, command-line flag, what it sets), so the page cannot drift from
the options the code declares. A field's text is its ``meta(help)`` or, without one, its comment in the source.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
import textwrap
from typing import Any

MARKER = "::: config-reference"

# (module, class, what it configures), in the order a user meets them.
CONFIGS = [
    ("care_retriever.indexing.settings", "IndexSettings", "`index` and `torchrun -m care_retriever.index`"),
    ("care_retriever.indexing.config", "CorpusConfig", "how a corpus is read (`index`)"),
    ("care_retriever.indexing.config", "EncodeConfig", "how the document tower encodes (`index`)"),
    ("care_retriever.stores.config", "FaissIndexConfig", "a FAISS store's index (`index`, `copy`, `index_options`)"),
    (
        "care_retriever.stores.config",
        "QdrantCollectionConfig",
        "a Qdrant collection (`index`, `copy`, `index_options`)",
    ),
    ("care_retriever.sparse.fusion", "FusionConfig", "hybrid search's fusion (`search --mode hybrid`, `eval`)"),
    ("care_retriever.search.service_schema", "ServiceLimits", "the HTTP service's limits (`serve`)"),
    ("care_retriever.model.config", "CareConfig", "a saved model (`care_config.json`)"),
]


def _cell(text: object) -> str:
    plain = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", str(text)).replace("``", "`")  # Sphinx roles as code
    return " ".join(plain.split()).replace("|", "\\|")


def _source_comments(cls: type) -> dict[str, str]:
    """Each field's comment in the class source: on its line, or the comment lines right above it."""
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    comments: dict[str, str] = {}
    for node in ast.parse(source).body[0].body:  # type: ignore[attr-defined]
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        trailing = re.search(r"#\s*(.*)$", lines[node.end_lineno - 1])
        above = []
        at = node.lineno - 2
        while at >= 0 and lines[at].strip().startswith("#"):
            above.insert(0, lines[at].strip().lstrip("#").strip())
            at -= 1
        text = " ".join(above) or (trailing.group(1) if trailing else "")
        comments[node.target.id] = text
    return comments


def _cli_helps() -> dict[str, str]:
    """The help of every option of every command, by flag."""
    from care_retriever.cli.main import command

    group = command()
    context = group.context_class(group, info_name="care-retriever")
    helps: dict[str, str] = {}
    for name in group.list_commands(context):
        sub = group.get_command(context, name)
        for param in getattr(sub, "params", []):
            for opt in param.opts:
                helps.setdefault(opt, getattr(param, "help", None) or "")
    return helps


def _default(f: dataclasses.Field[Any]) -> str:
    if f.default is not dataclasses.MISSING:
        return "" if f.default is None else f"`{f.default}`"
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
        return f"`{value}`" if isinstance(value, (dict, list, tuple)) else f"`{type(value).__name__}()`"
    return "required"


def _section(module: str, name: str, what: str, helps: dict[str, str]) -> list[str]:
    from care_retriever.model.settings import flag_of

    cls = getattr(importlib.import_module(module), name)
    summary = (inspect.getdoc(cls) or "").split("\n\n")[0]
    comments = _source_comments(cls)
    rows = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        cli = f.metadata.get("cli", True) and (f.metadata or flag_of(f) in helps)
        flag = flag_of(f) if cli and flag_of(f) in helps else ""
        text = f.metadata.get("help") or comments.get(f.name) or helps.get(flag, "")
        shown_type = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        shown_flag = f"`{flag}`" if flag else ""
        rows.append(f"| `{f.name}` | `{_cell(shown_type)}` | {_cell(_default(f))} | {shown_flag} | {_cell(text)} |")
    return [
        f"## `{name}`",
        "",
        f"`{module}.{name}`: {what}. {_cell(summary)}",
        "",
        "| field | type | default | flag | what it sets |",
        "|---|---|---|---|---|",
        *rows,
        "",
    ]


def render_config_reference() -> str:
    helps = _cli_helps()
    return "\n".join(line for module, name, what in CONFIGS for line in _section(module, name, what, helps))


def on_page_markdown(markdown: str, **_: Any) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, render_config_reference())
