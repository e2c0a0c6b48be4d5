"""Run a recipe: build or load the starting model, chain the stages, save ``OUT/final``.

Layout of ``OUT``::

    run.json              recipe name, fingerprint, finished stages, per-stage reports
    stages/<name>/        the model after each stage (LoRA merged; ``init`` is the starting model)
    models/<export>/      models a stage exports (ablation baselines, symmetric variants)
    checkpoints/<name>/   trainer checkpoints of each stage (resume)
    logs/<name>.jsonl     loss / lr / epoch per logging step
    teacher_cache/        Stage I's memory-mapped teacher embeddings
    final/                the recipe's final model (``from_pretrained``, ``index``, ``search``, ``eval``)

Nothing is overwritten by accident: a non-empty ``OUT`` is only re-entered with ``resume=True``
and only by the same recipe (same fingerprint); finished stages are then loaded, not re-run, and
an unfinished stage continues from its last checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from care_retriever.errors import InputError, ModelError
from care_retriever.training.pairs import PairSet, load_pairset, resolve_data_path
from care_retriever.training.recipe import ModelSpec, Recipe

logger = logging.getLogger("care_retriever")
RUN_FILE = "run.json"
DRY_RUN_MAX_LENGTH = 64  # a dry run checks the wiring, not the capacity: short texts keep it minutes long


@dataclass
class RunResult:
    out: Path
    final: Path
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
    except json.JSONDecodeError:
        raise InputError(f"{path}: corrupted run file; use a new --out") from None


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


def initial_model(spec: ModelSpec, recipe: Recipe, data_dir: Path, seed: int, device: str | None):
    from care_retriever.embedder import AsymmetricEmbedder

    if spec.preset:
        from care_retriever.towers.scratch import init_from_scratch

        logger.info("Training tokenizers and building a random %r model ...", spec.preset)
        embedder = init_from_scratch(spec.preset, vocab_files(recipe, data_dir), seed=seed, device=device)
    elif spec.path:
        embedder = AsymmetricEmbedder.from_pretrained(spec.path, load="both", device=device, dtype="fp32")
    else:
        embedder = AsymmetricEmbedder.from_towers(
            spec.query_model,
            spec.document_model,
            device=device,
            dtype="fp32",
            trust_remote_code=spec.trust_remote_code,
        )
    if spec.dim is not None and spec.dim != embedder.dim:
        raise ModelError(
            f"dimension mismatch: the recipe says model.dim {spec.dim}, the model's shared dim is {embedder.dim}"
        )
    if spec.query_pooling:
        embedder = set_pooling(embedder, "query", spec.query_pooling)
    if spec.document_pooling:
        embedder = set_pooling(embedder, "document", spec.document_pooling)
    if spec.max_length:
        set_max_length(embedder, spec.max_length)
    return embedder


def set_pooling(embedder, side: str, pooling: str):
    """A new embedder whose ``side`` tower ("query" | "document") pools with ``pooling`` (cls | mean | last_token)."""
    from sentence_transformers.sentence_transformer.modules import Pooling

    from care_retriever.embedder import AsymmetricEmbedder
    from care_retriever.towers.modules import pooling_mode

    mode = pooling_mode(pooling)
    towers = {"query": embedder.query_modules, "document": embedder.document_modules}
    towers[side] = [
        Pooling(m.get_embedding_dimension(), pooling_mode=mode) if isinstance(m, Pooling) else m for m in towers[side]
    ]
    getattr(embedder.config, side).pooling = pooling
    return AsymmetricEmbedder(embedder.config, towers["query"], towers["document"], device=embedder.device)


def set_max_length(embedder, max_length: int) -> None:
    """Train (and later serve) with at most ``max_length`` tokens per text on both towers."""
    from care_retriever.training.lora import transformer_of

    for side, modules in (("query", embedder.query_modules), ("document", embedder.document_modules)):
        transformer_of(modules).max_seq_length = max_length
        getattr(embedder.config, side).max_length = max_length


def export_model(embedder, kind: str, target: Path) -> Path:
    """Save the model as is, or one of its towers on both sides (a symmetric baseline)."""
    from dataclasses import replace

    from care_retriever.embedder import AsymmetricEmbedder

    if kind == "asymmetric":
        return embedder.save_pretrained(target)
    side = "query" if kind == "query-symmetric" else "document"
    modules = embedder.query_modules if side == "query" else embedder.document_modules
    info = getattr(embedder.config, side)
    config = replace(
        embedder.config,
        mode="symmetric",
        query=replace(info),
        document=replace(info),
        query_prompt_template=embedder.config.query_prompt_template if side == "query" else None,
        default_instruction=embedder.config.default_instruction if side == "query" else None,
        space_fingerprint=None,
        extra={**embedder.config.extra, "exported_as": kind},
    )
    return AsymmetricEmbedder(config, modules, modules, device=embedder.device).save_pretrained(target)


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
) -> RunResult:
    """Train ``recipe`` into ``out``; the final model lands in ``out/final``.

    ``preset`` replaces the recipe's model by a from-scratch one of that preset (validating a
    paper-size recipe on CPU with the ``base`` preset); ``dry_run_steps`` trains N steps per stage.
    """
    from care_retriever.embedder import AsymmetricEmbedder
    from care_retriever.training.stages import STAGES, StageContext, seed_everything

    out = Path(out)
    data_dir = Path(data_dir) if data_dir is not None else default_data_dir()
    if dry_run_steps is not None and dry_run_steps < 1:
        raise InputError(f"--dry-run-steps must be >= 1, got {dry_run_steps}")
    if preset is not None:
        recipe.model = ModelSpec(
            preset=preset,
            vocab_from=recipe.model.vocab_from,
            max_length=recipe.model.max_length,
            query_pooling=recipe.model.query_pooling,
            document_pooling=recipe.model.document_pooling,
        )
    if dry_run_steps is not None:
        recipe.model.max_length = min(recipe.model.max_length or DRY_RUN_MAX_LENGTH, DRY_RUN_MAX_LENGTH)
    fingerprint = recipe.fingerprint(dry_run_steps=dry_run_steps, preset=preset)
    state = check_output(out, recipe, fingerprint, resume)

    # Read and validate every data set before anything is written.
    cache: dict[str, PairSet] = {}

    def load(name: str) -> PairSet:
        if name not in cache:
            cache[name] = load_pairset(recipe.datasets[name], data_dir)
        return cache[name]

    used = {n for s in recipe.stages for n in s.datasets} | {
        n
        for s in recipe.stages
        for key in ("queries", "documents")
        for n in (s.options.get("alignment") or {}).get(key, [])
    }
    for stage in recipe.stages:
        if stage.type == "mlm":
            used -= set(stage.datasets)  # raw text, read by the MLM stage itself
    for name in sorted(used):
        load(name)
    if recipe.model.preset:
        vocab_files(recipe, data_dir)

    seed_everything(recipe.seed)
    done: list[str] = list(state.get("done", [])) if state else []
    reports: list[dict[str, Any]] = list(state.get("reports", [])) if state else []
    exports: dict[str, str] = dict(state.get("exports", {})) if state else {}
    stages_dir = out / "stages"
    if "init" in done:
        embedder = AsymmetricEmbedder.from_pretrained(stages_dir / "init", device=device, dtype="fp32")
    else:
        init_started = time.perf_counter()
        embedder = initial_model(recipe.model, recipe, data_dir, recipe.seed, device)
        for stage in recipe.stages:  # dims are checked before the first write
            if stage.type == "stage0_document":
                from care_retriever.training.stages import matryoshka_dims

                matryoshka_dims(
                    stage.options.get("matryoshka_dims"), embedder.dim, embedder.document_dim, f"stage {stage.name!r}"
                )
        out.mkdir(parents=True, exist_ok=True)
        state = {"recipe": recipe.name, "source": recipe.source_path, "fingerprint": fingerprint, "done": []}
        _write_run(out, state)
        embedder.save_pretrained(stages_dir / "init")
        state["init_seconds"] = round(time.perf_counter() - init_started, 2)
        done = ["init"]
        _write_run(out, {**state, "done": done, "reports": reports, "exports": exports})
    current = "init"
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
    )
    previous = "init"
    for stage in recipe.stages:
        source = stage.source or previous
        previous = stage.name
        if stage.name in done:
            current = None  # the in-memory model is no longer the latest stage's
            continue
        if current != source:
            embedder = AsymmetricEmbedder.from_pretrained(stages_dir / source, device=device, dtype="fp32")
            if recipe.model.max_length:
                set_max_length(embedder, recipe.model.max_length)
        logger.info("stage %s (%s) starts from %s", stage.name, stage.type, source)
        started = time.perf_counter()
        seed_everything(recipe.seed)
        report = STAGES[stage.type](ctx, stage, embedder)
        embedder.save_pretrained(stages_dir / stage.name)
        for name, kind in stage.export.items():
            exports[name] = str(export_model(embedder, kind, out / "models" / name))
        current = stage.name
        done.append(stage.name)
        # ``seconds`` is the training loop; the wall time adds data reading, teacher caching,
        # negative mining, loading and saving: what a user waits for.
        reports.append({**report.to_dict(), "wall_seconds": round(time.perf_counter() - started, 2)})
        _write_run(out, {**state, "done": done, "reports": reports, "exports": exports})
        logger.info(
            "stage %s done: %d steps in %.1fs, loss %s -> %s",
            stage.name,
            report.steps,
            report.seconds,
            _fmt(report.first_loss),
            _fmt(report.last_loss),
        )
    final = out / "final"
    source = stages_dir / recipe.final_stage
    tmp = out / ".final.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(source, tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _write_run(out, {**state, "done": done, "reports": reports, "exports": exports, "final": str(final)})
    return RunResult(out=out, final=final, reports=reports, exports=exports)


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"
