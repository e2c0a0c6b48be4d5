"""The one real folder a store path names, whatever name reaches it, and whether a bulk write can swap it.

A store is locked and published by its real folder: symbolic links followed, ``.``, ``..`` and relative forms
resolved. Two names of one folder (a link and its target) then share one writer lock, and a publish renames the
link's target, so the link stays a link. A bulk write publishes by renaming its staging folder over the store
folder; a folder that cannot be renamed (a mount point) or that holds the current directory is refused in one
line before any work (reads and small in-place writes need no rename and work there).

A store that works in a temporary folder of its own (``qdrant::memory:``, a read copy) gets it from
:func:`temporary_folder`, which removes it with the store, even one never closed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from pathlib import Path

from care_retriever.errors import InputError


def real_folder(path: Path, what: str) -> Path:
    """``path`` as the absolute real folder it names (it need not exist yet); the root of a file system, which
    has no parent to stage a write beside, is one line."""
    real = Path(os.path.realpath(path))
    if real.parent == real:
        raise InputError(f"{path}: {what} cannot be the root of the file system; name a folder inside it")
    return real


def require_swappable(real: Path, what: str) -> None:
    """``real`` (a :func:`real_folder`) can be replaced by renaming a folder beside it, or one line says why not."""
    if os.path.ismount(real):
        raise InputError(
            f"{real}: {what} is a mount point, which a bulk write cannot swap (it publishes by renaming the "
            f"folder); index into a folder inside it, such as {real / 'store'}"
        )
    try:
        cwd = Path(os.path.realpath(Path.cwd()))
    except OSError:  # the current directory was removed: nothing of it to swap away
        return
    if cwd == real or real in cwd.parents:
        raise InputError(
            f"{real}: {what} holds the current directory, which a bulk write would rename away from under it; "
            f"run the command from outside it (from {real.parent})"
        )


def temporary_folder(owner: object, prefix: str) -> Path:
    """A new folder in the system's temporary folder, removed when ``owner`` is collected or at exit, so that an
    owner never closed (a script that just ends) leaves nothing behind; closing ``owner`` may remove it sooner."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    weakref.finalize(owner, shutil.rmtree, folder, ignore_errors=True)
    return folder
