"""Query backends: the query tower on torch (default) or on an ONNX export in the model folder.

This package imports neither torch nor transformers: with ``backend="onnx"`` a search process
runs on tokenizers + onnxruntime + numpy only. ``load_query_embedder`` is the one place that picks
a backend for the search path (CLI ``search``/``serve``, :class:`~care_retriever.retriever.CareRetriever`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from care_retriever.backends.layout import BACKENDS, EXPORT_BACKENDS, find_export, require_export
from care_retriever.errors import ModelError

__all__ = ["BACKENDS", "EXPORT_BACKENDS", "find_export", "load_query_embedder", "require_export", "resolve_backend"]


def resolve_backend(model: str | os.PathLike[str], backend: str) -> str:
    """``auto`` -> ``onnx`` when the (local) model folder holds an ONNX export of its query tower, else ``torch``."""
    if backend not in BACKENDS:
        raise ModelError(f"Unknown backend {backend!r}. Available backends: {list(BACKENDS)}")
    if backend != "auto":
        return backend
    return "onnx" if Path(model).is_dir() and find_export(Path(model), "onnx") is not None else "torch"


def load_query_embedder(
    model: str | os.PathLike[str], backend: str = "auto", *, device: str | None = None, **kwargs: Any
) -> Any:
    """The query-side embedder of ``model`` on ``backend``; torch is imported only for the torch backend."""
    chosen = resolve_backend(model, backend)
    if chosen == "onnx":
        from care_retriever.backends.onnx_embedder import OnnxQueryEmbedder

        if device not in (None, "auto", "cpu"):
            raise ModelError(f"backend 'onnx' runs on the CPU; got --device {device!r} (use --backend torch)")
        return OnnxQueryEmbedder.from_pretrained(model, **kwargs)
    from care_retriever.embedder import AsymmetricEmbedder

    return AsymmetricEmbedder.from_pretrained(model, load="query", device=device, backend="torch", **kwargs)
