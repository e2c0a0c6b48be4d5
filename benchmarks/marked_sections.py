"""The sections a benchmark writes into a markdown log between ``<!-- name:begin -->`` (or ``:start``) and
``<!-- name:end -->``: :func:`write_marked` replaces one, :func:`marked` reads it back (the results page does).

    write_marked(Path("docs/benchmarks.md"), "query_backends", table)
    marked(Path("docs/benchmarks.md"), "query_backends")  # the table, as written
"""

from __future__ import annotations

import re
from pathlib import Path


def _section(name: str) -> re.Pattern[str]:
    """A section named ``name``: its begin marker (group 1), its text (group 2) and its end marker."""
    marker = re.escape(name)
    return re.compile(rf"(<!-- {marker}:(?:begin|start) -->)\n?(.*?)<!-- {marker}:end -->", re.S)


def marked(path: Path, name: str) -> str:
    """The text a benchmark wrote between ``<!-- name:begin -->`` (or ``:start``) and ``<!-- name:end -->``."""
    found = _section(name).search(path.read_text("utf-8"))
    if found is None:
        raise SystemExit(f"{path}: no section marked {name!r}")
    return found.group(2)


def write_marked(path: Path, name: str, text: str, *, add: bool = False, after: str = "", title: str = "") -> None:
    """Replace the text of section ``name`` of the markdown file ``path`` with ``text``, keeping its markers.

    Example:
        write_marked(Path("benchmarks/results/scale.md"), "store_scale", table)

    Args:
        path: the markdown file.
        name: the section's name, as its markers spell it (``gpu_index:cuda`` for ``<!-- gpu_index:cuda:begin -->``).
        text: what the section holds (its trailing whitespace dropped).
        add: where the file or the section is missing, add it (``<!-- name:begin -->``) instead of refusing.
        after: with ``add``, a section to add it right after where that one is present (else at the file's end).
        title: with ``add``, what a new file starts with.
    """
    if path.is_file():
        current = path.read_text(encoding="utf-8")
    elif add:
        current = title
    else:
        raise SystemExit(f"{path}: no such file to write the section marked {name!r} into")
    pattern = _section(name)
    found = pattern.search(current)
    if found is not None:
        block = f"{found.group(1)}\n{text.rstrip()}\n<!-- {name}:end -->"
        updated = current[: found.start()] + block + current[found.end() :]
    elif not add:
        raise SystemExit(f"{path}: no section marked {name!r} (<!-- {name}:start --> ... <!-- {name}:end -->)")
    else:
        block = f"<!-- {name}:begin -->\n{text.rstrip()}\n<!-- {name}:end -->"
        neighbour = _section(after).search(current) if after else None
        if neighbour is not None:
            updated = current[: neighbour.end()] + "\n\n" + block + current[neighbour.end() :]
        else:
            updated = current.rstrip() + "\n\n" + block + "\n"
    path.write_text(updated, encoding="utf-8")
