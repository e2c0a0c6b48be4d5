"""Masked-LM pretraining of a from-scratch BERT query tower (the paper uses RetroMAE; MLM is the minimum).

A random query tower has never seen language; a short MLM pass over the training texts teaches it
token statistics before the contrastive stages. The tower's ``BertModel`` is wrapped in a
``BertForMaskedLM`` *sharing* its encoder, trained with the Hugging Face ``Trainer`` and
``DataCollatorForLanguageModeling``; the MLM head is discarded afterwards.
"""

from __future__ import annotations

import time
from typing import Any

from care_retriever.errors import InputError
from care_retriever.training.lora import transformer_of
from care_retriever.training.pairs import read_texts, resolve_data_path, unique


def mlm_texts(ctx: Any, stage: Any) -> list[str]:
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
        raise InputError(f"stage {stage.name!r}: no text for MLM")
    return texts


def stage_mlm(ctx: Any, stage: Any, embedder: Any):
    from datasets import Dataset
    from transformers import BertForMaskedLM, BertModel, DataCollatorForLanguageModeling, Trainer

    from care_retriever.training.engine import JsonlLogCallback, build_arguments, last_checkpoint
    from care_retriever.training.stages import StageReport, limit_for_dry_run, trainer_settings

    transformer = transformer_of(embedder.query_modules)
    encoder = transformer.auto_model
    if not isinstance(encoder, BertModel):
        raise InputError(
            f"stage {stage.name!r}: MLM pretraining supports BERT query towers, got {type(encoder).__name__}"
        )
    tokenizer = transformer.tokenizer
    texts = limit_for_dry_run(ctx, stage, mlm_texts(ctx, stage))
    encoded = tokenizer(texts, truncation=True, max_length=transformer.max_seq_length or 512)
    dataset = Dataset.from_dict({"input_ids": encoded["input_ids"]})
    mlm = BertForMaskedLM(encoder.config)
    mlm.bert = encoder  # shared: training the MLM model trains the tower
    mlm.to(encoder.device)
    collator = DataCollatorForLanguageModeling(
        tokenizer, mlm_probability=float(stage.options.get("mlm_probability", 0.15))
    )
    output_dir = ctx.out / "checkpoints" / stage.name
    args = build_arguments(
        output_dir, trainer_settings(ctx, stage), seed=ctx.seed, max_steps=ctx.dry_run_steps, plain=True
    )
    args.disable_tqdm = not ctx.show_progress
    trainer = Trainer(
        model=mlm,
        args=args,
        train_dataset=dataset,
        data_collator=collator,
        callbacks=[JsonlLogCallback(ctx.out / "logs" / f"{stage.name}.jsonl", stage.name)],
    )
    checkpoint = last_checkpoint(output_dir) if ctx.resume else None
    start = time.perf_counter()
    trainer.train(resume_from_checkpoint=checkpoint)
    losses = [float(row["loss"]) for row in trainer.state.log_history if "loss" in row]
    return StageReport(
        stage.name,
        stage.type,
        examples=len(texts),
        steps=trainer.state.global_step,
        seconds=time.perf_counter() - start,
        losses=losses,
    )
