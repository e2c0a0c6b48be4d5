"""``AsymmetricEmbedder``: a small query tower and a large document tower in one embedding space.

On disk a CARE model is a sentence-transformers model whose first module is a ``Router`` with a
``query`` and a ``document`` route, followed by ``Normalize``; ``care_config.json`` beside it keeps
what sentence-transformers has no field for (dims, poolings, the instruction template, the
fingerprint of the document space). So ``SentenceTransformer(folder).encode_query(...)`` works,
and ``AsymmetricEmbedder.from_pretrained(folder, load="query")`` reads only the query route: a
search process never materialises the document tower.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.modules import Module, Normalize, Router, Transformer
from sentence_transformers.util import import_module_class, load_file_path

from care_retriever import __version__
from care_retriever.encoding import check_texts, encode_texts, logger
from care_retriever.errors import ModelError
from care_retriever.fingerprint import space_fingerprint, weights_fingerprint
from care_retriever.locations import local_model_dir, replace_folder
from care_retriever.model_config import (  # re-exported: callers import these from here
    CONFIG_NAME,
    DEFAULT_INSTRUCTION,
    FORMAT_VERSION,  # noqa: F401
    QUERY_PROMPT_TEMPLATE,
    CareConfig,
    TowerInfo,
)
from care_retriever.towers.modules import (
    DEFAULT_MAX_LENGTH,
    load_transformer,
    tower_modules,
    tower_native_dim,
    tower_output_dim,
)
from care_retriever.towers.tokenizer import ensure_eos_appended

Load = Literal["both", "query", "document"]
ROUTES: dict[str, tuple[str, ...]] = {
    "both": ("query", "document"),
    "query": ("query",),
    "document": ("document",),
}


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """``auto``: fp32 on CPU, bf16 on CUDA where supported, else fp16."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    names = {
        "fp32": torch.float32,
        "float32": torch.float32,
        "bf16": torch.bfloat16,
        "bfloat16": torch.bfloat16,
        "fp16": torch.float16,
        "float16": torch.float16,
    }
    try:
        return names[str(dtype)]
    except KeyError:
        raise ModelError(
            f"Unknown dtype {dtype!r}. Available dtypes: ['auto', {', '.join(map(repr, names))}]"
        ) from None


def _assemble(modules: list[Module], device: torch.device, prompts: dict[str, str]) -> SentenceTransformer:
    return SentenceTransformer(modules=[*modules, Normalize()], device=str(device), prompts=prompts)


def _merge_lora(modules: list[Module]) -> None:
    """Fold LoRA adapters into the base weights: inference then costs what the plain model costs."""
    for module in modules:
        if isinstance(module, Transformer):
            model = module.auto_model
            if hasattr(model, "merge_and_unload") and hasattr(model, "peft_config"):
                module.model = model.merge_and_unload()


class AsymmetricEmbedder:
    """Encode queries with the query tower and documents with the document tower.

    Build one from two pretrained towers with :meth:`from_towers`, or load a saved model with
    :meth:`from_pretrained`. ``embed_queries`` / ``embed_documents`` return L2-normalised float32
    arrays of width :attr:`dim`.
    """

    def __init__(
        self,
        config: CareConfig,
        query_modules: list[Module] | None,
        document_modules: list[Module] | None,
        device: str | torch.device | None = None,
    ) -> None:
        self.config = config
        self.device = resolve_device(device)
        self.query_modules = query_modules
        self.document_modules = document_modules
        self._query_model = _assemble(query_modules, self.device, {}) if query_modules else None
        self._document_model = _assemble(document_modules, self.device, {}) if document_modules else None
        for side, model in (("query", self._query_model), ("document", self._document_model)):
            if model is not None and model.get_embedding_dimension() != config.dim:
                raise ModelError(
                    f"dimension mismatch: the {side} tower gives {model.get_embedding_dimension()} dims, "
                    f"the model's embedding dim is {config.dim}"
                )

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_towers(
        cls,
        query_model: str,
        document_model: str | None = None,
        *,
        query_pooling: str | None = None,
        document_pooling: str = "last_token",
        query_prompt_template: str | Literal["auto"] | None = "auto",
        default_instruction: str = DEFAULT_INSTRUCTION,
        max_length: int = DEFAULT_MAX_LENGTH,
        document_adapter: str | None = None,
        merge_adapter: bool = True,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = "auto",
        trust_remote_code: bool = False,
        preset: str | None = None,
    ) -> AsymmetricEmbedder:
        """Pair two pretrained towers (hub ids or folders); ``document_model=None`` is symmetric.

        The document tower is truncated (Matryoshka) to the query tower's width. ``query_pooling``
        defaults to ``cls`` for encoder models and ``last_token`` for decoders. ``query_prompt_template``
        ``"auto"`` gives decoder query towers the Qwen3-Embedding instruction form and BERT towers none.
        """
        dev = resolve_device(device)
        torch_dtype = resolve_dtype(dtype, dev)
        q_tf = load_transformer(
            query_model, max_length=max_length, dtype=torch_dtype, trust_remote_code=trust_remote_code
        )
        q_is_decoder = is_decoder(q_tf)
        q_pool = query_pooling or ("last_token" if q_is_decoder else "cls")
        if q_pool == "last_token":
            ensure_eos_appended(q_tf.tokenizer)
        if document_model is None:
            q_mods = tower_modules(q_tf, q_pool)
            d_mods = q_mods
            mode: Literal["asymmetric", "symmetric"] = "symmetric"
            d_pool = q_pool
        else:
            d_tf = load_transformer(
                document_model, max_length=max_length, dtype=torch_dtype, trust_remote_code=trust_remote_code
            )
            if document_adapter:
                _attach_adapter(d_tf, document_adapter, merge_adapter)
            d_pool = document_pooling
            if d_pool == "last_token" and ensure_eos_appended(d_tf.tokenizer):
                logger.info("document tower tokenizer now appends %s", d_tf.tokenizer.eos_token)
            q_dim = q_tf.get_embedding_dimension()
            q_mods = tower_modules(q_tf, q_pool)
            d_mods = tower_modules(d_tf, d_pool, output_dim=q_dim)
            mode = "asymmetric"
        template = (
            (QUERY_PROMPT_TEMPLATE if q_pool == "last_token" else None)
            if query_prompt_template == "auto"
            else query_prompt_template
        )
        config = CareConfig(
            mode=mode,
            dim=tower_output_dim(q_mods),
            query=TowerInfo(q_pool, tower_native_dim(q_mods), max_length, query_model),
            document=TowerInfo(d_pool, tower_native_dim(d_mods), max_length, document_model or query_model),
            query_prompt_template=template,
            default_instruction=default_instruction if template else None,
            preset=preset,
        )
        return cls(config, q_mods, d_mods, device=dev)

    @classmethod
    def from_pretrained(
        cls,
        model_name_or_path: str | os.PathLike[str],
        load: Load = "both",
        *,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = "auto",
        trust_remote_code: bool = False,
        allow_pickled_weights: bool = False,
        merge_lora: bool = True,
        revision: str | None = None,
        token: str | bool | None = None,
        cache_folder: str | None = None,
        backend: str = "torch",
    ) -> Any:
        """Load a saved CARE model from a folder or hub id; ``load`` picks the towers to build.

        ``backend`` (``torch`` by default | ``auto`` | ``onnx``, with ``load="query"``): ``onnx``
        returns the query-only embedder of :mod:`care_retriever.backends` over the folder's export
        (``care-retriever export``); ``auto`` takes an export when the folder has one, else torch.
        Model code from the hub (``trust_remote_code``) and pickled weights (``allow_pickled_weights``)
        are refused unless asked for: both can run arbitrary code.
        """
        if load not in ROUTES:
            raise ModelError(f"Unknown load {load!r}. Available: {sorted(ROUTES)}")
        if backend != "torch":
            from care_retriever.backends import load_query_embedder, resolve_backend

            resolved = resolve_backend(model_name_or_path, backend)
            if resolved != "torch":
                if load != "query":
                    raise ModelError(
                        f"backend {resolved!r} holds only the query tower; use load='query' or backend='torch'"
                    )
                return load_query_embedder(model_name_or_path, resolved, device=device)
        name = str(model_name_or_path)
        local = local_model_dir(name)
        if local is not None:
            name = str(local)  # "~" expanded: every later lookup sees the folder
        hub = {
            "token": token,
            "cache_folder": cache_folder,
            "revision": revision,
            "local_files_only": os.environ.get("HF_HUB_OFFLINE") == "1",
        }
        config_path = _file(name, CONFIG_NAME, hub)
        if config_path is None:
            raise ModelError(
                f"{name}: no {CONFIG_NAME}; not a CARE model (plain sentence-transformers models load with "
                "care_retriever.baselines.SentenceTransformerEmbedder)"
            )
        config = CareConfig.from_dict(json.loads(Path(config_path).read_text("utf-8")), f"{name}/{CONFIG_NAME}")
        router_path = _file(name, Router.config_file_name, hub)
        if router_path is None:
            raise ModelError(f"{name}: missing {Router.config_file_name}; the model folder is incomplete")
        router = json.loads(Path(router_path).read_text("utf-8"))
        dev = resolve_device(device)
        torch_dtype = resolve_dtype(dtype, dev)
        loaded: dict[str, Module] = {}
        routes: dict[str, list[Module]] = {}
        for route in ROUTES[load]:
            if route not in router["structure"]:
                raise ModelError(
                    f"No route found for task {route!r} in {name}. Available routes: {sorted(router['structure'])}"
                )
            modules = []
            for module_id in router["structure"][route]:
                if module_id not in loaded:
                    loaded[module_id] = _load_module(
                        name,
                        module_id,
                        router["types"][module_id],
                        hub,
                        torch_dtype,
                        trust_remote_code,
                        allow_pickled_weights,
                    )
                modules.append(loaded[module_id])
            if merge_lora:
                _merge_lora(modules)
            routes[route] = modules
        return cls(config, routes.get("query"), routes.get("document"), device=dev)

    # ------------------------------------------------------------------ properties
    @property
    def dim(self) -> int:
        """Width of the shared embedding space (what a store holds)."""
        return self.config.dim

    @property
    def query_dim(self) -> int:
        return self.config.dim

    @property
    def document_dim(self) -> int:
        """Native width of the document tower, before Matryoshka truncation to :attr:`dim`."""
        return self.config.document.native_dim

    @property
    def mode(self) -> str:
        return self.config.mode

    @property
    def document_model_name(self) -> str:
        """The document tower's base model (hub id or folder), recorded in a store's manifest."""
        return self.config.document.base_model or ""

    @property
    def query_model(self) -> SentenceTransformer:
        if self._query_model is None:
            raise ModelError("this embedder was loaded with load='document'; the query tower is not loaded")
        return self._query_model

    @property
    def document_model(self) -> SentenceTransformer:
        if self._document_model is None:
            raise ModelError("this embedder was loaded with load='query'; the document tower is not loaded")
        return self._document_model

    @property
    def space_fingerprint(self) -> str:
        """Identifies the document embedding space; a store built with another one refuses searches.

        It covers the document tower's weights and the document-text rule
        (:func:`care_retriever.fingerprint.space_fingerprint`), so a Stage-I update of the query tower
        alone keeps existing indexes valid, while any change to the document side invalidates them.
        """
        if self.config.space_fingerprint is None:
            self.config.space_fingerprint = weights_fingerprint(self.document_modules or [], self.config.dim)
        return space_fingerprint(self.config.space_fingerprint)

    def query_prompt(self, instruction: str | None = None) -> str | None:
        return self.config.query_prompt(instruction)

    # ------------------------------------------------------------------ encoding
    def embed_queries(
        self,
        texts: Sequence[str],
        *,
        instruction: str | None = None,
        batch_size: int = 32,
        show_progress: bool = False,
    ) -> np.ndarray:
        """Encode queries with the query tower: ``(len(texts), dim)`` float32, unit norm."""
        texts = check_texts(texts, "queries")
        return encode_texts(
            self.query_model,
            texts,
            prompt=self.query_prompt(instruction),
            batch_size=batch_size,
            show_progress=show_progress,
            desc="Encoding queries",
            unit="query",
        )

    def embed_documents(self, texts: Sequence[str], *, batch_size: int = 16, show_progress: bool = False) -> np.ndarray:
        """Encode documents with the document tower: ``(len(texts), dim)`` float32, unit norm."""
        texts = check_texts(texts, "documents")
        return encode_texts(
            self.document_model,
            texts,
            batch_size=batch_size,
            show_progress=show_progress,
            desc="Encoding documents",
            unit="doc",
        )

    # ------------------------------------------------------------------ saving
    def to_sentence_transformer(self) -> SentenceTransformer:
        """One ``SentenceTransformer`` with a ``Router`` over both towers (shared parameters)."""
        if self.query_modules is None or self.document_modules is None:
            raise ModelError("saving or training needs both towers; load the model with load='both'")
        router = Router.for_query_document(self.query_modules, self.document_modules, default_route="document")
        prompts = {"query": self.query_prompt() or "", "document": ""}
        return SentenceTransformer(
            modules=[router, Normalize()],
            device=str(self.device),
            prompts=prompts,
            similarity_fn_name="cosine",
        )

    def save_pretrained(self, path: str | os.PathLike[str]) -> Path:
        """Write the model to ``path`` atomically (a temp folder renamed into place)."""
        target = Path(path)
        st = self.to_sentence_transformer()
        self.config.space_fingerprint = weights_fingerprint(self.document_modules or [], self.config.dim)
        self.config.care_retriever_version = __version__
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            st.save(str(tmp))
            (tmp / CONFIG_NAME).write_text(self.config.to_json(), encoding="utf-8")
            replace_folder(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return target

    @property
    def loaded_towers(self) -> tuple[str, ...]:
        """The towers in memory: ``("query",)`` in a search process (``load="query"``)."""
        return tuple(s for s, m in (("query", self._query_model), ("document", self._document_model)) if m is not None)

    def __repr__(self) -> str:
        loaded = list(self.loaded_towers)
        return (
            f"AsymmetricEmbedder(mode={self.mode}, dim={self.dim}, document_dim={self.document_dim}, loaded={loaded})"
        )


# ---------------------------------------------------------------------- helpers
def is_decoder(transformer: Transformer) -> bool:
    """Whether the tower is a decoder (causal attention) rather than a bidirectional encoder."""
    config = transformer.auto_model.config
    archs = getattr(config, "architectures", None) or []
    return (
        bool(getattr(config, "is_decoder", False))
        or any("CausalLM" in a for a in archs)
        or config.model_type in {"qwen2", "qwen3", "llama", "mistral", "gemma", "gemma2", "gemma3", "phi3", "gpt2"}
    )


def _attach_adapter(transformer: Transformer, adapter: str, merge: bool) -> None:
    from peft import PeftModel

    try:
        model = PeftModel.from_pretrained(transformer.auto_model, adapter)
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot load LoRA adapter {adapter!r}: {str(exc).splitlines()[0]}") from None
    transformer.model = model.merge_and_unload() if merge else model


def _file(name: str, filename: str, hub: dict[str, Any]) -> str | None:
    if Path(name).is_dir():
        path = Path(name) / filename
        return str(path) if path.is_file() else None
    try:
        return load_file_path(name, filename, **hub)
    except Exception as exc:  # hub errors come in many types; the message is what matters
        raise ModelError(f"cannot fetch {filename} of {name!r}: {str(exc).splitlines()[0]}") from None


def _load_module(
    name: str,
    module_id: str,
    class_ref: str,
    hub: dict[str, Any],
    dtype: torch.dtype,
    trust_remote_code: bool,
    allow_pickled_weights: bool = False,
) -> Module:
    module_class = import_module_class(class_ref, model_name_or_path=name, trust_remote_code=False)
    _refuse_pickled_weights(Path(name) / module_id, allow_pickled_weights)
    if issubclass(module_class, Transformer):
        return module_class.load(
            name,
            subfolder=module_id,
            trust_remote_code=trust_remote_code,
            model_kwargs={"dtype": dtype, "use_safetensors": None if allow_pickled_weights else True},
            **hub,
        )
    return module_class.load(name, subfolder=module_id, **hub)


PICKLED_WEIGHTS = ("pytorch_model.bin", "model.pt", "model.pth", "pytorch_model.pt")


def _refuse_pickled_weights(folder: Path, allowed: bool) -> None:
    """Unpickling runs code; a local module folder with only pickled weights is refused unless asked."""
    if allowed or not folder.is_dir():
        return
    if any(folder.glob("*.safetensors")):
        return
    pickled = [n for n in PICKLED_WEIGHTS if (folder / n).is_file()]
    if pickled:
        raise ModelError(
            f"{folder}: weights are pickled ({pickled[0]}); only model.safetensors is loaded unless "
            "allow_pickled_weights=True (unpickling can run code)"
        )
