"""The process-wide rules for loading models, in one place for the CLI, the core and the adapters.

- Offline mode: ``HF_HUB_OFFLINE=1`` means every hub look-up reads local files (the cache) only.
- Quiet loading: a CLI user wants one line per step, not transformers' per-weight progress.
- Where a file of a model lives: a local folder, or a hub repository (through the cache).

Torch-free, so the exported (ONNX/OpenVINO) search path reads ``care_config.json`` by the same rules.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from care_retriever.errors import ModelError

# What running a tower's shipped model code means, said the same by every command and config that offers it.
TRUST_REMOTE_CODE_HELP = (
    "Run model code shipped with a tower (auto_map). Off by default; a model whose tower needs it needs it at every "
    "load."
)


def offline() -> bool:
    """Whether hub look-ups must stay on this machine (``HF_HUB_OFFLINE=1``)."""
    return os.environ.get("HF_HUB_OFFLINE") == "1"


def hub_options(**extra: Any) -> dict[str, Any]:
    """Keyword arguments for hub look-ups: ``local_files_only`` in offline mode, plus ``extra``."""
    return {"local_files_only": offline(), **extra}


def model_file(name: str | os.PathLike[str], filename: str, hub: dict[str, Any] | None = None) -> str | None:
    """``filename`` of a model folder or hub repository; None where the model has no such file."""
    if Path(name).is_dir():
        path = Path(name) / filename
        return str(path) if path.is_file() else None
    from sentence_transformers.util import load_file_path

    try:
        return load_file_path(str(name), filename, **(hub if hub is not None else hub_options()))
    except Exception as exc:  # hub errors come in many types; the message is what matters
        raise ModelError(f"cannot fetch {filename} of {str(name)!r}: {str(exc).splitlines()[0]}") from exc


def quiet_transformers() -> None:
    """Model loading prints per-weight progress and load reports; a CLI user wants one line per step."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


@contextmanager
def loading_progress(show: bool) -> Iterator[None]:
    """Within the block, transformers prints its loading bars and load reports only if ``show``; restored after.

    The framework doors (Haystack components, LangChain classes) load inside a user's program, so they leave its
    transformers settings as they found them rather than silencing them for good as the CLI does.

    Usage: ``with loading_progress(show=False): tower = AsymmetricEmbedder.from_pretrained(folder)``

    :param show: let transformers print its progress bars and load reports as configured.
    """
    if show:
        yield
        return
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


# ------------------------------------------------------------------
# Is a model name a local folder or a hub id? One rule for every loader.
#
# A hub id is ``name`` or ``org/name``. Anything else that reads as a path (``./m``, ``../m``, ``/abs``, ``~/m``,
# ``a/b/c``, ``C:\m``) or that exists on disk is local, and must then be a folder: a typo in a path fails at once, in
# one line, instead of as a confusing hub lookup (or a download).
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
