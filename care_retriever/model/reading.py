"""The three ways a model is read: from two pretrained towers (:func:`read_towers`), from the authors' release
layout (:func:`read_release`), from a saved CARE folder (:func:`read_saved`). Each gives the parts of a model
(:class:`ModelParts`); :class:`~care_retriever.model.embedder.AsymmetricEmbedder`'s ``from_towers``,
``from_release`` and ``from_pretrained`` build the model around them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from sentence_transformers.sentence_transformer.modules import Module, Router

from care_retriever.errors import ModelError
from care_retriever.model.config import CONFIG_NAME, QUERY_PROMPT_TEMPLATE, CareConfig, TowerInfo
from care_retriever.model.encoding import logger
from care_retriever.model.pairing import TowerPairing
from care_retriever.model.towers import release
from care_retriever.model.towers.adapters import attach_adapter
from care_retriever.model.towers.adapters import merge_lora as merge_lora_modules
from care_retriever.model.towers.loading import hub_options, local_model_dir, model_file
from care_retriever.model.towers.modules import (
    REMOTE_CODE_FLAG,
    PretrainedTower,
    load_saved_module,
    read_tower,
    tower_native_dim,
    tower_output_dim,
    tower_precision,
)
from care_retriever.model.towers.prompts import literal_template
from care_retriever.model.towers.tokenizer import append_nothing, appended_tokens, ensure_eos_appended
from care_retriever.runtime.architecture import is_decoder
from care_retriever.runtime.device import resolve_attn_implementation, resolve_device, resolve_dtype

Load = Literal["both", "query", "document"]
ROUTES: dict[str, tuple[str, ...]] = {
    "both": ("query", "document"),
    "query": ("query",),
    "document": ("document",),
}


@dataclass(frozen=True)
class ModelParts:
    """What a model is built from: its config, the modules of each tower it loaded (None: not loaded), its device."""

    config: CareConfig
    query: list[Module] | None
    document: list[Module] | None
    device: torch.device


def read_towers(
    query_model: str,
    document_model: str | None = None,
    pairing: TowerPairing | None = None,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = "auto",
) -> ModelParts:
    """Two pretrained towers paired: see :meth:`AsymmetricEmbedder.from_towers
    <care_retriever.model.embedder.AsymmetricEmbedder.from_towers>`."""
    p = pairing or TowerPairing()
    authors = p.convention == release.CONVENTION
    dev = resolve_device(device)

    def read(
        folder: str,
    ) -> PretrainedTower:  # each tower in its own precision: dtype "auto"/"saved" read its config
        return read_tower(
            folder,
            max_length=p.max_length,
            dtype=resolve_dtype(dtype, dev, *tower_precision(folder)),
            trust_remote_code=p.trust_remote_code,
            allow_pickled_weights=p.allow_pickled_weights,
        )

    q_tower = read(release.readable_folder(query_model))
    q_pool = p.query_pooling or ("cls" if authors else None) or q_tower.pooling
    q_pool = q_pool or ("last_token" if is_decoder(q_tower.transformer) else "cls")
    if q_pool == "last_token" and not authors:
        ensure_eos_appended(q_tower.transformer.tokenizer, query_model)
    q_mods = q_tower.modules(q_pool, normalize_first=authors)
    if document_model is None:
        d_tower, d_mods, d_pool = q_tower, q_mods, q_pool
        mode: Literal["asymmetric", "symmetric"] = "symmetric"
    else:
        d_tower = read(release.readable_folder(document_model))
        if p.document_adapter:
            attach_adapter(d_tower.transformer, p.document_adapter, p.merge_adapter, document_model)
        d_pool = p.document_pooling or ("last_token" if authors else None) or d_tower.pooling or "last_token"
        if authors:
            if append_nothing(d_tower.transformer.tokenizer, document_model):
                logger.info("document tower tokenizer (%s) appends nothing, as the authors read it", document_model)
        elif d_pool == "last_token" and ensure_eos_appended(d_tower.transformer.tokenizer, document_model):
            logger.info("document tower tokenizer (%s) now appends its EOS token", document_model)
        d_mods = d_tower.modules(d_pool, output_dim=tower_output_dim(q_mods), normalize_first=authors)
        mode = "asymmetric"
    # the authors' conventions, as a release read as it is records them (its template is the "auto" one here)
    conventions = release.authors_conventions() if authors else {}
    if p.query_prompt_template == "auto":
        own = q_tower.prompts.get("query")
        template = conventions.get("query_prompt_template") or (
            literal_template(own) if own else (QUERY_PROMPT_TEMPLATE if q_pool == "last_token" else None)
        )
    else:
        template = p.query_prompt_template
    conventions.pop("query_prompt_template", None)
    conventions.pop("default_instruction", None)  # the argument's default is the same retrieval instruction
    config = CareConfig(
        mode=mode,
        dim=tower_output_dim(q_mods),
        query=TowerInfo(
            q_pool,
            tower_native_dim(q_mods),
            p.max_length,
            query_model,
            q_tower.remote_code,
            appended_tokens(q_tower.transformer.tokenizer),
        ),
        document=TowerInfo(
            d_pool,
            tower_native_dim(d_mods),
            p.max_length,
            document_model or query_model,
            d_tower.remote_code,
            appended_tokens(d_tower.transformer.tokenizer),
        ),
        query_prompt_template=template,
        default_instruction=p.default_instruction if template and "{instruction}" in template else None,
        document_prompt=d_tower.prompts.get("document"),
        preset=p.preset,
        **conventions,
    )
    return ModelParts(config, q_mods, d_mods, dev)


def read_release(
    model_name_or_path: str | os.PathLike[str],
    load: Load = "both",
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = "auto",
    trust_remote_code: bool = False,
    allow_pickled_weights: bool = False,
    attn_implementation: str | None = None,
) -> ModelParts:
    """A model in the authors' release layout: see :meth:`AsymmetricEmbedder.from_release
    <care_retriever.model.embedder.AsymmetricEmbedder.from_release>`."""
    if load not in ROUTES:
        raise ModelError(f"Unknown load {load!r}. Available: {sorted(ROUTES)}")
    name = str(model_name_or_path)
    layout = release.find_release(name, need=ROUTES[load])
    if layout is None:
        raise ModelError(
            f"{name}: not a model in the authors' layout (no {release.QUERY_FOLDER}/ and {release.DOCUMENT_FOLDER}/)"
        )
    release.say_licence(layout.root, name)
    dev = resolve_device(device)

    def read(
        folder: str,
    ) -> PretrainedTower:  # each tower in its own precision: dtype "auto"/"saved" read its config
        torch_dtype = resolve_dtype(dtype, dev, *tower_precision(folder))
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
    q_tower = read(release.readable_folder(str(layout.query), name))
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
    return ModelParts(config, q_mods, d_mods, dev)


def read_saved(
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
) -> ModelParts:
    """A saved CARE model (a folder or hub id; a folder in the authors' release layout is read by
    :func:`read_release`): see :meth:`AsymmetricEmbedder.from_pretrained
    <care_retriever.model.embedder.AsymmetricEmbedder.from_pretrained>`."""
    if load not in ROUTES:
        raise ModelError(f"Unknown load {load!r}. Available: {sorted(ROUTES)}")
    name = str(model_name_or_path)
    local = local_model_dir(name)
    if local is not None:
        name = str(local)  # "~" expanded: every later lookup sees the folder
    hub = hub_options(token=token, cache_folder=cache_folder, revision=revision)
    if model_file(name, CONFIG_NAME, hub) is None and release.find_release(name, need=()) is not None:
        return read_release(
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
                loaded[module_id] = load_saved_module(
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
            merge_lora_modules(modules)
        routes[route] = modules
    return ModelParts(config, routes.get("query"), routes.get("document"), dev)
