"""The models a training run holds: the starting model built or loaded (:func:`initial_model`), a stage's model
loaded in the dtypes it trains in (:func:`load_model`) and saved each tower in its own (:func:`save_model`), the
exports a stage asks for (:func:`export_model`), and the recipe's edits of a model (pooling, max length, query
prompt template), each returning a new model.
"""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from care_retriever.errors import InputError, ModelError
from care_retriever.model.pairing import TowerPairing
from care_retriever.training.pairs import resolve_data_path
from care_retriever.training.recipe_spec import ModelSpec, Recipe
from care_retriever.training.run_folder import foundation_dir

if TYPE_CHECKING:
    import torch

    from care_retriever.model.embedder import AsymmetricEmbedder
    from care_retriever.model.tower import Side

logger = logging.getLogger("care_retriever")
SIDES: tuple[Side, ...] = ("query", "document")


def vocab_files(recipe: Recipe, data_dir: Path) -> list[Path]:
    """Tokenizer training text: the model's ``vocab_from``, else every data set of the recipe."""
    names = recipe.model.vocab_from or [spec.path for spec in recipe.datasets.values()]
    files = [resolve_data_path(name, data_dir) for name in names]
    for file in files:
        if not file.is_file():
            raise InputError(f"model.vocab_from: file not found: {file}")
    return files


def load_model(
    folder: str | Path, spec: ModelSpec, device: str | None, defaults: dict[str, Any] | None = None
) -> AsymmetricEmbedder:
    """A saved CARE model (a stage's output, ``init``, a ``path`` or foundation), loaded for training in
    the dtypes it trains in (:func:`~care_retriever.training.precision.held_dtypes`: fp32, except a bf16
    document tower that a bf16 GPU run trains through LoRA), with the recipe's ``trust_remote_code`` for
    towers that ship their own code (every load needs it again: the saved folder records that)."""
    from care_retriever.model.embedder import AsymmetricEmbedder
    from care_retriever.training.precision import PRETRAINED_DTYPE_KEY, held_dtypes

    recorded: dict[str, Any] = {}
    with_config = Path(folder) / "care_config.json"
    if with_config.is_file():
        recorded = json.loads(with_config.read_text("utf-8")).get("extra", {}).get(PRETRAINED_DTYPE_KEY) or {}
    held = held_dtypes(defaults or {}, recorded, device)
    load = functools.partial(
        AsymmetricEmbedder.from_pretrained, folder, device=device, trust_remote_code=spec.trust_remote_code
    )
    if held["query"] == held["document"]:
        return load(load="both", dtype=held["document"])
    # each tower read from its files in its own dtype: a bf16 round trip would cut the fp32 query tower
    query, document = load(load="query", dtype=held["query"]), load(load="document", dtype=held["document"])
    return document.with_tower("query", query.tower("query"))


def hold_in(embedder: AsymmetricEmbedder, held: dict[str, str]) -> AsymmetricEmbedder:
    """Cast each tower's transformer to the dtype ``held`` names for it (a no-op where it already is)."""
    from care_retriever.model.saving import cast_tower
    from care_retriever.runtime.device import resolve_dtype

    for side in SIDES:
        if side in held:
            cast_tower(embedder, side, resolve_dtype(held[side], embedder.device))
    return embedder


def tower_transformer(embedder: AsymmetricEmbedder, side: Side) -> torch.nn.Module:
    return embedder.tower(side).transformer.auto_model


def initial_model(spec: ModelSpec, recipe: Recipe, data_dir: Path, seed: int, device: str | None) -> AsymmetricEmbedder:
    from care_retriever.model.embedder import AsymmetricEmbedder
    from care_retriever.model.towers.modules import tower_pretrained_dtype
    from care_retriever.training.precision import PRETRAINED_DTYPE_KEY

    if spec.preset:
        from care_retriever.model.scratch import init_from_scratch

        logger.info("Training tokenizers and building a random %r model ...", spec.preset)
        embedder = init_from_scratch(
            spec.preset,
            vocab_files(recipe, data_dir),
            seed=seed,
            device=device,
            query_config=spec.query_config,
            document_config=spec.document_config,
        )
    elif spec.path:
        embedder = load_model(spec.path, spec, device, recipe.defaults)
    elif spec.foundation:
        embedder = load_model(foundation_dir(spec.foundation), spec, device, recipe.defaults)
    elif spec.query_model is None:
        raise InputError("model: give query_model (and document_model), path or foundation")
    else:
        from care_retriever.training.precision import held_dtypes

        # Loading rewrites the loaded configs' dtype: the checkpoints' own is read from their files and
        # kept in care_config.json, so every later stage (and resume) knows Qwen3 is bf16.
        pretrained = {
            "query": tower_pretrained_dtype(spec.query_model),
            "document": tower_pretrained_dtype(spec.document_model or spec.query_model),
        }
        embedder = AsymmetricEmbedder.from_towers(
            spec.query_model,
            spec.document_model,
            TowerPairing(trust_remote_code=spec.trust_remote_code, convention=spec.convention),
            device=device,
            dtype="fp32",  # one dtype for both towers: the document tower is cast to its own below
        )
        hold_in(embedder, held_dtypes(recipe.defaults, pretrained, device))
        embedder = embedder.with_config(extra={**embedder.config.extra, PRETRAINED_DTYPE_KEY: pretrained})
    if spec.dim is not None and spec.dim != embedder.dim:
        raise ModelError(
            f"dimension mismatch: the recipe says model.dim {spec.dim}, the model's shared dim is {embedder.dim}"
        )
    if spec.query_pooling:
        embedder = set_pooling(embedder, "query", spec.query_pooling)
    if spec.document_pooling:
        embedder = set_pooling(embedder, "document", spec.document_pooling)
    if spec.max_length:
        embedder = set_max_length(embedder, spec.max_length)
    if spec.query_prompt_template is not None:
        embedder = set_query_prompt_template(embedder, spec.query_prompt_template)
    return embedder


def set_pooling(embedder: AsymmetricEmbedder, side: Side, pooling: str) -> AsymmetricEmbedder:
    """A new embedder whose ``side`` tower pools with ``pooling`` (cls | mean | last_token)."""
    return embedder.with_tower(side, embedder.tower(side).with_pooling(pooling))


def set_max_length(embedder: AsymmetricEmbedder, max_length: int) -> AsymmetricEmbedder:
    """A new embedder that trains (and later serves) with at most ``max_length`` tokens per text on both towers."""
    for side in SIDES:
        embedder = embedder.with_tower(side, embedder.tower(side).with_max_length(max_length))
    return embedder


def set_query_prompt_template(embedder: AsymmetricEmbedder, template: str) -> AsymmetricEmbedder:
    """``embedder`` with the recipe's ``model.query_prompt_template`` (kept in its saved care_config.json); a
    template with an ``{instruction}`` slot gets the default instruction where the model has none."""
    from care_retriever.model.towers.prompts import DEFAULT_INSTRUCTION

    instruction = (embedder.config.default_instruction or DEFAULT_INSTRUCTION) if "{instruction}" in template else None
    return embedder.with_config(query_prompt_template=template, default_instruction=instruction)


def export_model(embedder: AsymmetricEmbedder, kind: str, target: Path) -> Path:
    """Save the model as is, or one of its towers on both sides (a symmetric baseline)."""
    from care_retriever.model.embedder import AsymmetricEmbedder
    from care_retriever.training.precision import PRETRAINED_DTYPE_KEY

    if kind == "asymmetric":
        return save_model(embedder, target)
    side: Side = "query" if kind == "query-symmetric" else "document"
    own = pretrained_dtypes(embedder).get(side)  # the exported tower is saved in its own dtype on both sides
    # the document tower on both sides keeps its space; the query tower's is hashed (it is small)
    tower = embedder.tower(side)
    config = replace(
        embedder.config,
        mode="symmetric",
        query=replace(tower.info),
        document=replace(tower.info),
        query_prompt_template=embedder.config.query_prompt_template if side == "query" else None,
        default_instruction=embedder.config.default_instruction if side == "query" else None,
        space_fingerprint=tower.weights,
        extra={**embedder.config.extra, "exported_as": kind, PRETRAINED_DTYPE_KEY: {"query": own, "document": own}},
    )
    return save_model(AsymmetricEmbedder(config, tower.modules, tower.modules, device=embedder.device), target)


def own_dtypes(embedder: AsymmetricEmbedder) -> dict[Side, torch.dtype]:
    """The dtype each tower is saved in: its pretrained checkpoint's (bf16 for Qwen3), else fp32."""
    import torch

    halves = {"bfloat16": torch.bfloat16, "float16": torch.float16}
    recorded = pretrained_dtypes(embedder)
    return {side: halves.get(str(recorded.get(side)), torch.float32) for side in SIDES}


def save_model(embedder: AsymmetricEmbedder, path: str | Path, *, write: bool = True) -> Path:
    """A stage's save: :func:`care_retriever.model.saving.save_model` (the one writer of a model folder) with each
    tower written in its own dtype (:func:`own_dtypes`) and the space fingerprint hashed only when it is not known
    (:data:`~care_retriever.training.runner.DOCUMENT_FROZEN`: a stage that leaves the document tower as it was keeps
    it; the runner clears it after any other stage).

    The towers are rounded to their own dtype in memory as well (and cast back to the dtype they train in), so a
    resumed run continues from exactly what an uninterrupted run continues from. A full disk leaves the earlier
    stages as they were and says, in one line, how much free space the model needs
    (:class:`~care_retriever.errors.DiskFullError`). ``write=False``: the rounding and the fingerprint only, what
    the ranks that do not write do (they must hold what rank 0 wrote).
    """
    from care_retriever.model import saving

    return saving.save_model(
        embedder,
        path,
        dtypes=own_dtypes(embedder),
        rehash=False,
        write=write,
        intact="earlier stages are intact",
        retry="free space, then continue with --resume",
    )


def pretrained_dtypes(embedder: AsymmetricEmbedder) -> dict[str, str | None]:
    """Each tower's pretraining dtype: recorded at init (care_config.json), else read from the
    checkpoint the tower was built from (a CARE folder saved outside training); None if unknown."""
    from care_retriever.model.towers.modules import tower_pretrained_dtype
    from care_retriever.training.precision import PRETRAINED_DTYPE_KEY

    recorded = embedder.config.extra.get(PRETRAINED_DTYPE_KEY)
    if isinstance(recorded, dict):
        return dict(recorded)
    found: dict[str, str | None] = {}
    for side in ("query", "document"):
        base = getattr(embedder.config, side).base_model
        found[side] = tower_pretrained_dtype(base) if base and embedder.config.preset is None else None
    return found
