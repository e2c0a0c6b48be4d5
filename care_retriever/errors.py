"""User-facing errors.

Every error a user can cause (bad input, a missing model, a store built by another model) is a
:class:`CareError` subclass whose message is one line naming the file, line or argument at fault.
The CLI prints that line and exits non-zero, without a traceback.
"""

from __future__ import annotations


class CareError(Exception):
    """Base class of the errors caused by input rather than by a bug: one line naming what is at fault.

    Usage example:
    ```python
    from care_retriever import CareError, open_store

    try:
        open_store("faiss:stores/missing", create=False).require_manifest()
    except CareError as exc:
        print(f"error: {exc}")  # one line; the CLI prints it and exits with exc.exit_code
    ```
    """

    exit_code = 2


class InputError(CareError, ValueError):
    """A corpus, query set or argument is malformed."""


class ModelError(CareError):
    """A model folder is missing, incomplete or inconsistent (dimension mismatch, unknown pooling)."""


class StoreError(CareError):
    """A vector store is missing, corrupted, or was built by another model."""


def at(path: object, line: int | None = None) -> str:
    """Format a location: ``corpus.jsonl:12`` or ``corpus.jsonl``."""
    return f"{path}:{line}" if line is not None else f"{path}"


class WriteError(CareError):
    """A write failed in the file system (disk full, I/O error, permission denied, read-only file system).

    The message names the file and what was being written; what was already published is unchanged.
    ``reason`` is the short cause ("the disk is full"), ``path`` the file or folder being written.
    """

    def __init__(self, message: str, *, path: object = None, reason: str = "") -> None:
        super().__init__(message)
        self.path = path
        self.reason = reason


class DiskFullError(WriteError):
    """The disk filled up while a model was being written (what was there before is left intact); the message
    says how much free space the model needs."""
