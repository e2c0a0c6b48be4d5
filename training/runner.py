"""Run a recipe: build or load the starting model, chain the stages, save ``OUT/final``.

Layout of ``OUT``::

    run.json              recipe name, fingerprint, finished stages, per-stage reports
    stages/<name>/        the model after a stage (LoRA merged; ``init`` is the starting model), each
                          tower in its own dtype (bf16 for a bf16 tower); kept while a stage still to
                          train starts from it (resume), every one with ``keep_stages``
    models/<export>/      models a stage exports (ablation baselines, symmetric variants)
    checkpoints/<name>/   trainer checkpoints of the unfinished stage (resume): its trained parameters
    logs/<name>.jsonl     loss / lr / epoch per logging step
    teacher_cache/        Stage I's memory-mapped teacher embeddings
    final/                the recipe's final model (``from_pretrained``, ``index``, ``search``, ``eval``)

Nothing is overwritten by accident: a non-empty ``OUT`` is only re-entered with ``resume=True``
and only by the same recipe (same fingerprint); finished stages are then loaded, not re-run, and
an unfinished stage continues from its last checkpoint.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from care_retriever.errors import (  # DiskFullError also importable from here for earlier callers (old_paths)
    DiskFullError,  # noqa: F401
    InputError,
    ModelError,
)
from care_retriever.training.pairs import PairSet, load_pairset, resolve_data_path, task_queries, without_queries
from care_retriever.training.recipe import ModelSpec, Recipe, Stage0DocumentStage, StageSpec

if TYPE_CHECKING:
    import torch

    from care_retriever.model.embedder import AsymmetricEmbedder
    from care_retriever.model.tower import Side
    from care_retriever.training.stages import StageContext

logger = logging.getLogger("care_retriever")
RUN_FILE = "run.json"
DRY_RUN_MAX_LENGTH = 64  # a dry run checks the wiring, not the capacity: short texts keep it minutes long
# Stage types that leave the document tower as it was: its space fingerprint (a hash of every weight,
# tens of seconds for a 4B tower) is carried over instead of computed again.
DOCUMENT_FROZEN = frozenset({"stage0_query", "stage1_align", "distill", "mlm"})
SIDES: tuple[Side, ...] = ("query", "document")


@dataclass
class RunResult:
    out: Path
    final: Path | None  # None while the final stage is not trained (a run of selected ``stages``)
    reports: list[dict[str, Any]] = field(default_factory=list)
    exports: dict[str, str] = field(default_factory=dict)


def default_data_dir() -> Path:
    """``CARE_SHARED_DATA``, else ``../shared/data`` relative to the working directory."""
    return Path(os.environ.get("CARE_SHARED_DATA", Path("..") / "shared" / "data"))


def _read_run(out: Path) -> dict[str, Any] | None:
    path = out / RUN_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text("utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: corrupted run file; use a new --out") from exc


def _write_run(out: Path, state: dict[str, Any]) -> None:
    tmp = out / f".{RUN_FILE}.tmp"
    tmp.write_text(json.dumps(state, ensure_ascii=False, indent=2), encoding="utf-8")
    os.replace(tmp, out / RUN_FILE)


def check_output(out: Path, recipe: Recipe, fingerprint: str, resume: bool) -> dict[str, Any] | None:
    """Refuse to touch a folder that holds something else; return the previous run state when resuming."""
    if not out.exists():
        return None
    if not out.is_dir():
        raise InputError(f"--out {out}: exists and is not a folder")
    if not any(out.iterdir()):
        return None
    state = _read_run(out)
    if state is None:
        raise InputError(f"--out {out}: exists, is not empty and holds no training run; nothing overwritten")
    if state.get("fingerprint") != fingerprint:
        raise InputError(
            f"--out {out}: holds a run of recipe {state.get('recipe')!r} with other settings "
            f"(fingerprint {state.get('fingerprint')} != {fingerprint}); use a new --out"
        )
    if not resume:
        raise InputError(f"--out {out}: already holds this recipe's run; pass --resume to continue it")
    return state


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
    from care_retriever.model.runtime import resolve_dtype
    from care_retriever.model.saving import cast_tower

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
        from care_retriever.model.towers.scratch import init_from_scratch

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
            device=device,
            dtype="fp32",  # one dtype for both towers: the document tower is cast to its own below
            trust_remote_code=spec.trust_remote_code,
            convention=spec.convention,
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
        from care_retriever.training.recipe import set_query_prompt_template

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
    (:data:`DOCUMENT_FROZEN`: a stage that leaves the document tower as it was keeps it; the runner clears it after
    any other stage).

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


@dataclass
class RunState:
    """What ``run.json`` records: the recipe's identity, the finished stages, their reports and exports."""

    recipe: str
    source: str
    fingerprint: str
    done: list[str] = field(default_factory=list)
    reports: list[dict[str, Any]] = field(default_factory=list)
    exports: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # init_seconds, final, foundation, ...

    @classmethod
    def resumed(cls, recipe: Recipe, fingerprint: str, previous: dict[str, Any] | None) -> RunState:
        state = cls(recipe=recipe.name, source=recipe.source_path, fingerprint=fingerprint)
        if previous:
            state.done = list(previous.get("done", []))
            state.reports = list(previous.get("reports", []))
            state.exports = dict(previous.get("exports", {}))
            known = {"recipe", "source", "fingerprint", "done", "reports", "exports"}
            state.extra = {k: v for k, v in previous.items() if k not in known}
        return state

    def save(self, out: Path) -> None:
        _write_run(
            out,
            {
                "recipe": self.recipe,
                "source": self.source,
                "fingerprint": self.fingerprint,
                "done": self.done,
                "reports": self.reports,
                "exports": self.exports,
                **self.extra,
            },
        )


def effective_recipe(recipe: Recipe, *, preset: str | None, dry_run_steps: int | None) -> Recipe:
    """The recipe this run trains: the caller's, with ``--preset`` and a dry run's max_length applied
    to a copy (the caller's recipe is left as it was)."""
    model = replace(recipe.model, vocab_from=list(recipe.model.vocab_from))
    if preset is not None:
        model = ModelSpec(
            preset=preset,
            vocab_from=model.vocab_from,
            max_length=model.max_length,
            query_pooling=model.query_pooling,
            document_pooling=model.document_pooling,
        )
    if dry_run_steps is not None:
        model.max_length = min(model.max_length or DRY_RUN_MAX_LENGTH, DRY_RUN_MAX_LENGTH)
    return replace(recipe, model=model, stages=list(recipe.stages), defaults=dict(recipe.defaults))


def foundation_dir(path: str | Path) -> Path:
    """The model folder of a foundation: a finished run's ``final``, or a saved CARE model folder."""
    folder = Path(path)
    if (folder / "care_config.json").is_file():
        return folder
    if (folder / "final" / "care_config.json").is_file():
        return folder / "final"
    hint = (
        "the run is not finished; continue it with --resume"
        if (folder / RUN_FILE).is_file()
        else "train it with `care-retriever train --recipe miniature-foundation --out DIR`"
    )
    raise InputError(f"model.foundation {folder}: no finished foundation model there ({hint})")


def foundation_fingerprint(path: str | Path) -> str:
    """What identifies a foundation: its run's fingerprint, else its saved space fingerprint."""
    model = foundation_dir(path)
    run = model.parent / RUN_FILE
    if model.name == "final" and run.is_file():
        return str(json.loads(run.read_text("utf-8")).get("fingerprint"))
    config = json.loads((model / "care_config.json").read_text("utf-8"))
    return str(config.get("space_fingerprint"))


def run_fingerprint(recipe: Recipe, *, dry_run_steps: int | None, preset: str | None) -> str:
    extra: dict[str, Any] = {"dry_run_steps": dry_run_steps, "preset": preset}
    if recipe.model.foundation:
        # Another foundation is another run: resuming on top of it is refused.
        extra["foundation"] = foundation_fingerprint(recipe.model.foundation)
    return recipe.fingerprint(**extra)


def used_datasets(recipe: Recipe) -> set[str]:
    """Data sets the stages read through ``load_pairset``: every alignment set (a ``text`` set's texts are
    paired with themselves), and the pair files of ``datasets`` (the pretraining stages read ``text``
    files raw)."""
    used: set[str] = set()
    for stage in recipe.stages:
        used |= {name for name in stage.datasets if recipe.datasets[name].format != "text"}
        alignment = getattr(stage, "alignment", None) or {}
        used |= {n for key in ("queries", "documents") for n in alignment.get(key, [])}
    return used


def preload_datasets(recipe: Recipe, data_dir: Path) -> Callable[[str], PairSet]:
    """Read and validate every data set before anything is written; returns the cached loader."""
    cache: dict[str, PairSet] = {}
    tasks = recipe.exclude_task_queries
    excluded = task_queries(resolve_data_path(tasks, data_dir)) if tasks else None

    def load(name: str) -> PairSet:
        if name not in cache:
            pairs = load_pairset(recipe.datasets[name], data_dir)
            if excluded is not None:
                pairs, dropped = without_queries(pairs, excluded)
                if dropped:
                    logger.info("data set %s: %d examples dropped (their query is an evaluation query)", name, dropped)
            cache[name] = pairs
        return cache[name]

    for name in sorted(used_datasets(recipe)):
        load(name)
    for spec in recipe.datasets.values():
        if spec.format == "text" and not resolve_data_path(spec.path, data_dir).is_file():
            raise InputError(f"data set {spec.name!r}: file not found: {resolve_data_path(spec.path, data_dir)}")
    if recipe.model.preset:
        vocab_files(recipe, data_dir)
    return load


def start_run(
    recipe: Recipe,
    out: Path,
    state: RunState,
    data_dir: Path,
    device: str | None,
    load: Callable[[str], PairSet] | None = None,
) -> AsymmetricEmbedder | None:
    """The starting model: built (and saved as ``stages/init``) on a new run, loaded on a resume.

    Under torchrun every rank loads pretrained towers (or a saved model) itself, at the same time (a
    download is shared through the hub cache's file locks), and rank 0 alone writes ``stages/init``
    while the others wait at a barrier. A preset is built by rank 0 and loaded from ``stages/init`` by
    the others: its tokenizers are trained, so each rank building its own could differ.
    """
    from care_retriever.training.engine import is_main_process, wait_for_everyone
    from care_retriever.training.stages import matryoshka_dims

    if "init" in state.done:
        return None  # a resume: each stage to train loads the stage it starts from (run_stages)
    if not is_main_process() and recipe.model.preset:
        wait_for_everyone()
        state.done = ["init"]
        return load_model(out / "stages" / "init", recipe.model, device, recipe.defaults)
    started = time.perf_counter()
    embedder = initial_model(recipe.model, recipe, data_dir, recipe.seed, device)
    for stage in recipe.stages:  # dims are checked before the first write
        if isinstance(stage, Stage0DocumentStage):
            matryoshka_dims(stage.matryoshka_dims, embedder.dim, embedder.document_dim, f"stage {stage.name!r}")
    if load is not None:  # rows' own query prompts (flag data) that the model or a stage cannot apply
        from care_retriever.training.pairs import check_row_prompts

        formats = {name: spec.format for name, spec in recipe.datasets.items()}
        check_row_prompts(recipe.stages, formats, load, embedder.config.query_prompt_template)
    if not is_main_process():
        save_model(embedder, out / "stages" / "init", write=False)  # rounded and fingerprinted as rank 0's
        wait_for_everyone()  # rank 0 has written stages/init
        state.done = ["init"]
        return embedder
    out.mkdir(parents=True, exist_ok=True)
    state.save(out)
    save_model(embedder, out / "stages" / "init")
    state.extra["init_seconds"] = round(time.perf_counter() - started, 2)
    if recipe.model.foundation:
        state.extra["foundation"] = str(foundation_dir(recipe.model.foundation))
    state.extra["seed"] = recipe.seed  # one of --seeds: the recipe file keeps the first seed only
    state.done = ["init"]
    state.save(out)
    wait_for_everyone()
    return embedder


def run_stage(ctx: StageContext, stage: StageSpec, embedder: AsymmetricEmbedder, state: RunState) -> AsymmetricEmbedder:
    """Train one stage in place, save it and its exports, record its report; returns the model after the stage."""
    from care_retriever.training.engine import is_main_process, wait_for_everyone
    from care_retriever.training.stages import STAGES, seed_everything

    started = time.perf_counter()
    if is_main_process():  # the stage's save will fit: said before it trains, not after
        from care_retriever.faults import check_free_space
        from care_retriever.model.saving import model_bytes

        size = model_bytes(embedder, own_dtypes(embedder))
        check_free_space(ctx.out, size, f"saving stage {stage.name}'s model under {ctx.out / 'stages'}")
    seed_everything(ctx.seed)
    report = STAGES[stage.type](ctx, stage, embedder)
    if stage.type not in DOCUMENT_FROZEN:
        # the document tower changed in place: a model over it as it is now, hashed once, at the save
        embedder = embedder.with_tower("document", embedder.tower("document").retrained())
    writer = is_main_process()  # under torchrun rank 0 writes; the ranks hold the same model
    # every rank rounds its towers to their saved dtypes and fingerprints them; rank 0 writes
    save_model(embedder, ctx.out / "stages" / stage.name, write=writer)
    for name, kind in stage.export.items():
        target = ctx.out / "models" / name
        state.exports[name] = str(export_model(embedder, kind, target) if writer else target)
    state.done.append(stage.name)
    # ``seconds`` is the training loop; the wall time adds data reading, teacher caching,
    # negative mining, loading and saving: what a user waits for.
    state.reports.append({**report.to_dict(), "wall_seconds": round(time.perf_counter() - started, 2)})
    if writer:
        state.save(ctx.out)
    wait_for_everyone()  # the next stage may load this one's saved model
    logger.info(
        "stage %s done: %d steps in %.1fs, loss %s -> %s",
        stage.name,
        report.steps,
        report.seconds,
        _fmt(report.first_loss),
        _fmt(report.last_loss),
    )
    return embedder


def stage_sources(recipe: Recipe) -> dict[str, str]:
    """Each stage's starting point: its ``from`` stage, else the previous stage (``init`` for the first)."""
    sources: dict[str, str] = {}
    previous = "init"
    for stage in recipe.stages:
        sources[stage.name] = stage.source or previous
        previous = stage.name
    return sources


def selected_stages(recipe: Recipe, names: Sequence[str] | None) -> set[str]:
    """The stages a run trains: every stage, or the named ones and each stage they start from.

    A later ``--resume`` without a selection trains the rest (the recipe, hence the fingerprint, is the
    same): the three seeds' Table 4 models can be trained before any seed's Table 5 variants.
    """
    sources = stage_sources(recipe)
    if not names:
        return set(sources)
    unknown = [name for name in names if name not in sources]
    if unknown:
        raise InputError(f"No stage {unknown[0]!r} in recipe {recipe.name!r}. Available stages: {list(sources)}")
    needed: set[str] = set()
    pending = list(names)
    while pending:
        name = pending.pop()
        if name != "init" and name not in needed:
            needed.add(name)
            pending.append(sources[name])
    return needed


def run_stages(
    recipe: Recipe,
    ctx: StageContext,
    embedder: AsymmetricEmbedder | None,
    state: RunState,
    device: str | None,
    selected: set[str],
    keep_stages: bool = False,
) -> None:
    """Each selected unfinished stage in order, from its ``from`` stage (default: the previous one);
    after each, the saved stages no stage still to train starts from are deleted (not ``keep_stages``)."""
    in_memory: str | None = "init" if embedder is not None else None  # the stage the in-memory model is
    sources = stage_sources(recipe)
    for stage in recipe.stages:
        source = sources[stage.name]
        if stage.name in state.done or stage.name not in selected:
            in_memory = None
            continue
        if in_memory != source or embedder is None:
            embedder = None  # frees the previous model before the next one loads
            embedder = load_model(ctx.out / "stages" / source, recipe.model, device, recipe.defaults)
            if recipe.model.max_length:
                embedder = set_max_length(embedder, recipe.model.max_length)
        if not ctx.pretrained_dtypes:
            ctx.pretrained_dtypes = pretrained_dtypes(embedder)
        logger.info("stage %s (%s) starts from %s", stage.name, stage.type, source)
        embedder = run_stage(ctx, stage, embedder, state)
        in_memory = stage.name
        if not keep_stages:
            prune(recipe, ctx.out, state)


def needed_stages(recipe: Recipe, state: RunState) -> set[str]:
    """Saved stages a later step reads: the source of every stage not yet trained, and the final stage
    until ``final`` is published."""
    sources = stage_sources(recipe)
    needed = {sources[name] for name in sources if name not in state.done}
    if "final" not in state.extra and recipe.final_stage in state.done:
        needed.add(recipe.final_stage)
    return needed


def prune(recipe: Recipe, out: Path, state: RunState) -> None:
    """Delete what neither ``--resume`` nor the final model needs: saved stages no unfinished stage
    starts from, and the checkpoints of finished stages (rank 0; the others hold the model in memory)."""
    from care_retriever.training.engine import is_main_process

    if not is_main_process():
        return
    needed = needed_stages(recipe, state)
    for name in ["init", *stage_sources(recipe)]:
        if name in state.done and name not in needed:
            shutil.rmtree(out / "stages" / name, ignore_errors=True)
        if name in state.done:
            shutil.rmtree(out / "checkpoints" / name, ignore_errors=True)


def publish_final(recipe: Recipe, out: Path, state: RunState) -> Path | None:
    """Copy the final stage to ``out/final`` through a temporary folder (never half-written); None
    while the final stage is not trained."""
    from care_retriever.training.engine import is_main_process

    if recipe.final_stage not in state.done:
        return None
    final = out / "final"
    if not is_main_process():
        return final
    source = out / "stages" / recipe.final_stage
    if "final" in state.extra and final.is_dir() and not source.is_dir():
        return final  # published by an earlier run, its stage folder since deleted
    tmp = out / ".final.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(source, tmp, copy_function=_link_or_copy)  # hard links: no second copy on disk
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    state.extra["final"] = str(final)
    state.save(out)
    return final


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # a file system without hard links
        shutil.copy2(src, dst)


def run_recipe(
    recipe: Recipe,
    out: str | Path,
    data_dir: str | Path | None = None,
    *,
    dry_run_steps: int | None = None,
    resume: bool = False,
    preset: str | None = None,
    device: str | None = None,
    show_progress: bool = True,
    stages: Sequence[str] | None = None,
    keep_stages: bool = False,
) -> RunResult:
    """Train ``recipe`` into ``out``; the final model lands in ``out/final``.

    ``preset`` replaces the recipe's model by a from-scratch one of that preset (validating a
    paper-size recipe on CPU with the ``base`` preset); ``dry_run_steps`` trains N steps per stage;
    ``stages`` trains only those stages and the ones they start from (the rest on a later resume);
    ``keep_stages`` keeps every stage's saved model and checkpoints (by default only what ``--resume``
    and the final model need stay: at most two saved stages at a time).
    """
    from care_retriever.training.distributed import recipe_timeout_seconds, start_process_group, world_size
    from care_retriever.training.engine import wait_for_everyone
    from care_retriever.training.stages import StageContext, seed_everything

    out = Path(out)
    data_dir = Path(data_dir) if data_dir is not None else default_data_dir()
    if dry_run_steps is not None and dry_run_steps < 1:
        raise InputError(f"--dry-run-steps must be >= 1, got {dry_run_steps}")
    recipe = effective_recipe(recipe, preset=preset, dry_run_steps=dry_run_steps)
    selected = selected_stages(recipe, stages)
    fingerprint = run_fingerprint(recipe, dry_run_steps=dry_run_steps, preset=preset)
    # First: the process group's timeout is fixed by whoever creates it (see training/distributed.py).
    timeout = start_process_group(recipe_timeout_seconds(recipe.defaults))
    state = RunState.resumed(recipe, fingerprint, check_output(out, recipe, fingerprint, resume))
    if world_size() > 1:
        logger.info("%d processes, process group timeout %s s", world_size(), timeout)
    # Recorded always: the group's timeout as torch holds it, else (one process, no group) the recipe's.
    state.extra["processes"] = {
        "world_size": world_size(),
        "timeout_seconds": timeout if timeout is not None else recipe_timeout_seconds(recipe.defaults),
        "process_group": timeout is not None,
    }
    wait_for_everyone()  # under torchrun every rank checks --out before rank 0 writes to it
    load = preload_datasets(recipe, data_dir)
    seed_everything(recipe.seed)
    embedder = start_run(recipe, out, state, data_dir, device, load)
    ctx = StageContext(
        out=out,
        data_dir=data_dir,
        seed=recipe.seed,
        fingerprint=fingerprint,
        defaults=recipe.defaults,
        load_pairset=load,
        datasets=recipe.datasets,
        dry_run_steps=dry_run_steps,
        resume=resume,
        show_progress=show_progress,
        pretrained_dtypes=pretrained_dtypes(embedder) if embedder is not None else {},
        device=device,
    )
    run_stages(recipe, ctx, embedder, state, device, selected, keep_stages)
    final = publish_final(recipe, out, state)
    if not keep_stages:
        prune(recipe, out, state)
    return RunResult(out=out, final=final, reports=state.reports, exports=state.exports)


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


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"
