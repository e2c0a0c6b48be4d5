"""Query backends: the query tower on torch (default) or on an ONNX / OpenVINO export in the model folder.

This package imports neither torch nor transformers: with ``backend="onnx"`` (``"openvino"``) a search
process runs on tokenizers + onnxruntime (openvino) + numpy only. ``load_query_embedder`` is the one place that picks
a backend for the search path (CLI ``search``/``serve``, :class:`~care_retriever.search.retriever.CareRetriever`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from care_retriever.errors import InputError, ModelError
from care_retriever.search.backends.layout import BACKENDS, EXPORT_BACKENDS, find_export, require_export

if TYPE_CHECKING:
    from care_retriever.model.protocols import QueryEncoder

__all__ = [
    "AUTO_ORDER",
    "BACKENDS",
    "EXPORT_BACKENDS",
    "find_export",
    "load_query_embedder",
    "query_backend",
    "require_export",
    "resolve_backend",
]


# What ``auto`` takes when the folder has several exports: first in this order.
AUTO_ORDER = ("onnx", "openvino")
TORCH = "torch"  # the query tower itself, no export


def resolve_backend(model: str | os.PathLike[str], backend: str) -> str:
    """``auto`` -> the first export the (local) model folder holds (:data:`AUTO_ORDER`), else ``torch``."""
    if backend not in BACKENDS:
        raise ModelError(f"Unknown backend {backend!r}. Available backends: {list(BACKENDS)}")
    if backend != "auto":
        return backend
    folder = Path(model).expanduser()
    if folder.is_dir():
        for exported in AUTO_ORDER:
            if find_export(folder, exported) is not None:
                return exported
    return "torch"


def query_backend(embedder: object) -> str:
    """Which query backend answers through ``embedder``: ``torch``, or an export and its quantisation (``onnx``,
    ``onnx-int8``, ``openvino``, ``openvino-int8``): scores differ slightly between them, so search says which.

    Example:
        ```python
        query_backend(load_query_embedder("models/care", "auto"))  # "onnx-int8" after `export --quantize int8`
        ```

    :param embedder: a query encoder from :func:`load_query_embedder`.
    """
    return str(getattr(embedder, "query_backend", TORCH))


def load_query_embedder(
    model: str | os.PathLike[str],
    backend: str = "auto",
    *,
    device: str | None = None,
    threads: int | None = None,
    trust_remote_code: bool = False,
    compile: bool = False,
    **kwargs: Any,
) -> QueryEncoder:
    """The query-side embedder of ``model`` on ``backend``; torch is imported only for the torch backend.

    The one place that chooses a backend: :meth:`AsymmetricEmbedder.from_pretrained
    <care_retriever.model.embedder.AsymmetricEmbedder.from_pretrained>` always builds torch towers.

    ``threads``: CPU threads of one forward pass (ONNX Runtime's / OpenVINO's intra-op threads; for torch,
    ``torch.set_num_threads``, which is process-wide). None leaves each runtime's default.
    ``trust_remote_code``: needed by a torch query tower whose model code ships with it; an exported
    tower (onnx, openvino) is a graph and runs no model code.
    ``compile``: torch only, compile the query tower's layers and warm them up now (seconds to a minute), for a
    long-running process (``serve --compile``); the state is ``care_retriever.runtime.compiled.query_compile_state``.
    """
    chosen = resolve_backend(model, backend)
    if compile and chosen != "torch":
        raise InputError(f"--compile compiles the torch query tower: use --backend torch ({chosen} runs an export)")
    if chosen != "torch" and device not in (None, "auto", "cpu"):
        raise ModelError(f"backend {chosen!r} runs on the CPU; got --device {device!r} (use --backend torch)")
    if chosen == "onnx":
        from care_retriever.search.backends.onnx_embedder import OnnxQueryEmbedder

        return OnnxQueryEmbedder.from_pretrained(model, threads=threads, **kwargs)
    if chosen == "openvino":
        from care_retriever.search.backends.openvino_embedder import OpenVinoQueryEmbedder

        return OpenVinoQueryEmbedder.from_pretrained(model, threads=threads, **kwargs)
    from care_retriever.model.embedder import AsymmetricEmbedder

    if threads:
        import torch

        torch.set_num_threads(threads)
    embedder = AsymmetricEmbedder.from_pretrained(
        model, load="query", device=device, trust_remote_code=trust_remote_code, **kwargs
    )
    if compile:
        from care_retriever.runtime.compiled import compile_query_tower

        compile_query_tower(embedder.query_model)
    return embedder
