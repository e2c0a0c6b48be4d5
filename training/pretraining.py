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

from typing import Any

from care_retriever.embedder import is_decoder
from care_retriever.errors import InputError
from care_retriever.training.lora import transformer_of
from care_retriever.training.pairs import read_texts, resolve_data_path, unique


def pretraining_texts(ctx: Any, stage: Any) -> list[str]:
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


def stage_mlm(ctx: Any, stage: Any, embedder: Any):
    """Masked-LM pretraining of the query tower (BERT)."""
    from transformers import BertForMaskedLM, BertModel, DataCollatorForLanguageModeling

    transformer = transformer_of(embedder.query_modules)
    encoder = transformer.auto_model
    if not isinstance(encoder, BertModel):
        raise InputError(
            f"stage {stage.name!r}: MLM pretraining supports BERT query towers, got {type(encoder).__name__}"
        )
    mlm = BertForMaskedLM(encoder.config)
    mlm.bert = encoder  # shared: training the MLM model trains the tower
    collator = DataCollatorForLanguageModeling(
        transformer.tokenizer, mlm_probability=float(stage.options.get("mlm_probability", 0.15))
    )
    return _pretrain(ctx, stage, transformer, mlm, collator)


def stage_clm(ctx: Any, stage: Any, embedder: Any):
    """Causal-LM pretraining of the document tower (a decoder with a ``*ForCausalLM`` class)."""
    import torch
    from transformers import AutoModelForCausalLM, DataCollatorForLanguageModeling, PreTrainedModel

    transformer = transformer_of(embedder.document_modules)
    decoder = transformer.auto_model
    lm_class = AutoModelForCausalLM._model_mapping.get(type(decoder.config), None) if is_decoder(transformer) else None
    if lm_class is None or not isinstance(decoder, PreTrainedModel):
        raise InputError(
            f"stage {stage.name!r}: causal-LM pretraining needs a decoder document tower, got {type(decoder).__name__}"
        )
    # Built on the meta device: its own copy of the decoder is never allocated, only replaced.
    with torch.device("meta"):
        lm = lm_class(decoder.config)
    setattr(lm, lm.base_model_prefix, decoder)  # shared: training the LM trains the tower
    embeddings = decoder.get_input_embeddings().weight
    head = torch.nn.Linear(embeddings.shape[1], embeddings.shape[0], bias=False, device=embeddings.device)
    if decoder.config.tie_word_embeddings:
        head.weight = embeddings
    else:
        torch.nn.init.normal_(head.weight, std=getattr(decoder.config, "initializer_range", 0.02))
    lm.set_output_embeddings(head)
    tokenizer = transformer.tokenizer
    if tokenizer.pad_token is None:
        raise InputError(f"stage {stage.name!r}: the document tower's tokenizer has no pad token")
    collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)
    return _pretrain(ctx, stage, transformer, lm, collator)


def _pretrain(ctx: Any, stage: Any, transformer: Any, lm: Any, collator: Any):
    from datasets import Dataset
    from transformers import Trainer

    from care_retriever.training.engine import JsonlLogCallback, build_arguments
    from care_retriever.training.stages import limit_for_dry_run, train_stage, trainer_settings

    texts = limit_for_dry_run(ctx, stage, pretraining_texts(ctx, stage))
    encoded = transformer.tokenizer(texts, truncation=True, max_length=transformer.max_seq_length or 512)
    dataset = Dataset.from_dict({"input_ids": encoded["input_ids"]})
    lm.to(transformer.auto_model.device)
    output_dir = ctx.out / "checkpoints" / stage.name
    args = build_arguments(
        output_dir, trainer_settings(ctx, stage), seed=ctx.seed, max_steps=ctx.dry_run_steps, plain=True
    )
    args.disable_tqdm = not ctx.show_progress
    trainer = Trainer(
        model=lm,
        args=args,
        train_dataset=dataset,
        data_collator=collator,
        callbacks=[JsonlLogCallback(ctx.out / "logs" / f"{stage.name}.jsonl", stage.name)],
    )
    from care_retriever.training.quiet import quiet_trainer

    quiet_trainer(trainer)  # one bar per stage, no raw log dicts
    return train_stage(ctx, stage, trainer, output_dir, examples=len(texts))
