"""Build one tower as a list of sentence-transformers modules.

A tower is ``Transformer -> Pooling [-> Dense truncation]``; the embedder appends ``Normalize``.
Using the field's modules keeps a saved CARE model loadable by plain ``SentenceTransformer``.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from sentence_transformers.sentence_transformer.modules import Dense, Module, Normalize, Pooling, Transformer
from sentence_transformers.util import import_module_class

from care_retriever.errors import ModelError
from care_retriever.model.towers import DEFAULT_MAX_LENGTH
from care_retriever.model.towers.loading import hub_options, model_file
from care_retriever.runtime.architecture import config_is_decoder
from care_retriever.runtime.device import resolve_attn_implementation, resolve_dtype

PoolingName = Literal["cls", "mean", "last_token"]
POOLING_MODES: dict[str, str] = {"cls": "cls", "mean": "mean", "last_token": "lasttoken"}


def pooling_mode(pooling: str) -> str:
    """Our pooling name -> sentence-transformers' ``pooling_mode``."""
    try:
        return POOLING_MODES[pooling]
    except KeyError as exc:
        raise ModelError(f"Unknown pooling {pooling!r}. Available poolings: {sorted(POOLING_MODES)}") from exc


PICKLED_WEIGHTS = ("pytorch_model.bin", "model.pt", "model.pth", "pytorch_model.pt")
REMOTE_CODE_FLAG = "trust_remote_code=True (CLI: --trust-remote-code)"


def refuse_pickled_weights(folder: Path, allowed: bool) -> None:
    """Unpickling can run code: a local folder with only pickled weights is refused unless asked for.

    With the opt-in, transformers reads them through torch's weights-only unpickler
    (``torch.load(weights_only=True)``), which loads tensors and refuses arbitrary objects.
    """
    if allowed or not folder.is_dir():
        return
    if any(folder.glob("*.safetensors")) or (folder / "model.safetensors.index.json").is_file():
        return
    pickled = [n for n in PICKLED_WEIGHTS if (folder / n).is_file()]
    if pickled:
        raise ModelError(
            f"{folder}: weights are pickled ({pickled[0]}), not model.safetensors; loading them needs "
            "allow_pickled_weights=True (CLI: --allow-pickled-weights), read by torch's weights-only loader"
        )


def runs_remote_code(model: torch.nn.Module) -> bool:
    """Whether ``model``'s class came from code shipped with the model (``auto_map``), not from transformers."""
    return type(model).__module__.startswith("transformers_modules")


def remote_code_error(name: str, exc: Exception) -> ModelError | None:
    """transformers' refusal to run a folder's own code, as one line naming the opt-in; None for other errors."""
    message = str(exc)
    if "trust_remote_code" not in message:
        return None
    return ModelError(
        f"{name}: this tower's config and model classes are code shipped with the model (auto_map); "
        f"running it needs {REMOTE_CODE_FLAG}"
    )


def _model_kwargs(
    dtype: torch.dtype | None,
    trust_remote_code: bool,
    allow_pickled_weights: bool,
    extra: dict[str, Any] | None,
) -> dict[str, Any]:
    # use_safetensors=True means "safetensors only"; None lets transformers fall back to pickled weights.
    kwargs: dict[str, Any] = {
        "trust_remote_code": trust_remote_code,
        "use_safetensors": None if allow_pickled_weights else True,
    }
    if dtype is not None:
        kwargs["dtype"] = dtype
    kwargs.update(extra or {})
    return kwargs


def load_transformer(
    model_name_or_path: str,
    *,
    max_length: int = DEFAULT_MAX_LENGTH,
    dtype: torch.dtype | None = None,
    trust_remote_code: bool = False,
    allow_pickled_weights: bool = False,
    model_kwargs: dict[str, Any] | None = None,
) -> Transformer:
    """A ``Transformer`` module over any Hugging Face model id or local folder (safetensors weights)."""
    refuse_pickled_weights(Path(model_name_or_path), allow_pickled_weights)
    try:
        return Transformer(
            model_name_or_path,
            max_seq_length=max_length,
            model_kwargs=_model_kwargs(dtype, trust_remote_code, allow_pickled_weights, model_kwargs),
            processor_kwargs={"trust_remote_code": trust_remote_code},
            config_kwargs={"trust_remote_code": trust_remote_code},
        )
    except (OSError, ValueError) as exc:
        raise remote_code_error(model_name_or_path, exc) or ModelError(
            f"cannot load model {model_name_or_path!r}: {str(exc).splitlines()[0]}"
        ) from exc


def lift_model_code(folder: Path) -> list[str]:
    """Copy the model code of a tower saved in a module subfolder to ``folder`` itself; the names copied.

    transformers looks a local model's ``auto_map`` code up in the folder it was asked for, not in the
    ``subfolder`` a sentence-transformers Router keeps each tower in; with the code beside
    ``modules.json`` both this package and plain ``SentenceTransformer(folder, trust_remote_code=True)``
    load the saved model.
    """
    copied: list[str] = []
    for config_path in sorted(folder.glob("*/config.json")):
        if "auto_map" not in json.loads(config_path.read_text("utf-8")):
            continue
        for code in sorted(config_path.parent.glob("*.py")):
            target = folder / code.name
            if target.is_file() and target.read_bytes() != code.read_bytes():
                raise ModelError(
                    f"{folder}: two towers ship different model code named {code.name}; they cannot be saved together"
                )
            shutil.copyfile(code, target)
            copied.append(code.name)
    return copied


@dataclass
class PretrainedTower:
    """A pretrained tower as its folder declares it: the model, its pooling, its prompts."""

    transformer: Transformer
    # The folder's own Pooling (and any Dense after it) when it is a sentence-transformers folder.
    head: list[Module] = field(default_factory=list)
    prompts: dict[str, str] = field(default_factory=dict)

    @property
    def pooling(self) -> str | None:
        return tower_pooling(self.head) if self.head else None

    @property
    def remote_code(self) -> bool:
        return runs_remote_code(self.transformer.auto_model)

    def modules(self, pooling: str, output_dim: int | None = None, *, normalize_first: bool = False) -> list[Module]:
        """``[transformer, pooling(, dense...)]`` plus a Matryoshka truncation to ``output_dim``.

        The folder's own pooling is kept when it is the one asked for, so its settings (e.g. whether
        the prompt's tokens are pooled) stay as the folder declares them. ``normalize_first``: a
        ``Normalize`` before the truncation (the tower normalises at full width, then is cut without
        renormalising: the authors' released models).
        """
        if self.head and self.pooling == pooling:
            modules: list[Module] = [self.transformer, *self.head]
        else:
            modules = [self.transformer, Pooling(self.transformer.get_embedding_dimension(), pooling_mode(pooling))]
        native = tower_output_dim(modules)
        if normalize_first:
            modules.append(Normalize())
        if output_dim is not None and output_dim != native:
            modules.append(truncation_module(native, output_dim))
        return modules


SUPPORTED_HEAD = (Pooling, Dense)


def read_tower(
    model_name_or_path: str,
    *,
    max_length: int = DEFAULT_MAX_LENGTH,
    dtype: torch.dtype | None = None,
    trust_remote_code: bool = False,
    allow_pickled_weights: bool = False,
    model_kwargs: dict[str, Any] | None = None,
) -> PretrainedTower:
    """Read a pretrained tower the way its own library reads it.

    A sentence-transformers folder (``modules.json``: Qwen3-Embedding, bge, gte) is loaded by
    sentence-transformers, so its pooling, prompts and tokenizer settings are the folder's; any other
    model (a causal-LM checkpoint such as Qwen3-4B, a bare encoder) is a ``Transformer`` whose pooling
    the caller chooses. ``Normalize`` is dropped: a CARE model normalises after its own last module.
    """
    if model_file(model_name_or_path, "modules.json") is None:
        transformer = load_transformer(
            model_name_or_path,
            max_length=max_length,
            dtype=dtype,
            trust_remote_code=trust_remote_code,
            allow_pickled_weights=allow_pickled_weights,
            model_kwargs=model_kwargs,
        )
        return PretrainedTower(transformer)
    refuse_pickled_weights(Path(model_name_or_path), allow_pickled_weights)
    from sentence_transformers import SentenceTransformer

    try:
        model = SentenceTransformer(
            model_name_or_path,
            device="cpu",
            trust_remote_code=trust_remote_code,
            model_kwargs=_model_kwargs(dtype, trust_remote_code, allow_pickled_weights, model_kwargs),
            local_files_only=hub_options()["local_files_only"],
        )
    except (OSError, ValueError) as exc:
        raise remote_code_error(model_name_or_path, exc) or ModelError(
            f"cannot load sentence-transformers model {model_name_or_path!r}: {str(exc).splitlines()[0]}"
        ) from exc
    modules = list(model)
    first, rest = modules[0], modules[1:]
    unsupported = [type(m).__name__ for m in rest if not isinstance(m, (*SUPPORTED_HEAD, Normalize))]
    if not isinstance(first, Transformer) or unsupported or not any(isinstance(m, Pooling) for m in rest):
        found = [type(m).__name__ for m in modules]
        raise ModelError(
            f"{model_name_or_path}: a tower must be Transformer -> Pooling [-> Dense] [-> Normalize]; "
            f"the folder's modules.json has {found}"
        )
    first.max_seq_length = max_length
    head: list[Module] = [m for m in rest if isinstance(m, SUPPORTED_HEAD)]  # Normalize dropped
    return PretrainedTower(first, head, {k: v for k, v in (model.prompts or {}).items() if v})


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


def tower_precision(name_or_path: str) -> tuple[str | None, bool]:
    """What a tower's precision is chosen from: the dtype its ``config.json`` names (``dtype``, or transformers 4's
    ``torch_dtype``; None if unknown) and whether it is a decoder (:func:`config_is_decoder`; False if unknown).

    Read from the file, not from a loaded model: loading in fp32 rewrites the loaded config's dtype.
    A sentence-transformers folder keeps the transformer's config in its Transformer module's path.
    """
    from transformers import PretrainedConfig
    from transformers.utils import cached_file

    subfolder = ""
    try:
        modules = cached_file(name_or_path, "modules.json", _raise_exceptions_for_missing_entries=False)
    except (OSError, ValueError):  # ValueError: not a folder and not a valid hub id
        modules = None
    if modules:
        for module in json.loads(Path(modules).read_text("utf-8")):
            if str(module.get("type", "")).endswith("Transformer"):
                subfolder = module.get("path", "")
                break
    try:
        config, _ = PretrainedConfig.get_config_dict(name_or_path, subfolder=subfolder)
    except (OSError, ValueError):
        return None, False
    dtype = config.get("dtype") or config.get("torch_dtype")
    return (str(dtype).removeprefix("torch.") if dtype else None), config_is_decoder(config)


def tower_pretrained_dtype(name_or_path: str) -> str | None:
    """The dtype a tower's ``config.json`` names (:func:`tower_precision`); None if unknown."""
    return tower_precision(name_or_path)[0]


def load_saved_module(
    name: str,
    module_id: str,
    class_ref: str,
    hub: dict[str, Any],
    dtype: str | torch.dtype | None,
    device: torch.device,
    trust_remote_code: bool,
    allow_pickled_weights: bool = False,
    attn_implementation: str | None = None,
) -> Module:
    """One module of a saved model (``module_id``, a subfolder of ``name``, of the sentence-transformers class
    ``class_ref``), its Transformer in its own precision; pickled weights refused unless allowed."""
    module_class = import_module_class(class_ref, model_name_or_path=name, trust_remote_code=False)
    if not issubclass(module_class, Module):
        raise ModelError(f"{name}/{module_id}: {class_ref} is not a sentence-transformers module")
    refuse_pickled_weights(Path(name) / module_id, allow_pickled_weights)
    if issubclass(module_class, Transformer):
        # each tower in its own precision ("auto" keeps a bf16-pretrained tower off fp16): read from the
        # transformer's own config.json, the only module that has weights to cast
        saved = model_file(name, f"{module_id}/config.json", hub)
        precision = tower_precision(str(Path(saved).parent)) if saved else (None, False)
        torch_dtype = resolve_dtype(dtype, device, *precision)
        attention = resolve_attn_implementation(attn_implementation, device, torch_dtype)
        return module_class.load(
            name,
            subfolder=module_id,
            trust_remote_code=trust_remote_code,
            model_kwargs={
                "dtype": torch_dtype,
                "use_safetensors": None if allow_pickled_weights else True,
                # only when set: model code of its own may not take the keyword
                **({"attn_implementation": attention} if attention else {}),
            },
            **hub,
        )
    return module_class.load(name, subfolder=module_id, **hub)
