"""Build one tower as a list of sentence-transformers modules.

A tower is ``Transformer -> Pooling [-> Dense truncation]``; the embedder appends ``Normalize``.
Using the field's modules keeps a saved CARE model loadable by plain ``SentenceTransformer``.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from sentence_transformers.sentence_transformer.modules import Dense, Module, Pooling, Transformer

from care_retriever.errors import ModelError
from care_retriever.model_config import DEFAULT_MAX_LENGTH

PoolingName = Literal["cls", "mean", "last_token"]
POOLING_MODES: dict[str, str] = {"cls": "cls", "mean": "mean", "last_token": "lasttoken"}


def pooling_mode(pooling: str) -> str:
    """Our pooling name -> sentence-transformers' ``pooling_mode``."""
    try:
        return POOLING_MODES[pooling]
    except KeyError:
        raise ModelError(f"Unknown pooling {pooling!r}. Available poolings: {sorted(POOLING_MODES)}") from None


def load_transformer(
    model_name_or_path: str,
    *,
    max_length: int = DEFAULT_MAX_LENGTH,
    dtype: torch.dtype | None = None,
    trust_remote_code: bool = False,
    model_kwargs: dict[str, Any] | None = None,
) -> Transformer:
    """A ``Transformer`` module over any Hugging Face model id or local folder."""
    kwargs: dict[str, Any] = {
        "trust_remote_code": trust_remote_code,
        "use_safetensors": not trust_remote_code,
    }
    if dtype is not None:
        kwargs["dtype"] = dtype
    kwargs.update(model_kwargs or {})
    try:
        return Transformer(
            model_name_or_path,
            max_seq_length=max_length,
            model_kwargs=kwargs,
            processor_kwargs={"trust_remote_code": trust_remote_code},
            config_kwargs={"trust_remote_code": trust_remote_code},
        )
    except OSError as exc:
        raise ModelError(f"cannot load model {model_name_or_path!r}: {str(exc).splitlines()[0]}") from None


def truncation_module(in_dim: int, out_dim: int) -> Dense:
    """Matryoshka truncation to the first ``out_dim`` dims as an exact identity projection.

    A ``Dense`` with weight ``[I | 0]`` is a stock sentence-transformers module, so the saved model
    stays loadable without this package; the cost is one small matmul per batch.
    """
    if out_dim > in_dim:
        raise ModelError(
            f"dimension mismatch: the document tower gives {in_dim} dims, fewer than the query tower's {out_dim}; "
            "Matryoshka truncation can only shorten an embedding"
        )
    weight = torch.zeros(out_dim, in_dim)
    weight[:, :out_dim] = torch.eye(out_dim)
    dense = Dense(in_dim, out_dim, bias=False, activation_function=None, init_weight=weight)
    dense.requires_grad_(False)
    return dense


def tower_modules(transformer: Transformer, pooling: str, output_dim: int | None = None) -> list[Module]:
    """``[transformer, pooling]`` plus a truncation to ``output_dim`` when it is smaller."""
    native = transformer.get_embedding_dimension()
    modules: list[Module] = [transformer, Pooling(native, pooling_mode=pooling_mode(pooling))]
    if output_dim is not None and output_dim != native:
        modules.append(truncation_module(native, output_dim))
    return modules


def tower_pooling(modules: list[Module]) -> str:
    for module in modules:
        if isinstance(module, Pooling):
            mode = module.pooling_mode if isinstance(module.pooling_mode, str) else module.pooling_mode[0]
            return {v: k for k, v in POOLING_MODES.items()}.get(mode, mode)
    raise ModelError("tower has no Pooling module")


def tower_output_dim(modules: list[Module]) -> int:
    for module in reversed(modules):
        if isinstance(module, Dense):
            return module.out_features
        if isinstance(module, Pooling):
            return module.get_embedding_dimension()
    raise ModelError("tower has no Pooling module")


def tower_native_dim(modules: list[Module]) -> int:
    for module in modules:
        if isinstance(module, Pooling):
            return module.get_embedding_dimension()
    raise ModelError("tower has no Pooling module")
