"""The training stages of CARE, each a function ``(context, stage spec, embedder) -> StageReport``.

Every stage trains the towers of one :class:`~care_retriever.model.embedder.AsymmetricEmbedder` in place,
through sentence-transformers models that *share* its modules:

- ``stage0_query``: the query tower alone, symmetric InfoNCE (``MultipleNegativesRankingLoss``),
  both columns routed to ``query``.
- ``stage0_document``: the document tower alone through LoRA, InfoNCE under ``MatryoshkaLoss`` over
  nested dims that include the query tower's dim (a plain ``[Transformer, Pooling, Normalize]``
  model over the document modules, because the Router's document route is already truncated).
- ``stage1_align``: query alignment; document tower frozen, its embeddings read from the memory-mapped
  teacher cache; ``QueryAlignmentLoss`` = lambda1 * Asym-InfoNCE + lambda2 * MSE.
- ``stage2_joint``: both towers, the document tower through LoRA; ``MultipleNegativesRankingLoss``
  with anchors routed to ``query`` and candidates to ``document`` (that is Asym-InfoNCE), hard
  negatives plus in-batch negatives, one learning rate.
- ``mlm`` / ``clm`` (in :mod:`care_retriever.training.pretraining`): masked-LM pretraining of a
  from-scratch query tower / causal-LM pretraining of a from-scratch decoder document tower.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
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
from care_retriever.training.lora import LoraSpec, add_lora, merge_lora
from care_retriever.training.pairs import Example, row_prompted, unique
from care_retriever.training.pretraining import stage_clm, stage_mlm
from care_retriever.training.quiet import quiet_trainer
from care_retriever.training.recipe import (
    DistillStage,
    Stage0DocumentStage,
    Stage0QueryStage,
    Stage1AlignStage,
    Stage2JointStage,
    StageSpec,
)
from care_retriever.training.stage_context import (
    StageContext,
    StageReport,
    limit_for_dry_run,
    option,
    stage_dtype,
    train_stage,
    trainer_settings,
)
from care_retriever.training.teacher_cache import autocast
from care_retriever.training.tower_forward import (
    describe,
    frozen_document_forward,
    half_dtype,
    stage_document_forward,
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


def _pair_dataset(examples: list[Example], negatives: int = 0) -> Dataset:
    data: dict[str, list[str]] = {
        "anchor": [e.query for e in examples],
        "positive": [e.positive for e in examples],
    }
    for k in range(negatives):
        data[f"negative_{k + 1}"] = [e.negatives[k] for e in examples]
    return Dataset.from_dict(data)


# ----------------------------------------------------------------------------- Stage 0
def stage0_query(ctx: StageContext, stage: Stage0QueryStage, embedder: AsymmetricEmbedder) -> StageReport:
    """Symmetric InfoNCE fine-tuning of the query tower (document tower untouched)."""
    examples, anchor = row_prompted(gather_examples(ctx, stage), embedder.config)
    model = embedder.to_sentence_transformer()
    set_trainable(embedder.tower("document").modules, False)
    set_trainable(embedder.tower("query").modules, True)
    loss = contrastive_loss(ctx, stage, model)
    try:
        return fit(
            ctx,
            stage,
            model,
            _pair_dataset(examples),
            loss,
            router_mapping={"anchor": "query", "positive": "query"},
            prompts=query_prompts(embedder, anchor),
            examples=len(examples),
        )
    finally:
        set_trainable(embedder.tower("document").modules, True)


def matryoshka_dims(raw: Any, dim: int, native: int, where: str) -> list[int]:
    """Nested dims for the document tower: ``auto`` = native width, the shared dim, half of it."""
    if raw in (None, "auto"):
        dims = [native, dim, dim // 2] if dim // 2 >= 8 else [native, dim]
    elif isinstance(raw, list) and all(isinstance(d, int) and d > 0 for d in raw):
        dims = list(raw)
    else:
        raise InputError(f"{where}: matryoshka_dims must be 'auto' or a list of positive integers")
    if dim not in dims or max(dims) > native:
        raise InputError(
            f"{where}: dimension mismatch: matryoshka_dims {dims} must include the query tower's dim {dim} "
            f"and stay <= the document tower's native dim {native}"
        )
    return sorted(set(dims), reverse=True)


def stage0_document(ctx: StageContext, stage: Stage0DocumentStage, embedder: AsymmetricEmbedder) -> StageReport:
    """The document tower alone: LoRA + symmetric InfoNCE averaged over Matryoshka dims."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.losses import MatryoshkaLoss
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling

    where = f"stage {stage.name!r}"
    dims = matryoshka_dims(stage.matryoshka_dims, embedder.dim, embedder.document_dim, where)
    examples = gather_examples(ctx, stage)
    lora = LoraSpec.from_options(stage.lora, where)
    if lora is not None:
        trainable = lora_on(embedder, lora, ctx.seed)
        logger.info("%s: LoRA r=%d alpha=%d, %d trainable parameters", stage.name, lora.r, lora.alpha, trainable)
    # The tower before the Matryoshka truncation module: MatryoshkaLoss truncates itself.
    untruncated = []
    for module in embedder.tower("document").modules:
        untruncated.append(module)
        if isinstance(module, Pooling):
            break
    model = SentenceTransformer(modules=[*untruncated, Normalize()], device=str(embedder.device))
    # The paper's MRL loss is the mean over the nested dims (MatryoshkaLoss's default weights sum them).
    weights = [1.0 / len(dims)] * len(dims)
    loss = MatryoshkaLoss(model, contrastive_loss(ctx, stage, model), matryoshka_dims=dims, matryoshka_weights=weights)
    prompts = document_prompts(embedder, ("anchor", "positive")) or None
    try:
        report = fit(ctx, stage, model, _pair_dataset(examples), loss, prompts=prompts, examples=len(examples))
    finally:
        merge_lora(embedder.tower("document").modules)
    report.extra["matryoshka_dims"] = dims
    return report


# ----------------------------------------------------------------------------- Stage I
def alignment_texts(ctx: StageContext, stage: Stage1AlignStage) -> tuple[list[str], list[str]]:
    """Query-side and document-side texts of the alignment data (each later paired with itself)."""
    spec = stage.alignment
    queries = unique([t for name in spec.get("queries", []) for t in ctx.load_pairset(name).queries()])
    documents = unique([t for name in spec.get("documents", []) for t in ctx.load_pairset(name).documents()])
    if not queries and not documents:
        raise InputError(f"stage {stage.name!r}: the alignment data is empty")
    return (
        limit_for_dry_run(ctx, stage, queries, stage.max_query_texts),
        limit_for_dry_run(ctx, stage, documents, stage.max_document_texts),
    )


def stage1_rows(ctx: StageContext, stage: Stage1AlignStage) -> dict[str, list[tuple[str, str]]]:
    """(student text, teacher text) rows per side: alignment data pairs each text with itself;
    ``datasets`` (the "Stage I on fine-tuning data" ablation) pairs each query with its positive."""
    if stage.alignment:
        queries, documents = alignment_texts(ctx, stage)
        sides = {"queries": [(t, t) for t in queries], "documents": [(t, t) for t in documents]}
    else:
        examples = gather_examples(ctx, stage)
        sides = {"queries": [(e.query, e.positive) for e in examples], "documents": []}
    return {k: v for k, v in sides.items() if v}


def stage1_align(ctx: StageContext, stage: Stage1AlignStage, embedder: AsymmetricEmbedder) -> StageReport:
    """Query alignment: query tower trained towards the frozen document tower's (cached) embeddings."""
    from care_retriever.training.losses import QueryAlignmentLoss
    from care_retriever.training.teacher_cache import build_teacher_cache

    sides = stage1_rows(ctx, stage)
    teacher_mode = stage.teacher
    set_trainable(embedder.tower("document").modules, False)
    set_trainable(embedder.tower("query").modules, True)
    model = embedder.to_sentence_transformer()
    prompt = embedder.query_prompt()
    extra: dict[str, Any] = {"teacher": teacher_mode}
    if teacher_mode == "cached":
        teacher_texts = unique([t for rows in sides.values() for _, t in rows])
        cache_start = time.perf_counter()
        # Under torchrun every rank encodes its share of the texts (teacher_cache.py).
        cache = build_teacher_cache(
            embedder,
            teacher_texts,
            ctx.out / "teacher_cache",
            show_progress=ctx.show_progress,
            dtype=stage_dtype(ctx, stage),
            fingerprint=embedder.space_fingerprint,  # the runner keeps it current (runner.py, tower_changed)
            full_width=stage.mse_target == "sliced",
            forward=option(ctx, stage, "forward", "auto"),
            compile=option(ctx, stage, "compile", "auto"),
        )
        index = {t: i for i, t in enumerate(teacher_texts)}
        data = {
            side: Dataset.from_dict({"text": [s for s, _ in rows], "label": [index[t] for _, t in rows]})
            for side, rows in sides.items()
        }
        extra.update(
            teacher_cache=str(cache.path),
            teacher_cache_reused=cache.reused,
            teacher_texts=len(cache),
            teacher_cache_seconds=round(time.perf_counter() - cache_start, 2),
            teacher_forward=cache.forward,
        )
        vectors = cache.vectors
        router = {"text": "query"}
    else:
        data = {
            side: Dataset.from_dict({"text": [s for s, _ in rows], "teacher_text": [t for _, t in rows]})
            for side, rows in sides.items()
        }
        vectors = None
        router = {"text": "query", "teacher_text": "document"}
    loss = QueryAlignmentLoss(
        model,
        vectors,
        lambda1=float(stage.lambda1),
        lambda2=float(stage.lambda2),
        temperature=temperature(ctx, stage),
        gather_across_devices=gather_flag(ctx, stage),
        mse_target=stage.mse_target,
        similarity=embedder.similarity,
    )
    # Queries get the query instruction (if the tower has one); documents fed to the query tower do not.
    # The teacher's texts get the document tower's own prompt, if it declares one (as when indexing).
    teacher = document_prompts(embedder, ("teacher_text",)) if "teacher_text" in router else {}
    by_side = {side: {**({"text": prompt} if prompt and side == "queries" else {}), **teacher} for side in data}
    prompts = {side: p for side, p in by_side.items() if p} or None
    dataset: Dataset | DatasetDict = DatasetDict(data) if len(data) > 1 or prompts else next(iter(data.values()))
    # a recomputed teacher runs the frozen tower in the trainer's passes: packed where the decision says so
    recompute = teacher_mode == "recompute"
    dtype = half_dtype(stage_dtype(ctx, stage))
    document_side: contextlib.AbstractContextManager[dict[str, Any] | None] = (
        stage_document_forward(embedder, option(ctx, stage, "forward", "auto"), f"stage {stage.name!r}", dtype)
        if recompute
        else contextlib.nullcontext(None)  # the cache holds the teacher: no document pass in training
    )
    try:
        with document_side as state:
            report = fit(
                ctx,
                stage,
                model,
                dataset,
                loss,
                router_mapping=router,
                prompts=prompts,
                examples=sum(len(rows) for rows in sides.values()),
            )
    finally:
        set_trainable(embedder.tower("document").modules, True)
    if recompute:
        extra["teacher_forward"] = state
    report.extra.update(extra)
    return report


# ----------------------------------------------------------------------------- Stage II
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
        with frozen_document_forward(ctx, stage, embedder, report, "mining_forward"):
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
    forward = option(ctx, stage, "forward", "auto")
    # decided on the tower as loaded, before LoRA wraps its layers; undone after LoRA is merged back
    with stage_document_forward(embedder, forward, where, half_dtype(stage_dtype(ctx, stage))) as state:
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
                _pair_dataset(examples, num),
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
        frozen_document_forward(ctx, stage, embedder, passes, "teacher_forward"),
        autocast(embedder.device, stage_dtype(ctx, stage)),  # the frozen tower as it runs in training
    ):
        vectors = embedder.embed_documents(texts, batch_size=64, show_progress=ctx.show_progress)
    row = {t: i for i, t in enumerate(texts)}
    scores = [[float(vectors[row[e.query]] @ vectors[row[c]]) for c in (e.positive, *e.negatives)] for e in examples]
    examples, anchor = row_prompted(examples, embedder.config)  # after the teacher scores (raw texts)
    dataset = _pair_dataset(examples, num).add_column("label", scores)
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


# Each runner takes its own StageSpec subclass: the recipe parser (recipe.STAGE_CLASSES) pairs kind and class.
STAGES: dict[str, Callable[[StageContext, Any, AsymmetricEmbedder], StageReport]] = {
    "mlm": stage_mlm,
    "clm": stage_clm,
    "stage0_query": stage0_query,
    "stage0_document": stage0_document,
    "stage1_align": stage1_align,
    "stage2_joint": stage2_joint,
    "distill": distill,
}


def seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
