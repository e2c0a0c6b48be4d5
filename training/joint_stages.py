"""The stages trained with hard negatives: Stage II (joint fine-tuning: Asym-InfoNCE over hard and in-batch
negatives, LoRA on the document tower) and score distillation (Table 7's baseline), and the mining that gives
every example its negatives."""

from __future__ import annotations

import logging
import random
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from care_retriever.errors import InputError
from care_retriever.training.lora import LoraSpec, merge_lora
from care_retriever.training.pairs import Example, unique
from care_retriever.training.recipe_spec import (
    DistillStage,
    Stage2JointStage,
)
from care_retriever.training.row_prompts import row_prompted
from care_retriever.training.stage_common import (
    contrastive_loss,
    fit,
    freeze_truncation,
    gather_examples,
    lora_on,
    pair_dataset,
    query_prompts,
    set_trainable,
    temperature,
)
from care_retriever.training.stage_context import (
    StageContext,
    StageReport,
    stage_dtype,
)
from care_retriever.training.teacher_cache import autocast
from care_retriever.training.tower_forward import (
    describe,
    stage_forward,
)

if TYPE_CHECKING:
    from care_retriever.model.embedder import AsymmetricEmbedder

logger = logging.getLogger("care_retriever")


def add_hard_negatives(
    ctx: StageContext,
    stage: Stage2JointStage | DistillStage,
    embedder: AsymmetricEmbedder,
    examples: list[Example],
    report: dict[str, Any] | None = None,
) -> tuple[list[Example], int]:
    """Give every example exactly ``num`` negatives: its own first, then mined ones from the pool. The mining
    encodes the pool with the document tower on the stage's forward pass (packed where ``index`` packs);
    ``report`` gets ``mining_forward``, the pass it ran."""
    spec = stage.hard_negatives
    num = int(spec.get("num", 1))
    if num <= 0:
        return [replace(e, negatives=[]) for e in examples], 0
    pool = unique([t for e in examples for t in (e.positive, *e.negatives)])
    mined: dict[str, list[str]] = {}
    if spec.get("mine", True):
        from care_retriever.training.hard_negatives import mine_for_queries

        positives: dict[str, set[str]] = {}
        for e in examples:
            positives.setdefault(e.query, set()).add(e.positive)
        with stage_forward(ctx, stage, embedder) as state:
            mined = mine_for_queries(
                embedder,
                positives,
                pool,
                num=num,
                range_min=int(spec.get("range_min", 3)),
                range_max=int(spec.get("range_max", 50)),
                duplicate_threshold=float(spec.get("duplicate_threshold", 0.95)),
                show_progress=ctx.show_progress,
                miner=str(spec.get("miner", "document")),
                exchange_dir=ctx.out / f".exchange-{stage.name}",  # torchrun: the ranks' shares of the pool
                dtype=stage_dtype(ctx, stage),
            )
        if report is not None:
            report["mining_forward"] = state
    rng = random.Random(ctx.seed)
    out = []
    for e in examples:
        chosen = [n for n in e.negatives if n != e.positive][:num]
        for n in mined.get(e.query, []):
            if len(chosen) >= num:
                break
            if n not in chosen:
                chosen.append(n)
        while len(chosen) < num:  # a tiny pool: fall back to random documents
            candidate = rng.choice(pool)
            if candidate != e.positive and (candidate not in chosen or len(pool) <= num + 1):
                chosen.append(candidate)
        out.append(replace(e, negatives=chosen))  # a row's own query prompt (flag data) stays with it
    return out, num


def stage2_joint(ctx: StageContext, stage: Stage2JointStage, embedder: AsymmetricEmbedder) -> StageReport:
    """Joint fine-tuning: Asym-InfoNCE over hard + in-batch negatives, LoRA on the document tower."""
    where = f"stage {stage.name!r}"
    examples = gather_examples(ctx, stage)
    mining: dict[str, Any] = {}
    examples, num = add_hard_negatives(ctx, stage, embedder, examples, mining)
    examples, anchor = row_prompted(examples, embedder.config)
    lora = LoraSpec.from_options(stage.lora, where)
    set_trainable(embedder.tower("query").modules, True)
    freeze_truncation(embedder.tower("document").modules)
    # decided on the tower as loaded, before LoRA wraps its layers; undone after LoRA is merged back
    with stage_forward(ctx, stage, embedder) as state:
        logger.info("%s: the document tower's forward: %s", stage.name, describe(state))
        if lora is not None:
            trainable = lora_on(embedder, lora, ctx.seed)
            logger.info(
                "%s: LoRA r=%d alpha=%d on the document tower, %d trainable", stage.name, lora.r, lora.alpha, trainable
            )
        model = embedder.to_sentence_transformer()
        loss = contrastive_loss(ctx, stage, model)
        router = {"anchor": "query", "positive": "document", **{f"negative_{k + 1}": "document" for k in range(num)}}
        document_columns = tuple(c for c, side in router.items() if side == "document")
        try:
            report = fit(
                ctx,
                stage,
                model,
                pair_dataset(examples, num),
                loss,
                router_mapping=router,
                prompts=query_prompts(embedder, anchor, document_columns),
                examples=len(examples),
            )
        finally:
            merge_lora(embedder.tower("document").modules)
    report.extra["hard_negatives"] = num
    report.extra["document_forward"] = state
    report.extra.update(mining)
    return report


def distill(ctx: StageContext, stage: DistillStage, embedder: AsymmetricEmbedder) -> StageReport:
    """Baseline (Table 7): the query tower alone learns the document tower's scores (KL) + InfoNCE.

    The teacher scores ``cos(E_D(q), E_D(c))`` over each query's positive and hard negatives are
    computed once with the frozen document tower; export the result as ``query-symmetric``.
    """
    from care_retriever.training.losses import ScoreDistillationLoss

    examples = gather_examples(ctx, stage)
    passes: dict[str, Any] = {}
    examples, num = add_hard_negatives(ctx, stage, embedder, examples, passes)
    if num < 1:
        raise InputError(f"stage {stage.name!r}: score distillation needs hard_negatives.num >= 1")
    texts = unique([t for e in examples for t in (e.query, e.positive, *e.negatives)])
    with (
        stage_forward(ctx, stage, embedder) as passes["teacher_forward"],
        autocast(embedder.device, stage_dtype(ctx, stage)),  # the frozen tower as it runs in training
    ):
        vectors = embedder.embed_documents(texts, batch_size=64, show_progress=ctx.show_progress)
    row = {t: i for i, t in enumerate(texts)}
    scores = [[float(vectors[row[e.query]] @ vectors[row[c]]) for c in (e.positive, *e.negatives)] for e in examples]
    examples, anchor = row_prompted(examples, embedder.config)  # after the teacher scores (raw texts)
    dataset = pair_dataset(examples, num).add_column("label", scores)
    set_trainable(embedder.tower("document").modules, False)
    set_trainable(embedder.tower("query").modules, True)
    model = embedder.to_sentence_transformer()
    loss = ScoreDistillationLoss(model, kl_weight=float(stage.kl_weight), temperature=temperature(ctx, stage))
    router = {"anchor": "query", "positive": "query", **{f"negative_{k + 1}": "query" for k in range(num)}}
    try:
        report = fit(
            ctx,
            stage,
            model,
            dataset,
            loss,
            router_mapping=router,
            prompts=query_prompts(embedder, anchor),
            examples=len(examples),
        )
    finally:
        set_trainable(embedder.tower("document").modules, True)
    report.extra["hard_negatives"] = num
    report.extra.update(passes)
    return report
