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
  negatives plus in-batch negatives, one learning rate (in :mod:`care_retriever.training.joint_stages`, with
  ``distill``, score distillation into the query tower).
- ``mlm`` / ``clm`` (in :mod:`care_retriever.training.pretraining`): masked-LM pretraining of a
  from-scratch query tower / causal-LM pretraining of a from-scratch decoder document tower.

What the stages share is in :mod:`care_retriever.training.stage_common`.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from datasets import Dataset, DatasetDict

from care_retriever.errors import InputError
from care_retriever.training.joint_stages import distill, stage2_joint
from care_retriever.training.lora import LoraSpec, merge_lora
from care_retriever.training.pairs import unique
from care_retriever.training.pretraining import stage_clm, stage_mlm
from care_retriever.training.recipe_spec import (
    Stage0DocumentStage,
    Stage0QueryStage,
    Stage1AlignStage,
)
from care_retriever.training.row_prompts import row_prompted
from care_retriever.training.stage_common import (
    contrastive_loss,
    document_prompts,
    fit,
    gather_examples,
    gather_flag,
    lora_on,
    pair_dataset,
    query_prompts,
    set_trainable,
    temperature,
)
from care_retriever.training.stage_context import (
    StageContext,
    StageReport,
    limit_for_dry_run,
    option,
    stage_dtype,
)
from care_retriever.training.tower_forward import (
    stage_forward,
)

if TYPE_CHECKING:
    from care_retriever.model.embedder import AsymmetricEmbedder

logger = logging.getLogger("care_retriever")


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
            pair_dataset(examples),
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
        report = fit(ctx, stage, model, pair_dataset(examples), loss, prompts=prompts, examples=len(examples))
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
            fingerprint=embedder.space_fingerprint,  # the runner keeps it current (runner.py, run_stage)
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
    document_side: contextlib.AbstractContextManager[dict[str, Any] | None] = (
        stage_forward(ctx, stage, embedder)
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
# Each runner takes its own StageSpec subclass: the recipe parser (recipe_spec.STAGE_CLASSES) pairs kind and class.
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
