"""Is a model name a local folder or a hub id? One rule for every loader.

A hub id is ``name`` or ``org/name``. Anything else that reads as a path (``./m``, ``../m``, ``/abs``,
``~/m``, ``a/b/c``, ``C:\\m``) or that exists on disk is local, and must then be a folder: a typo in a
path fails at once, in one line, instead of as a confusing hub lookup (or a download).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from care_retriever.errors import ModelError

_WINDOWS_PATH = re.compile(r"^[A-Za-z]:[\\/]|\\")


def looks_local(name: str) -> bool:
    """Whether ``name`` can only be a path on this machine (not a hub id)."""
    return (
        name.startswith((".", "/", "~"))
        or name.count("/") > 1
        or bool(_WINDOWS_PATH.search(name))
        or Path(name).expanduser().exists()
    )


def local_model_dir(name: str) -> Path | None:
    """The folder ``name`` names (``~`` expanded), or None for a hub id.

    Raises :class:`ModelError` for an empty name and for a local-looking name that is not a folder.
    """
    if not isinstance(name, str) or not name.strip():
        raise ModelError(f"model must be a model folder or hub id, got {name!r}")
    if not looks_local(name):
        return None
    path = Path(name).expanduser()
    if not path.is_dir():
        raise ModelError(f"model folder not found: {name}")
    return path


def replace_folder(staged: Path, target: Path) -> None:
    """Put the finished folder ``staged`` where ``target`` is, replacing it; the old copy goes only once
    the new one is in place, so a failure leaves one of the two complete."""
    if target.exists():
        old = target.with_name(f".{target.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        target.rename(old)
        staged.rename(target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        staged.rename(target)
