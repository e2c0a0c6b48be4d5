"""The process-wide rules for loading models, in one place for the CLI, the core and the adapters.

- Offline mode: ``HF_HUB_OFFLINE=1`` means every hub look-up reads local files (the cache) only.
- Quiet loading: a CLI user wants one line per step, not transformers' per-weight progress.
- Where a file of a model lives: a local folder, or a hub repository (through the cache).

Torch-free, so the exported (ONNX/OpenVINO) search path reads ``care_config.json`` by the same rules.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from care_retriever.errors import ModelError


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
