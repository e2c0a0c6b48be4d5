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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.modules import Module, Normalize, Router, Transformer
from sentence_transformers.util import import_module_class
from tqdm.auto import tqdm

from care_retriever import __version__
from care_retriever.errors import ModelError
from care_retriever.model.batch_limits import DOCUMENT_BATCH_SIZE
from care_retriever.model.config import (  # also re-exported for earlier callers (care_retriever.old_paths)
    CONFIG_NAME,
    DEFAULT_INSTRUCTION,
    FORMAT_VERSION,  # noqa: F401
    QUERY_PROMPT_TEMPLATE,
    CareConfig,
    TowerInfo,
)
from care_retriever.model.encoding import BatchLimits, check_texts, encode_texts, logger
from care_retriever.model.fingerprint import weights_fingerprint
from care_retriever.model.loading import (
    hub_options,
    local_model_dir,
    model_file,
    replace_folder,
)
from care_retriever.model.prompts import literal_template
from care_retriever.model.protocols import ConfiguredEmbedder
from care_retriever.model.runtime import (  # the last five also re-exported for earlier callers (old_paths)
    DTYPES,  # noqa: F401
    auto_dtype,  # noqa: F401
    flash_attn_installed,  # noqa: F401
    gpu_dtype,  # noqa: F401
    native_bf16,  # noqa: F401
    resolve_attn_implementation,
    resolve_device,
    resolve_dtype,
)
from care_retriever.model.towers import release
from care_retriever.model.towers.modules import (
    DEFAULT_MAX_LENGTH,
    REMOTE_CODE_FLAG,
    PretrainedTower,
    lift_model_code,
    pooling_mode,
    read_tower,
    refuse_pickled_weights,
    tower_native_dim,
    tower_output_dim,
    tower_pretrained_dtype,
)
from care_retriever.model.towers.tokenizer import append_nothing, appended_tokens, ensure_eos_appended

Load = Literal["both", "query", "document"]
Side = Literal["query", "document"]
ROUTES: dict[str, tuple[str, ...]] = {
    "both": ("query", "document"),
    "query": ("query",),
    "document": ("document",),
}


def _assemble(modules: list[Module], device: torch.device, config: CareConfig) -> SentenceTransformer:
    # A tower that normalises before its Matryoshka cut carries its own Normalize: nothing renormalises after.
    tail: list[Module] = [Normalize()] if config.normalize == "after_truncation" else []
    return SentenceTransformer(
        modules=[*modules, *tail], device=str(device), similarity_fn_name=config.similarity, prompts={}
    )


def _merge_lora(modules: list[Module]) -> None:
    """Fold LoRA adapters into the base weights: inference then costs what the plain model costs."""
    for module in modules:
        if isinstance(module, Transformer):
            model = module.auto_model
            if hasattr(model, "merge_and_unload") and hasattr(model, "peft_config"):
                module.model = model.merge_and_unload()


@dataclass(frozen=True)
class Tower:
    """One tower of a model as a value: its sentence-transformers modules, what ``care_config.json`` records of
    it, and for a document tower its weights' fingerprint where known (hashing a 4B tower takes tens of seconds).

    The modules are shared, not copied: :meth:`AsymmetricEmbedder.with_tower` builds a new model around them,
    and code that changes their weights in place says so with :meth:`retrained`.
    """

    modules: list[Module]
    info: TowerInfo
    weights: str | None = None

    @property
    def transformer(self) -> Transformer:
        for module in self.modules:
            if isinstance(module, Transformer):
                return module
        raise ModelError("the tower has no Transformer module")

    def with_pooling(self, pooling: str) -> Tower:
        """This tower pooling with ``pooling`` (cls | mean | last_token); a pooling has no weights to hash."""
        from sentence_transformers.sentence_transformer.modules import Pooling

        mode = pooling_mode(pooling)
        modules: list[Module] = [
            Pooling(m.get_embedding_dimension(), pooling_mode=mode) if isinstance(m, Pooling) else m
            for m in self.modules
        ]
        return replace(self, modules=modules, info=replace(self.info, pooling=pooling))

    def with_max_length(self, max_length: int) -> Tower:
        """This tower reading at most ``max_length`` tokens per text. The limit is set on the shared Transformer
        module (there is no copy to set it on): the model the tower came from is meant to be replaced."""
        self.transformer.max_seq_length = max_length
        return replace(self, info=replace(self.info, max_length=max_length))

    def retrained(self) -> Tower:
        """This tower after its weights changed in place (training): its fingerprint is hashed again when asked."""
        return replace(self, weights=None)


class AsymmetricEmbedder(ConfiguredEmbedder):
    """Encode queries with the query tower and documents with the document tower.

    Build one from two pretrained towers with :meth:`from_towers`, or load a saved model with
    :meth:`from_pretrained`. ``embed_queries`` / ``embed_documents`` return L2-normalised float32
    arrays of width :attr:`dim`. The config it is built with is never changed: :meth:`with_tower` and
    :meth:`with_config` give a new model, and a save writes a copy (:meth:`saved_config`).
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
        # The document weights' fingerprint: the one the loaded config records, else hashed once when first asked
        # (document_weights), kept here and not in the config.
        self._weights = config.space_fingerprint
        self.query_modules = query_modules
        self.document_modules = document_modules
        self._query_model = _assemble(query_modules, self.device, config) if query_modules else None
        self._document_model = _assemble(document_modules, self.device, config) if document_modules else None
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
        document_pooling: str | None = None,
        query_prompt_template: str | Literal["auto"] | None = "auto",
        default_instruction: str = DEFAULT_INSTRUCTION,
        max_length: int = DEFAULT_MAX_LENGTH,
        document_adapter: str | None = None,
        merge_adapter: bool = True,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = "auto",
        trust_remote_code: bool = False,
        allow_pickled_weights: bool = False,
        preset: str | None = None,
        convention: str | None = None,
    ) -> AsymmetricEmbedder:
        """Pair two pretrained towers (hub ids or folders); ``document_model=None`` is symmetric.

        Each tower is read the way its own library reads it (:func:`read_tower`): a sentence-transformers
        folder (Qwen3-Embedding, bge, gte) keeps its pooling, prompts and tokenizer; a bare checkpoint
        (Qwen3-4B) gets ``cls`` pooling if it is an encoder, ``last_token`` over an appended EOS if it is a
        decoder. ``query_pooling`` / ``document_pooling`` override that. The document tower is truncated
        (Matryoshka) to the query tower's width. ``query_prompt_template`` ``"auto"``: the query tower's
        own query prompt where its folder declares one, else the instruction form for decoder query towers
        and none for BERT towers. ``trust_remote_code`` lets a tower run code shipped with it (recorded per
        tower; every later load must pass it again); ``allow_pickled_weights`` reads ``pytorch_model.bin``.
        ``convention="authors-release"``: the conventions of the authors' released models
        (:mod:`care_retriever.model.towers.release`): [CLS] queries with their instruction format and table, a
        document tokenizer that appends nothing (the last text token is pooled), normalisation at full width
        before the cut, dot-product scores. A gte query tower saved in the original ``new`` format is read
        natively as transformers' ``GteModel`` (its own code does not run under transformers 5).
        """
        if convention not in (None, release.CONVENTION):
            raise ModelError(f"Unknown convention {convention!r}. Available conventions: [{release.CONVENTION!r}]")
        authors = convention == release.CONVENTION
        dev = resolve_device(device)

        def read(
            folder: str,
        ) -> PretrainedTower:  # each tower in its own precision: dtype "auto"/"saved" read its config
            return read_tower(
                folder,
                max_length=max_length,
                dtype=resolve_dtype(dtype, dev, tower_pretrained_dtype(folder)),
                trust_remote_code=trust_remote_code,
                allow_pickled_weights=allow_pickled_weights,
            )

        q_tower = read(_readable_folder(query_model))
        q_pool = query_pooling or ("cls" if authors else None) or q_tower.pooling
        q_pool = q_pool or ("last_token" if is_decoder(q_tower.transformer) else "cls")
        if q_pool == "last_token" and not authors:
            ensure_eos_appended(q_tower.transformer.tokenizer, query_model)
        q_mods = q_tower.modules(q_pool, normalize_first=authors)
        if document_model is None:
            d_tower, d_mods, d_pool = q_tower, q_mods, q_pool
            mode: Literal["asymmetric", "symmetric"] = "symmetric"
        else:
            d_tower = read(_readable_folder(document_model))
            if document_adapter:
                _attach_adapter(d_tower.transformer, document_adapter, merge_adapter, document_model)
            d_pool = document_pooling or ("last_token" if authors else None) or d_tower.pooling or "last_token"
            if authors:
                if append_nothing(d_tower.transformer.tokenizer, document_model):
                    logger.info("document tower tokenizer (%s) appends nothing, as the authors read it", document_model)
            elif d_pool == "last_token" and ensure_eos_appended(d_tower.transformer.tokenizer, document_model):
                logger.info("document tower tokenizer (%s) now appends its EOS token", document_model)
            d_mods = d_tower.modules(d_pool, output_dim=tower_output_dim(q_mods), normalize_first=authors)
            mode = "asymmetric"
        # the authors' conventions, as a release read as it is records them (its template is the "auto" one here)
        conventions = release.authors_conventions() if authors else {}
        if query_prompt_template == "auto":
            own = q_tower.prompts.get("query")
            template = conventions.get("query_prompt_template") or (
                literal_template(own) if own else (QUERY_PROMPT_TEMPLATE if q_pool == "last_token" else None)
            )
        else:
            template = query_prompt_template
        conventions.pop("query_prompt_template", None)
        conventions.pop("default_instruction", None)  # the argument's default is the same retrieval instruction
        config = CareConfig(
            mode=mode,
            dim=tower_output_dim(q_mods),
            query=TowerInfo(
                q_pool,
                tower_native_dim(q_mods),
                max_length,
                query_model,
                q_tower.remote_code,
                appended_tokens(q_tower.transformer.tokenizer),
            ),
            document=TowerInfo(
                d_pool,
                tower_native_dim(d_mods),
                max_length,
                document_model or query_model,
                d_tower.remote_code,
                appended_tokens(d_tower.transformer.tokenizer),
            ),
            query_prompt_template=template,
            default_instruction=default_instruction if template and "{instruction}" in template else None,
            document_prompt=d_tower.prompts.get("document"),
            preset=preset,
            **conventions,
        )
        return cls(config, q_mods, d_mods, device=dev)

    @classmethod
    def from_release(
        cls,
        model_name_or_path: str | os.PathLike[str],
        load: Load = "both",
        *,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = "auto",
        trust_remote_code: bool = False,
        allow_pickled_weights: bool = False,
        attn_implementation: str | None = None,
    ) -> AsymmetricEmbedder:
        """Load a model in the authors' release layout (``query_encoder/`` + ``doc_encoder/``, a folder or hub id),
        read exactly as the authors' inference code reads it (:mod:`care_retriever.model.towers.release`).

        ``load="query"`` reads only the query tower (a search process); the document space's fingerprint then
        comes from the document tower's file hashes. A model whose card declares a non-commercial licence says
        so once, in one line.
        """
        if load not in ROUTES:
            raise ModelError(f"Unknown load {load!r}. Available: {sorted(ROUTES)}")
        name = str(model_name_or_path)
        layout = release.find_release(name, need=ROUTES[load])
        if layout is None:
            raise ModelError(
                f"{name}: not a model in the authors' layout "
                f"(no {release.QUERY_FOLDER}/ and {release.DOCUMENT_FOLDER}/)"
            )
        release.say_licence(layout.root, name)
        dev = resolve_device(device)

        def read(
            folder: str,
        ) -> PretrainedTower:  # each tower in its own precision: dtype "auto"/"saved" read its config
            torch_dtype = resolve_dtype(dtype, dev, tower_pretrained_dtype(folder))
            attention = resolve_attn_implementation(attn_implementation, dev, torch_dtype)
            return read_tower(
                folder,
                max_length=release.AUTHORS_MAX_LENGTH,
                dtype=torch_dtype,
                trust_remote_code=trust_remote_code,
                allow_pickled_weights=allow_pickled_weights,
                model_kwargs={"attn_implementation": attention} if attention else None,
            )

        config = CareConfig.from_release(layout)
        q_tower = read(_readable_folder(str(layout.query), name))
        q_mods = q_tower.modules("cls", output_dim=config.dim, normalize_first=True)
        config.query.appended_tokens = appended_tokens(q_tower.transformer.tokenizer)
        config.query.trust_remote_code = q_tower.remote_code
        d_mods: list[Module] | None = None
        if "document" in ROUTES[load]:
            release.check_document_folder(layout.document, name)
            d_tower = read(str(layout.document))
            append_nothing(d_tower.transformer.tokenizer, f"{name}/{release.DOCUMENT_FOLDER}")
            d_mods = d_tower.modules("last_token", output_dim=config.dim, normalize_first=True)
            config.document.trust_remote_code = d_tower.remote_code
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
        attn_implementation: str | None = None,
    ) -> AsymmetricEmbedder:
        """Load a saved CARE model (torch towers) from a folder or hub id; ``load`` picks the towers to build.

        A search process loads its query side with :func:`care_retriever.search.backends.load_query_embedder`,
        which picks the backend (torch, or the folder's ONNX / OpenVINO export). Model code from the hub
        (``trust_remote_code``) and pickled weights (``allow_pickled_weights``) are refused unless asked for:
        both can run arbitrary code. ``attn_implementation``: see :func:`resolve_attn_implementation`
        (None: flash-attention where installed and usable, else sdpa).
        """
        if load not in ROUTES:
            raise ModelError(f"Unknown load {load!r}. Available: {sorted(ROUTES)}")
        name = str(model_name_or_path)
        local = local_model_dir(name)
        if local is not None:
            name = str(local)  # "~" expanded: every later lookup sees the folder
        hub = hub_options(token=token, cache_folder=cache_folder, revision=revision)
        if model_file(name, CONFIG_NAME, hub) is None and release.find_release(name, need=()) is not None:
            return cls.from_release(
                name,
                load,
                device=device,
                dtype=dtype,
                trust_remote_code=trust_remote_code,
                allow_pickled_weights=allow_pickled_weights,
                attn_implementation=attn_implementation,
            )
        config = CareConfig.load(name, hub)
        router_path = model_file(name, Router.config_file_name, hub)
        if router_path is None:
            raise ModelError(f"{name}: missing {Router.config_file_name}; the model folder is incomplete")
        router = json.loads(Path(router_path).read_text("utf-8"))
        dev = resolve_device(device)
        loaded: dict[str, Module] = {}
        routes: dict[str, list[Module]] = {}
        for route in ROUTES[load]:
            if route not in router["structure"]:
                raise ModelError(
                    f"No route found for task {route!r} in {name}. Available routes: {sorted(router['structure'])}"
                )
            tower: TowerInfo = getattr(config, route)
            if tower.trust_remote_code and not trust_remote_code:
                raise ModelError(
                    f"{name}: its {route} tower ({tower.base_model}) runs model code shipped with it; "
                    f"loading it needs {REMOTE_CODE_FLAG}"
                )
            modules = []
            for module_id in router["structure"][route]:
                if module_id not in loaded:
                    loaded[module_id] = _load_module(
                        name,
                        module_id,
                        router["types"][module_id],
                        hub,
                        dtype,
                        dev,
                        trust_remote_code,
                        allow_pickled_weights,
                        attn_implementation,
                    )
                modules.append(loaded[module_id])
            if merge_lora:
                _merge_lora(modules)
            routes[route] = modules
        return cls(config, routes.get("query"), routes.get("document"), device=dev)

    # ------------------------------------------------------------------ properties
    @property
    def document_dim(self) -> int:
        """Native width of the document tower, before Matryoshka truncation to :attr:`dim`."""
        return self.config.document.native_dim

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

    def document_weights(self) -> str:
        """The document tower's weights fingerprint: the one its config records, else hashed from the tower once
        and kept (in this embedder: the config stays as built or loaded).

        The space fingerprint (:attr:`space_fingerprint`) covers these weights and the document-text rule
        (:func:`care_retriever.model.fingerprint.space_fingerprint`), so a Stage-I update of the query tower alone
        keeps existing indexes valid, while any change to the document side invalidates them.
        """
        if self._weights is None:
            self._weights = self.hash_document_weights()
        return self._weights

    def hash_document_weights(self) -> str:
        """The fingerprint of the document tower's weights as they are in memory now (not kept)."""
        return weights_fingerprint(self.document_modules or [], self.config.dim)

    # ------------------------------------------------------------------ new models from this one
    def tower(self, side: Side) -> Tower:
        """The ``side`` tower as a value, with the document tower's weights fingerprint where known."""
        modules = self.query_modules if side == "query" else self.document_modules
        if modules is None:
            other = "document" if side == "query" else "query"
            raise ModelError(f"this embedder was loaded with load={other!r}; the {side} tower is not loaded")
        info: TowerInfo = getattr(self.config, side)
        return Tower(modules, replace(info), self._weights if side == "document" else None)

    def with_tower(self, side: Side, tower: Tower) -> AsymmetricEmbedder:
        """A new model with its ``side`` tower replaced by ``tower`` (the other tower shared, not copied); a new
        document tower brings its own weights fingerprint (None: hashed when asked)."""
        query, document = self.query_modules, self.document_modules
        query_info, document_info = replace(self.config.query), replace(self.config.document)
        if side == "query":
            query, query_info, weights = tower.modules, replace(tower.info), self._weights
        else:
            document, document_info, weights = tower.modules, replace(tower.info), tower.weights
        config = replace(self.config, query=query_info, document=document_info, space_fingerprint=weights)
        return AsymmetricEmbedder(config, query, document, device=self.device)

    def with_config(self, **changes: Any) -> AsymmetricEmbedder:
        """A new model over the same towers whose config has ``changes`` (CareConfig fields)."""
        config = replace(self.config, **{"space_fingerprint": self._weights, **changes})
        return AsymmetricEmbedder(config, self.query_modules, self.document_modules, device=self.device)

    def saved_config(self) -> CareConfig:
        """The config a save writes: this one with the document weights' fingerprint and this package's version."""
        return replace(self.config, space_fingerprint=self.document_weights(), care_retriever_version=__version__)

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

    def embed_documents(
        self,
        texts: Sequence[str],
        *,
        batch_size: int = DOCUMENT_BATCH_SIZE,
        max_batch_tokens: int | None = None,
        show_progress: bool = False,
        limits: BatchLimits | None = None,
        progress: tqdm | None = None,
        stats: dict[str, int] | None = None,
    ) -> np.ndarray:
        """Encode documents with the document tower and its document prompt: ``(len(texts), dim)`` float32, unit norm.

        ``max_batch_tokens``: also at most that many padded tokens per forward pass; a batch that runs out
        of GPU memory is halved and retried (:func:`care_retriever.model.encoding.encode_texts`). ``limits``,
        ``progress``, ``stats``: see :meth:`care_retriever.model.protocols.DocumentEncoder.embed_documents`.
        """
        texts = check_texts(texts, "documents")
        return encode_texts(
            self.document_model,
            texts,
            prompt=self.config.document_prompt,
            batch_size=batch_size,
            max_batch_tokens=max_batch_tokens,
            limits=limits,
            show_progress=show_progress,
            desc="Encoding documents",
            unit="doc",
            progress=progress,
            stats=stats,
        )

    # ------------------------------------------------------------------ saving
    def to_sentence_transformer(self) -> SentenceTransformer:
        """One ``SentenceTransformer`` with a ``Router`` over both towers (shared parameters)."""
        if self.query_modules is None or self.document_modules is None:
            raise ModelError("saving or training needs both towers; load the model with load='both'")
        router = Router.for_query_document(self.query_modules, self.document_modules, default_route="document")
        prompts = {"query": self.query_prompt() or "", "document": self.config.document_prompt or ""}
        # Towers that normalise before the Matryoshka cut hold their own Normalize (nothing after the router).
        tail: list[Module] = [Normalize()] if self.config.normalize == "after_truncation" else []
        return SentenceTransformer(
            modules=[router, *tail],
            device=str(self.device),
            prompts=prompts,
            similarity_fn_name=self.config.similarity,
        )

    def save_pretrained(self, path: str | os.PathLike[str]) -> Path:
        """Write the model to ``path`` atomically (a temp folder renamed into place)."""
        target = Path(path)
        st = self.to_sentence_transformer()
        # hashed again: the tower may have been trained in place since it was hashed; kept as what was saved
        self._weights = self.hash_document_weights()
        config = self.saved_config()
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            st.save(str(tmp))
            lift_model_code(tmp)
            (tmp / CONFIG_NAME).write_text(config.to_json(), encoding="utf-8")
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
def _readable_folder(name: str, source: str | None = None) -> str:
    """``name``, or for a local gte tower in the original ``new`` format a folder transformers reads natively."""
    local = Path(name).expanduser()
    if local.is_dir() and release.is_new_format(local):
        return str(release.native_gte_folder(local, source or name))
    return name


def is_decoder(transformer: Transformer) -> bool:
    """Whether the tower is a decoder (causal attention) rather than a bidirectional encoder."""
    config = transformer.auto_model.config
    archs = getattr(config, "architectures", None) or []
    return (
        bool(getattr(config, "is_decoder", False))
        or any("CausalLM" in a for a in archs)
        or config.model_type in {"qwen2", "qwen3", "llama", "mistral", "gemma", "gemma2", "gemma3", "phi3", "gpt2"}
    )


def _attach_adapter(transformer: Transformer, adapter: str, merge: bool, base_name: str) -> None:
    """Apply a LoRA adapter to the document tower, read as the task peft saved it for.

    Adapters published for an LLM are usually peft ``CAUSAL_LM`` adapters: their keys and target
    modules name the causal-LM wrapper (``model.layers.N...``), and ``PeftModelForCausalLM`` needs the
    wrapper's generation methods. The tower holds the bare decoder (``AutoModel``), so such an adapter
    is applied to a causal-LM shell built around it without weights (its head stays on the meta device
    and is never run), merged, and the decoder taken back out.
    """
    from peft import PeftConfig, PeftModel
    from transformers import AutoModelForCausalLM

    try:
        peft_config = PeftConfig.from_pretrained(adapter)
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot load LoRA adapter {adapter!r}: {str(exc).splitlines()[0]}") from exc
    decoder = transformer.auto_model
    causal = str(getattr(peft_config.task_type, "value", peft_config.task_type)) == "CAUSAL_LM"
    if causal and not merge:
        raise ModelError(f"LoRA adapter {adapter!r} is a CAUSAL_LM adapter: the document tower takes it merged")
    host: torch.nn.Module = decoder
    if causal:
        with torch.device("meta"):
            host = AutoModelForCausalLM.from_config(decoder.config)
        host.model = decoder
    try:
        model = PeftModel.from_pretrained(host, adapter)
    except (OSError, ValueError, RuntimeError, KeyError, AttributeError) as exc:
        raise ModelError(
            f"cannot apply LoRA adapter {adapter!r} (trained on {peft_config.base_model_name_or_path!r}) to the "
            f"document tower {base_name!r}: {str(exc).splitlines()[0]}"
        ) from exc
    if not merge:
        # A PeftModel forwards to the PreTrainedModel it wraps: the tower runs it in that one's place.
        transformer.model = model  # type: ignore[assignment]
        return
    merged = model.merge_and_unload()
    transformer.model = merged.model if causal else merged


def _load_module(
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
    module_class = import_module_class(class_ref, model_name_or_path=name, trust_remote_code=False)
    if not issubclass(module_class, Module):
        raise ModelError(f"{name}/{module_id}: {class_ref} is not a sentence-transformers module")
    refuse_pickled_weights(Path(name) / module_id, allow_pickled_weights)
    if issubclass(module_class, Transformer):
        # each tower in its own precision ("auto" keeps a bf16-pretrained tower off fp16): read from the
        # transformer's own config.json, the only module that has weights to cast
        saved = model_file(name, f"{module_id}/config.json", hub)
        torch_dtype = resolve_dtype(dtype, device, tower_pretrained_dtype(str(Path(saved).parent)) if saved else None)
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
