"""What every stage runner shares (:mod:`care_retriever.training.stages`, the language-model pretraining of
:mod:`care_retriever.training.pretraining`): the run's context, a stage's report, its trainer settings and
precision, the dry run's sample of its rows, and the run of its built trainer.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from care_retriever.errors import InputError
from care_retriever.training.engine import last_checkpoint, world_size
from care_retriever.training.pairs import PairSet
from care_retriever.training.recipe_spec import OWN_DEFAULT_KEYS, StageSpec

if TYPE_CHECKING:
    import torch
    from transformers import Trainer

    from care_retriever.training.precision import Precision

logger = logging.getLogger("care_retriever")


@dataclass
class StageContext:
    out: Path
    data_dir: Path
    seed: int
    fingerprint: str
    defaults: dict[str, Any]
    load_pairset: Callable[[str], PairSet]
    datasets: dict[str, Any] = field(default_factory=dict)  # name -> DatasetSpec
    dry_run_steps: int | None = None
    resume: bool = False
    show_progress: bool = True
    # tower -> the dtype its pretrained checkpoint names (training/precision.py): decides fp16 vs bf16
    pretrained_dtypes: dict[str, str | None] = field(default_factory=dict)
    device: str | None = None
    logged: set[str] = field(default_factory=set)  # one-line notes already logged in this run


@dataclass
class StageReport:
    name: str
    type: str
    examples: int = 0
    steps: int = 0
    seconds: float = 0.0
    losses: list[float] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def first_loss(self) -> float | None:
        return self.losses[0] if self.losses else None

    @property
    def last_loss(self) -> float | None:
        return self.losses[-1] if self.losses else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "examples": self.examples,
            "steps": self.steps,
            "seconds": round(self.seconds, 2),
            "first_loss": self.first_loss,
            "last_loss": self.last_loss,
            **self.extra,
        }


# ----------------------------------------------------------------------------- helpers
def option(ctx: StageContext, stage: StageSpec, key: str, default: Any) -> Any:
    """A stage option, else the recipe's ``defaults``, else ``default``."""
    value = getattr(stage, key, None)
    if value is not None:
        return value
    return ctx.defaults.get(key, default)


DRY_RUN_BATCH = 4


def trainer_settings(ctx: StageContext, stage: StageSpec) -> dict[str, Any]:
    """The stage's trainer arguments, with the precision :func:`stage_precision` decides; a dry run
    shrinks batches and trains without warm-up.

    A dry run validates a recipe (data, dims, stage wiring, one optimizer step per stage) in
    minutes, even a paper-size recipe on a CPU: it trains ``N`` steps of ``DRY_RUN_BATCH`` rows. Its
    steps run at the full learning rate: a warm-up ratio of N steps starts at 0, and a step at
    learning rate 0 changes no weight (a dry run could not show that a stage trains anything).
    """
    settings = {k: v for k, v in ctx.defaults.items() if k not in OWN_DEFAULT_KEYS}
    settings.update(stage.args)
    if ctx.dry_run_steps is not None:
        settings["per_device_train_batch_size"] = min(
            int(settings.get("per_device_train_batch_size", DRY_RUN_BATCH)), DRY_RUN_BATCH
        )
        settings["gradient_accumulation_steps"] = 1
        settings["logging_steps"] = 1
        settings["dataloader_drop_last"] = False
        settings["warmup_steps"] = 0
    settings.update(stage_precision(ctx, settings).trainer_flags)
    return settings


def stage_precision(ctx: StageContext, settings: dict[str, Any]) -> Precision:
    """The precision the stage trains in (training/precision.py), from its bf16/fp16 flags, the GPU
    and the towers' pretraining dtypes; a changed request is logged once per run."""
    from care_retriever.training.precision import current_capability, training_precision

    precision = training_precision(settings, current_capability(ctx.device), ctx.pretrained_dtypes)
    if precision.note and precision.note not in ctx.logged:
        ctx.logged.add(precision.note)
        logger.info("precision: %s", precision.note)
    return precision


def stage_dtype(ctx: StageContext, stage: StageSpec) -> torch.dtype:
    """The torch dtype the stage trains in (what its frozen-tower encodings run under)."""
    from care_retriever.training.precision import Precision, requested_precision

    return Precision(requested_precision(trainer_settings(ctx, stage))).torch_dtype


def batch_rows(ctx: StageContext, stage: StageSpec) -> int:
    """Rows one optimizer step consumes (for dry runs)."""
    settings = trainer_settings(ctx, stage)
    return (
        int(settings.get("per_device_train_batch_size", 32))
        * int(settings.get("gradient_accumulation_steps", 1))
        * world_size()
    )


def limit_for_dry_run(ctx: StageContext, stage: StageSpec, items: list[Any], cap: int | None = None) -> list[Any]:
    """A seeded sample of at most ``cap`` rows (default: the stage's ``max_examples``); a dry run trains
    ``N`` steps and keeps the rows those steps need."""
    cap = stage.max_examples if cap is None else cap
    if ctx.dry_run_steps is not None:
        # 4x the rows the steps need: the no-duplicates batch sampler skips rows whose texts repeat
        dry = 4 * ctx.dry_run_steps * batch_rows(ctx, stage)
        cap = min(cap, dry) if cap else dry
    if cap and len(items) > cap:
        rng = random.Random(ctx.seed)
        return rng.sample(items, cap)
    return items


def train_stage(
    ctx: StageContext, stage: StageSpec, trainer: Trainer, output_dir: Path, *, examples: int
) -> StageReport:
    """Run a built trainer (resuming from the stage's last checkpoint) and report its steps, time and losses."""
    checkpoint = last_checkpoint(output_dir) if ctx.resume else None
    if checkpoint:
        logger.info("stage %s: resuming from %s", stage.name, checkpoint)
    start = time.perf_counter()
    trainer.train(resume_from_checkpoint=checkpoint)
    if trainer.state.global_step == 0 and trainer.args.dataloader_drop_last and trainer.args.world_size == 1:
        # no full batch of distinct texts in a small data set: one process keeps its partial batches instead
        logger.warning(
            "stage %s: its %d examples fill no batch of %d distinct texts; training with partial batches kept",
            stage.name,
            examples,
            trainer.args.per_device_train_batch_size,
        )
        trainer.args.dataloader_drop_last = False
        trainer.train()
    seconds = time.perf_counter() - start
    if trainer.state.global_step == 0:
        raise InputError(
            f"stage {stage.name!r}: no training step ran ({examples} examples; too few for the batch size, "
            "or dataloader_drop_last with duplicate texts)"
        )
    losses = [float(row["loss"]) for row in trainer.state.log_history if "loss" in row]
    return StageReport(
        stage.name, stage.type, examples=examples, steps=trainer.state.global_step, seconds=seconds, losses=losses
    )
