"""Run a recipe: build or load the starting model, chain the stages, save ``OUT/final``.

The layout of ``OUT`` and what ``run.json`` records live in :mod:`care_retriever.training.run_folder`, the models a
run builds, loads, saves and exports in :mod:`care_retriever.training.models`. This module decides which stages a
run trains and from what, reads and checks every data set before anything is written, computes the fingerprint a
resume is checked against, and runs it all in order.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from care_retriever.errors import InputError
from care_retriever.training.models import (
    export_model,
    initial_model,
    load_model,
    own_dtypes,
    pretrained_dtypes,
    save_model,
    set_max_length,
    vocab_files,
)
from care_retriever.training.pairs import PairSet, load_pairset, resolve_data_path, task_queries, without_queries
from care_retriever.training.recipe_spec import ModelSpec, Recipe, Stage0DocumentStage, StageSpec
from care_retriever.training.run_folder import (
    RunResult,
    RunState,
    check_output,
    foundation_dir,
    foundation_fingerprint,
    prune,
    publish_final,
    stage_sources,
)

if TYPE_CHECKING:
    from care_retriever.model.embedder import AsymmetricEmbedder
    from care_retriever.training.stages import StageContext

logger = logging.getLogger("care_retriever")
DRY_RUN_MAX_LENGTH = 64  # a dry run checks the wiring, not the capacity: short texts keep it minutes long
# Stage types that leave the document tower as it was: its space fingerprint (a hash of every weight,
# tens of seconds for a 4B tower) is carried over instead of computed again.
DOCUMENT_FROZEN = frozenset({"stage0_query", "stage1_align", "distill", "mlm"})


def default_data_dir() -> Path:
    """``CARE_SHARED_DATA``, else ``../shared/data`` relative to the working directory."""
    return Path(os.environ.get("CARE_SHARED_DATA", Path("..") / "shared" / "data"))


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
        from care_retriever.training.row_prompts import check_row_prompts

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


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"
