"""Language-model pretraining of from-scratch towers, before the contrastive stages.

A random tower has never seen language. CARE starts from pretrained models (a RetroMAE-pretrained
BERT query tower, an LLM document tower); a from-scratch miniature gets the minimum of that:

- ``mlm``: masked-LM pretraining of a BERT query tower (the paper's query tower used RetroMAE).
- ``clm``: causal-LM (next-token) pretraining of a decoder document tower, the objective LLMs
  are pretrained with.

Each wraps the tower's base model in the matching LM-head model *sharing* its weights (the head
is discarded afterwards) and trains it with the Hugging Face ``Trainer`` and
``DataCollatorForLanguageModeling``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from care_retriever.errors import InputError
from care_retriever.model.embedder import AsymmetricEmbedder
from care_retriever.runtime.architecture import is_decoder
from care_retriever.training.pairs import read_texts, resolve_data_path, unique
from care_retriever.training.recipe_spec import ClmStage, MlmStage, StageSpec
from care_retriever.training.stage_context import (
    StageContext,
    StageReport,
    limit_for_dry_run,
    train_stage,
    trainer_settings,
)

if TYPE_CHECKING:
    import torch
    from sentence_transformers.sentence_transformer.modules import Transformer
    from transformers import DataCollatorForLanguageModeling


def pretraining_texts(ctx: StageContext, stage: StageSpec) -> list[str]:
    """Raw text of the stage's data sets: ``text`` files as they are, pair files as their queries and documents."""
    texts: list[str] = []
    for name in stage.datasets:
        spec = ctx.datasets[name]
        if spec.format == "text":
            texts.extend(read_texts(resolve_data_path(spec.path, ctx.data_dir)))
        else:
            pairs = ctx.load_pairset(name)
            texts.extend(pairs.queries() + pairs.documents())
    texts = unique(texts)
    if not texts:
        raise InputError(f"stage {stage.name!r}: no text for {stage.type} pretraining")
    return texts


def stage_mlm(ctx: StageContext, stage: MlmStage, embedder: AsymmetricEmbedder) -> StageReport:
    """Masked-LM pretraining of the query tower (BERT)."""
    from transformers import BertForMaskedLM, BertModel, DataCollatorForLanguageModeling

    transformer = embedder.tower("query").transformer
    encoder = transformer.auto_model
    if not isinstance(encoder, BertModel):
        raise InputError(
            f"stage {stage.name!r}: MLM pretraining supports BERT query towers, got {type(encoder).__name__}"
        )
    mlm = BertForMaskedLM(encoder.config)
    mlm.bert = encoder  # shared: training the MLM model trains the tower
    if transformer.tokenizer is None:
        raise InputError(f"stage {stage.name!r}: the query tower has no tokenizer")
    collator = DataCollatorForLanguageModeling(transformer.tokenizer, mlm_probability=float(stage.mlm_probability))
    return _pretrain(ctx, stage, transformer, mlm, collator)


def stage_clm(ctx: StageContext, stage: ClmStage, embedder: AsymmetricEmbedder) -> StageReport:
    """Causal-LM pretraining of the document tower (a decoder with a ``*ForCausalLM`` class)."""
    import torch
    from transformers import AutoModelForCausalLM, DataCollatorForLanguageModeling, PreTrainedModel

    transformer = embedder.tower("document").transformer
    decoder = transformer.auto_model
    refused = InputError(
        f"stage {stage.name!r}: causal-LM pretraining needs a decoder document tower, got {type(decoder).__name__}"
    )
    if not is_decoder(transformer) or not isinstance(decoder, PreTrainedModel):
        raise refused
    # Built on the meta device: its own copy of the decoder is never allocated, only replaced.
    try:
        with torch.device("meta"):
            lm = AutoModelForCausalLM.from_config(decoder.config)
    except ValueError as exc:  # no causal-LM class for this configuration
        raise refused from exc
    setattr(lm, lm.base_model_prefix, decoder)  # shared: training the LM trains the tower
    embeddings = decoder.get_input_embeddings().weight
    if not isinstance(embeddings, torch.nn.Parameter):  # an embedding module with its table elsewhere
        raise refused
    head = torch.nn.Linear(embeddings.shape[1], embeddings.shape[0], bias=False, device=embeddings.device)
    if decoder.config.tie_word_embeddings:
        head.weight = embeddings
    else:
        torch.nn.init.normal_(head.weight, std=getattr(decoder.config, "initializer_range", 0.02))
    lm.set_output_embeddings(head)
    tokenizer = transformer.tokenizer
    if tokenizer is None or tokenizer.pad_token is None:
        raise InputError(f"stage {stage.name!r}: the document tower's tokenizer has no pad token")
    collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)
    return _pretrain(ctx, stage, transformer, lm, collator)


def _pretrain(
    ctx: StageContext,
    stage: StageSpec,
    transformer: Transformer,
    lm: torch.nn.Module,
    collator: DataCollatorForLanguageModeling,
) -> StageReport:
    from datasets import Dataset

    from care_retriever.training.engine import CareLmTrainer, JsonlLogCallback, build_arguments

    texts = limit_for_dry_run(ctx, stage, pretraining_texts(ctx, stage))
    tokenizer = transformer.tokenizer
    if tokenizer is None:  # the stage runners refuse such a tower before building its LM: this is for the type
        raise InputError(f"stage {stage.name!r}: the tower has no tokenizer")
    encoded = tokenizer(texts, truncation=True, max_length=transformer.max_seq_length or 512)
    dataset = Dataset.from_dict({"input_ids": encoded["input_ids"]})
    lm.to(transformer.auto_model.device)
    output_dir = ctx.out / "checkpoints" / stage.name
    args = build_arguments(
        output_dir, trainer_settings(ctx, stage), seed=ctx.seed, max_steps=ctx.dry_run_steps, plain=True
    )
    args.disable_tqdm = not ctx.show_progress
    trainer = CareLmTrainer(
        model=lm,
        args=args,
        train_dataset=dataset,
        data_collator=collator,
        callbacks=[JsonlLogCallback(ctx.out / "logs" / f"{stage.name}.jsonl", stage.name)],
        care_fingerprint=ctx.fingerprint,
    )
    from care_retriever.training.quiet import quiet_trainer

    quiet_trainer(trainer, stage.name)  # one bar per stage, no raw log dicts
    report = train_stage(ctx, stage, trainer, output_dir, examples=len(texts))
    side = "query" if stage.type == "mlm" else "document"
    epochs = float(trainer.state.epoch or 0.0)
    report.extra.update(pretraining_compute(side, transformer.auto_model, encoded["input_ids"], epochs))
    return report


def pretraining_compute(side: str, tower: Any, input_ids: list[list[int]], epochs: float) -> dict[str, Any]:
    """The tower's pretraining compute as the paper's head start is counted: parameters x tokens trained
    (the tower's own parameters, not the discarded LM head; tokens of one epoch x epochs run)."""
    parameters = sum(p.numel() for p in tower.parameters())
    tokens = round(sum(len(ids) for ids in input_ids) * epochs)
    return {"tower": side, "tower_parameters": parameters, "tokens": tokens, "compute": parameters * tokens}


def compute_ratio(reports: list[dict[str, Any]]) -> float | None:
    """Document-tower pretraining compute / query-tower pretraining compute of a run (None without both)."""
    totals = {"query": 0, "document": 0}
    for report in reports:
        if report.get("tower") in totals:
            totals[report["tower"]] += int(report.get("compute", 0))
    return totals["document"] / totals["query"] if totals["query"] and totals["document"] else None
