"""Training recipes read: one YAML file describes the model, the data sets and the chain of stages, and becomes
the typed values of :mod:`care_retriever.training.recipe_spec` (:func:`load_recipe`, :func:`parse_recipe`; one
stage entry: :func:`build_stage`).

A recipe is validated completely before anything is written, so a typo in stage 3 fails in the
first second rather than after an hour of Stage 0. Every error is one line naming the recipe and the
key at fault. Data paths are relative to ``--data-dir`` (default ``../shared/data``); training
arguments go straight to ``SentenceTransformerTrainingArguments`` (unknown names are rejected).

Shape of a recipe (see ``training/recipes/*.yaml``)::

    name: miniature
    seed: 0
    model: {preset: mini, vocab_from: [train/kuake-qtr-train.jsonl], dim: 256}
    datasets:
      qtr: {path: train/kuake-qtr-train.jsonl, format: qtr, min_label: 2}
    defaults: {per_device_train_batch_size: 64, learning_rate: 1.0e-4, max_length: 64}
    stages:
      - {name: stage0-query, type: stage0_query, datasets: [qtr]}
      - {name: stage1, type: stage1_align, alignment: {queries: [qtr], documents: [qtr]}}
    final: stage1
"""

from __future__ import annotations

import dataclasses
from collections.abc import Set
from pathlib import Path
from typing import Any

from care_retriever.errors import InputError
from care_retriever.indexing.config import COMPILE_MODES, FORWARD_PATHS
from care_retriever.training.recipe_spec import (
    ALIGNMENT_KEYS,
    DATA_FORMATS,
    EXPORT_KINDS,
    HARD_NEGATIVE_KEYS,
    MODEL_SOURCES,
    MSE_TARGETS,
    OWN_DEFAULT_KEYS,
    STAGE_CLASSES,
    STAGE_TYPES,
    DatasetSpec,
    ModelSpec,
    Recipe,
    StageSpec,
)


def check_length_buckets(value: Any, where: str) -> None:
    if value is None:
        return
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
        or value != sorted(set(value))
    ):
        raise InputError(f"{where}: length_buckets must be increasing positive integers (characters), got {value!r}")


def check_forward(values: dict[str, Any], where: str) -> None:
    """The document tower's ``forward`` and ``compile`` keys, where given, name one of their choices. YAML reads
    a bare ``compile: on`` / ``off`` as a boolean: those become ``"on"`` / ``"off"`` in ``values``."""
    if isinstance(values.get("compile"), bool):
        values["compile"] = "on" if values["compile"] else "off"
    for key, choices in (("forward", FORWARD_PATHS), ("compile", COMPILE_MODES)):
        value = values.get(key)
        if value is not None and value not in choices:
            raise InputError(f"{where}: {key} must be one of {list(choices)}, got {value!r}")


def training_argument_names() -> set[str]:
    from sentence_transformers import SentenceTransformerTrainingArguments

    return {f.name for f in dataclasses.fields(SentenceTransformerTrainingArguments)}


def load_recipe(path: str | Path) -> Recipe:
    """Read and validate a YAML recipe (a bundled name like ``quickstart`` also works)."""
    import yaml

    file = resolve_recipe_path(path)
    try:
        raw = yaml.safe_load(file.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise InputError(f"{file}{where}: invalid YAML ({getattr(exc, 'problem', None) or exc})") from exc
    except OSError as exc:
        raise InputError(f"{file}: cannot read recipe ({exc.strerror})") from exc
    return parse_recipe(raw, str(file))


def resolve_recipe_path(path: str | Path) -> Path:
    file = Path(path)
    if file.is_file():
        return file
    bundled = Path(__file__).parent / "recipes" / f"{Path(path).stem}.yaml"
    if not file.suffix and bundled.is_file():
        return bundled
    names = sorted(p.stem for p in (Path(__file__).parent / "recipes").glob("*.yaml"))
    raise InputError(f"recipe not found: {path} (bundled recipes: {', '.join(names)})")


def parse_recipe(raw: Any, source: str = "<recipe>") -> Recipe:
    if not isinstance(raw, dict):
        raise InputError(f"{source}: a recipe is a YAML mapping, got {type(raw).__name__}")
    _known(
        raw,
        {"name", "seed", "model", "datasets", "defaults", "stages", "final", "description", "exclude_task_queries"},
        source,
    )
    model = _model(raw.get("model"), source)
    datasets = {name: _dataset(name, spec, source) for name, spec in _mapping(raw, "datasets", source).items()}
    defaults = _mapping(raw, "defaults", source)
    _check_args(defaults, f"{source}: defaults", allow=OWN_DEFAULT_KEYS)
    check_length_buckets(defaults.get("length_buckets"), f"{source}: defaults")
    check_forward(defaults, f"{source}: defaults")
    stages_raw = raw.get("stages")
    if not isinstance(stages_raw, list) or not stages_raw:
        raise InputError(f"{source}: 'stages' must be a non-empty list")
    stages: list[StageSpec] = []
    for i, item in enumerate(stages_raw):
        stages.append(_stage(item, i, source, stages, datasets))
    final = raw.get("final")
    if final is not None and final not in {s.name for s in stages}:
        raise InputError(f"{source}: final: no stage named {final!r}")
    seed = raw.get("seed", 0)
    if not isinstance(seed, int):
        raise InputError(f"{source}: seed must be an integer")
    exclude = raw.get("exclude_task_queries")
    if exclude is not None and (not isinstance(exclude, str) or not exclude.strip()):
        raise InputError(f"{source}: exclude_task_queries must be a folder of evaluation tasks (e.g. 'tasks')")
    return Recipe(
        name=str(raw.get("name") or Path(source).stem),
        model=model,
        datasets=datasets,
        stages=stages,
        defaults=defaults,
        seed=seed,
        final=final,
        exclude_task_queries=exclude,
        source_path=source,
        raw=raw,
    )


# ---------------------------------------------------------------------------- helpers
def _known(mapping: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(mapping) - allowed)
    if unknown:
        raise InputError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")


def _mapping(raw: dict[str, Any], key: str, source: str) -> dict[str, Any]:
    value = raw.get(key) or {}
    if not isinstance(value, dict):
        raise InputError(f"{source}: '{key}' must be a mapping")
    return value


def _check_args(args: dict[str, Any], where: str, allow: Set[str] = frozenset()) -> None:
    names = training_argument_names() | set(allow)
    unknown = sorted(set(args) - names)
    if unknown:
        raise InputError(f"{where}: unknown training argument(s) {unknown} (see SentenceTransformerTrainingArguments)")
    for owned in ("output_dir", "router_mapping", "prompts", "resume_from_checkpoint"):
        if owned in args:
            raise InputError(f"{where}: '{owned}' is set by care-retriever train; remove it from the recipe")


def _model(raw: Any, source: str) -> ModelSpec:
    if not isinstance(raw, dict):
        raise InputError(
            f"{source}: 'model' must be a mapping (preset/vocab_from, path, or query_model/document_model)"
        )
    _known(raw, {f.name for f in dataclasses.fields(ModelSpec)}, f"{source}: model")
    spec = ModelSpec(**raw)
    chosen = [k for k in MODEL_SOURCES if getattr(spec, k)]
    if len(chosen) != 1:
        raise InputError(f"{source}: model: give exactly one of {', '.join(MODEL_SOURCES)} (got {chosen or 'none'})")
    if spec.preset:
        from care_retriever.model.towers.presets import PRESETS

        if spec.preset not in PRESETS:
            raise InputError(f"{source}: model.preset {spec.preset!r} unknown; available: {sorted(PRESETS)}")
        if isinstance(spec.vocab_from, str):
            spec.vocab_from = [spec.vocab_from]
        from transformers import BertConfig, Qwen3Config

        from care_retriever.model.scratch import check_architecture

        check_architecture(BertConfig, spec.query_config, f"{source}: model.query_config")
        check_architecture(Qwen3Config, spec.document_config, f"{source}: model.document_config")
    elif spec.query_config or spec.document_config:
        raise InputError(
            f"{source}: model.query_config / model.document_config change a preset's towers; give model.preset"
        )
    if spec.dim is not None and (not isinstance(spec.dim, int) or spec.dim < 1):
        raise InputError(f"{source}: model.dim must be a positive integer")
    if spec.convention is not None:
        from care_retriever.model.towers.release import CONVENTION

        if spec.convention != CONVENTION:
            raise InputError(f"{source}: model.convention must be {CONVENTION!r}, got {spec.convention!r}")
        if not spec.query_model:
            raise InputError(f"{source}: model.convention applies to query_model/document_model towers only")
    template = spec.query_prompt_template
    if template is not None and (not isinstance(template, str) or not template.strip()):
        raise InputError(f"{source}: model.query_prompt_template must be a non-empty string")
    if template is not None:
        try:
            template.format(instruction="")
        except (KeyError, IndexError, ValueError) as exc:
            raise InputError(
                f"{source}: model.query_prompt_template {template!r}: its only slot may be {{instruction}} ({exc})"
            ) from exc
    from care_retriever.model.towers.modules import POOLING_MODES

    for key in ("query_pooling", "document_pooling"):
        value = getattr(spec, key)
        if value is not None and value not in POOLING_MODES:
            raise InputError(f"{source}: model.{key} {value!r} unknown; available: {sorted(POOLING_MODES)}")
    return spec


def _dataset(name: str, raw: Any, source: str) -> DatasetSpec:
    if isinstance(raw, str):
        raw = {"path": raw}
    if not isinstance(raw, dict) or "path" not in raw:
        raise InputError(f"{source}: datasets.{name}: expected a mapping with 'path'")
    _known(raw, {f.name for f in dataclasses.fields(DatasetSpec)} - {"name"}, f"{source}: datasets.{name}")
    spec = DatasetSpec(name=name, **raw)
    if spec.format not in DATA_FORMATS:
        raise InputError(f"{source}: datasets.{name}.format {spec.format!r} unknown; available: {list(DATA_FORMATS)}")
    return spec


def _stage(raw: Any, index: int, source: str, previous: list[StageSpec], datasets: dict[str, DatasetSpec]) -> StageSpec:
    where = f"{source}: stages[{index}]"
    if not isinstance(raw, dict):
        raise InputError(f"{where}: expected a mapping")
    name, kind = raw.get("name"), raw.get("type")
    if not name or not isinstance(name, str):
        raise InputError(f"{where}: missing 'name'")
    where = f"{source}: stage {name!r}"
    if any(s.name == name for s in previous):
        raise InputError(f"{where}: duplicate stage name")
    if kind not in STAGE_CLASSES:
        raise InputError(f"{where}: type {kind!r} unknown; available: {list(STAGE_TYPES)}")
    return build_stage(raw, where, previous=[s.name for s in previous], datasets=set(datasets))


def build_stage(
    raw: dict[str, Any], where: str, *, previous: list[str] | None = None, datasets: set[str] | None = None
) -> StageSpec:
    """The typed stage of one recipe entry; a key its type does not take is an error listing the valid ones.

    ``previous`` (earlier stage names) and ``datasets`` (defined data set names) are checked when given.
    """
    kind = raw.get("type")
    cls = STAGE_CLASSES.get(kind)  # type: ignore[arg-type]
    if cls is None:
        raise InputError(f"{where}: type {kind!r} unknown; available: {list(STAGE_TYPES)}")
    unknown = sorted(set(raw) - cls.recipe_keys())
    if unknown:
        raise InputError(
            f"{where}: a {kind} stage does not take {', '.join(map(repr, unknown))}; "
            f"valid keys: {', '.join(sorted(cls.recipe_keys()))}"
        )
    values = {("source" if k == "from" else k): v for k, v in raw.items()}
    src = values.get("source")
    if previous is not None and src is not None and src != "init" and src not in previous:
        raise InputError(f"{where}: from: {src!r} is not an earlier stage (or 'init')")
    names = values.get("datasets") or []
    values["datasets"] = [names] if isinstance(names, str) else list(names)
    alignment = values.get("alignment") or {}
    if not isinstance(alignment, dict):
        raise InputError(f"{where}: alignment must be a mapping (queries, documents)")
    _known(alignment, ALIGNMENT_KEYS, f"{where}: alignment")
    values["alignment"] = alignment if kind == "stage1_align" else values.get("alignment")
    referenced = values["datasets"] + [n for key in ("queries", "documents") for n in alignment.get(key, [])]
    for ds in referenced:
        if datasets is not None and ds not in datasets:
            raise InputError(f"{where}: dataset {ds!r} is not defined under 'datasets'")
    if kind != "stage1_align" and not values["datasets"]:
        raise InputError(f"{where}: needs 'datasets'")
    if kind == "stage1_align" and not (values["datasets"] or alignment):
        raise InputError(f"{where}: needs 'alignment' (queries/documents datasets) or 'datasets'")
    args = values.get("args") or {}
    if not isinstance(args, dict):
        raise InputError(f"{where}: 'args' must be a mapping")
    _check_args(args, f"{where}: args")
    if "ddp_timeout" in args:  # the process group is created once, before any stage, with defaults.ddp_timeout
        raise InputError(f"{where}: args: ddp_timeout is set once per run; set it in defaults")
    values["args"] = args
    export = values.get("export") or {}
    if isinstance(export, str):
        export = {export: "asymmetric"}
    for ex_name, ex_kind in export.items():
        if ex_kind not in EXPORT_KINDS:
            raise InputError(f"{where}: export {ex_name}: kind {ex_kind!r} unknown; available: {list(EXPORT_KINDS)}")
    values["export"] = export
    if values.get("teacher", "cached") not in ("cached", "recompute"):
        raise InputError(f"{where}: teacher must be 'cached' or 'recompute', got {values['teacher']!r}")
    if values.get("mse_target", "renormalised") not in MSE_TARGETS:
        raise InputError(f"{where}: mse_target must be one of {list(MSE_TARGETS)}, got {values['mse_target']!r}")
    if values.get("mse_target") == "sliced" and values.get("teacher") == "recompute":
        raise InputError(
            f"{where}: mse_target: sliced needs teacher: cached (the cache keeps the full-width rows' slice)"
        )
    for key in ("lambda1", "lambda2", "temperature", "mlm_probability", "kl_weight"):
        if values.get(key) is not None and (not isinstance(values[key], (int, float)) or values[key] < 0):
            raise InputError(f"{where}: {key} must be a non-negative number")
    if values.get("temperature") == 0:
        raise InputError(f"{where}: temperature must be > 0")
    check_length_buckets(values.get("length_buckets"), where)
    check_forward(values, where)
    for key in ("max_examples", "mini_batch_size", "max_query_texts", "max_document_texts"):
        if values.get(key) is not None and (not isinstance(values[key], int) or values[key] < 1):
            raise InputError(f"{where}: {key} must be a positive integer")
    negatives = values.get("hard_negatives")
    if negatives is not None:
        if not isinstance(negatives, dict):
            raise InputError(f"{where}: hard_negatives must be a mapping ({', '.join(sorted(HARD_NEGATIVE_KEYS))})")
        _known(negatives, HARD_NEGATIVE_KEYS, f"{where}: hard_negatives")
    if "lora" in values:
        from care_retriever.training.lora import LoraSpec

        LoraSpec.from_options(values["lora"], where)  # validated here, built by the stage
    return cls(**{k: v for k, v in values.items() if v is not None or k in ("lora",)})
