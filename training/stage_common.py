"""What the training stages share: their examples and datasets, LoRA and trainable flags, the contrastive loss and
its temperature, the prompts of each column, and ``fit`` (a stage's sentence-transformers trainer run)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from datasets import Dataset, DatasetDict

from care_retriever.errors import InputError
from care_retriever.training.data_fit import fit_batch_to_data
from care_retriever.training.engine import (
    CareTrainer,
    JsonlLogCallback,
    bucket_by_length,
    build_arguments,
    enable_activation_checkpointing,
    world_size,
)
from care_retriever.training.lora import LoraSpec, add_lora
from care_retriever.training.pairs import Example
from care_retriever.training.quiet import quiet_trainer
from care_retriever.training.recipe_spec import (
    StageSpec,
)
from care_retriever.training.stage_context import (
    StageContext,
    StageReport,
    limit_for_dry_run,
    option,
    train_stage,
    trainer_settings,
)

if TYPE_CHECKING:
    from care_retriever.model.embedder import AsymmetricEmbedder

logger = logging.getLogger("care_retriever")
DEFAULT_TEMPERATURE = 0.05


# ----------------------------------------------------------------------------- helpers
def gather_examples(ctx: StageContext, stage: StageSpec, names: list[str] | None = None) -> list[Example]:
    examples: list[Example] = []
    for name in names if names is not None else stage.datasets:
        examples.extend(ctx.load_pairset(name).examples)
    if not examples:
        raise InputError(f"stage {stage.name!r}: its datasets hold no (query, positive) pairs")
    return limit_for_dry_run(ctx, stage, examples)


def lora_on(embedder: AsymmetricEmbedder, lora: LoraSpec, seed: int) -> int:
    """LoRA on the document tower. peft's ``get_peft_model`` reads the model's ``is_gradient_checkpointing``,
    a property transformers 5 deprecated (``FutureWarning`` on every LoRA stage): that one warning is
    silenced here, where peft reads it, until peft reads ``is_activation_checkpointing``."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        return add_lora(embedder.tower("document").modules, lora, seed=seed)


def set_trainable(modules: list | None, flag: bool) -> None:
    for module in modules or []:
        for param in module.parameters():
            param.requires_grad_(flag)


def freeze_truncation(modules: list | None) -> None:
    """Keep the document tower's Matryoshka truncation (an identity ``Dense``) fixed.

    The paper has no projection layer: the first d dims of the document embedding are the shared
    space. Left trainable, Stage II would turn the slice into a learned projection (outside LoRA).
    """
    from sentence_transformers.sentence_transformer.modules import Dense

    set_trainable([m for m in modules or [] if isinstance(m, Dense)], False)


def temperature(ctx: StageContext, stage: StageSpec) -> float:
    return float(option(ctx, stage, "temperature", DEFAULT_TEMPERATURE))


def gather_flag(ctx: StageContext, stage: StageSpec) -> bool:
    """In-batch negatives from every device: on by default when several processes train."""
    value = option(ctx, stage, "gather_across_devices", "auto")
    return world_size() > 1 if value == "auto" else bool(value)


def contrastive_loss(ctx: StageContext, stage: StageSpec, model):
    """InfoNCE with in-batch negatives: ``MultipleNegativesRankingLoss``, or its GradCache variant
    ``CachedMultipleNegativesRankingLoss`` when the stage sets ``mini_batch_size`` (paper-size
    batches of 640 on one GPU: memory of a mini-batch, gradients of the whole batch)."""
    from sentence_transformers.sentence_transformer.losses import (
        CachedMultipleNegativesRankingLoss,
        MultipleNegativesRankingLoss,
    )
    from sentence_transformers.util import cos_sim, dot_score

    scale = 1.0 / temperature(ctx, stage)
    # A model that scores by dot product (the authors' release convention: documents normalised at full
    # width, then cut) trains on the scores it is searched with, as the authors' trainer does.
    similarity = dot_score if getattr(model, "similarity_fn_name", None) == "dot" else cos_sim
    mini_batch = getattr(stage, "mini_batch_size", None)
    if mini_batch:
        return CachedMultipleNegativesRankingLoss(
            model,
            scale=scale,
            similarity_fct=similarity,
            mini_batch_size=int(mini_batch),
            gather_across_devices=gather_flag(ctx, stage),
            show_progress_bar=False,
        )
    return MultipleNegativesRankingLoss(
        model, scale=scale, similarity_fct=similarity, gather_across_devices=gather_flag(ctx, stage)
    )


def query_prompts(
    embedder: AsymmetricEmbedder, columns: list[str], document_columns: tuple[str, ...] = ()
) -> dict[str, str] | None:
    """Prompts per column: the query prompt for ``columns``, and for ``document_columns`` (routed to the
    document tower) the document prompt its pretrained folder declares, as ``embed_documents`` applies it."""
    prompt = embedder.query_prompt()
    prompts = {col: prompt for col in columns} if prompt else {}
    prompts.update(document_prompts(embedder, document_columns))
    return prompts or None


def document_prompts(embedder: AsymmetricEmbedder, columns: tuple[str, ...]) -> dict[str, str]:
    prompt = embedder.config.document_prompt
    return {col: prompt for col in columns} if prompt else {}


def fit(
    ctx: StageContext,
    stage: StageSpec,
    model,
    dataset: Dataset | DatasetDict,
    loss,
    *,
    router_mapping: dict[str, str] | None = None,
    prompts: dict[str, Any] | None = None,
    examples: int,
) -> StageReport:
    """Train ``model`` with the sentence-transformers trainer; resume from the stage's last checkpoint."""
    output_dir = ctx.out / "checkpoints" / stage.name
    bounds = option(ctx, stage, "length_buckets", None)
    buckets: dict[str, int] = {}
    if bounds:
        dataset, prompts, buckets = bucket_by_length(dataset, prompts, list(bounds))
    settings = trainer_settings(ctx, stage)
    if world_size() > 1:
        settings = distributed_settings(settings, model)
    # a data set smaller than one batch still trains
    settings = fit_batch_to_data(settings, dataset, stage.name, distributed=world_size() > 1)
    args = build_arguments(
        output_dir,
        settings,
        seed=ctx.seed,
        router_mapping=router_mapping,
        prompts=prompts,
        max_steps=ctx.dry_run_steps,
    )
    args.disable_tqdm = not ctx.show_progress
    enable_activation_checkpointing(model)  # the trainer's call by its transformers 5 name (no FutureWarning)
    trainer = CareTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        loss=loss,
        callbacks=[JsonlLogCallback(ctx.out / "logs" / f"{stage.name}.jsonl", stage.name)],
        care_fingerprint=ctx.fingerprint,
    )
    quiet_trainer(trainer, stage.name)  # one bar per stage, no raw log dicts (training/quiet.py)
    report = train_stage(ctx, stage, trainer, output_dir, examples=examples)
    if buckets:
        report.extra["length_buckets"] = buckets
    return report


def distributed_settings(settings: dict[str, Any], model) -> dict[str, Any]:
    """Trainer settings for DDP (torchrun), and the one change to ``model`` they need.

    A step calls the model once per column (anchor on one route, positive and negatives on the
    other, or the query tower twice in Stage 0): with ``find_unused_parameters`` each call marks the
    parameters it did not use as ready, and the next call's backward marks them again (a DDP error).
    So unused-parameter detection is off, and the one parameter set no forward uses, the BERT
    pooler (sentence-transformers pools token embeddings itself), is frozen: it never gets a
    gradient, so freezing it changes no number. Every rank must hold a full batch of the same size
    for the gathered in-batch negatives: the last partial batch is dropped.
    """
    from torch import nn

    for module in model.modules():
        pooler = getattr(module, "pooler", None)
        if isinstance(pooler, nn.Module):
            set_trainable([pooler], False)
    return {"ddp_find_unused_parameters": False, **settings, "dataloader_drop_last": True}


def pair_dataset(examples: list[Example], negatives: int = 0) -> Dataset:
    data: dict[str, list[str]] = {
        "anchor": [e.query for e in examples],
        "positive": [e.positive for e in examples],
    }
    for k in range(negatives):
        data[f"negative_{k + 1}"] = [e.negatives[k] for e in examples]
    return Dataset.from_dict(data)


# ----------------------------------------------------------------------------- Stage 0
