"""A training row's own query instruction (a ``flag`` row's ``prompt``): where a stage and the model can apply
it (checked before anything trains), and the examples with it written into their query text.

The rows are read by :mod:`care_retriever.training.pairs`; the stages that train queries
(:data:`ROW_PROMPT_STAGES`) write the prompts in with :func:`row_prompted`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from care_retriever.errors import InputError
from care_retriever.training.pairs import Example, unique


def row_prompt_example(examples: list[Example]) -> Example | None:
    """The first example carrying its own query instruction (a ``flag`` row's ``prompt``), if any."""
    return next((e for e in examples if e.instruction is not None), None)


# Stage types whose anchors are queries encoded by the query tower under its query prompt: there a row's own
# instruction replaces the default one. Elsewhere (Stage 0 of the document tower, Stage I's texts) it cannot.
ROW_PROMPT_STAGES = ("stage0_query", "stage2_joint", "distill")


def check_row_prompts(stages: list[Any], formats: dict[str, str], load: Any, template: str | None) -> None:
    """Refuse, naming the first such row, per-row prompts that a stage or the model cannot apply.

    ``stages``: recipe stage specs; ``formats``: data set name -> format; ``load``: name -> :class:`PairSet`;
    ``template``: the model's ``care_config.json`` ``query_prompt_template``.
    """
    for stage in stages:
        alignment = getattr(stage, "alignment", None) or {}
        names = list(stage.datasets) + [n for key in ("queries", "documents") for n in alignment.get(key, [])]
        for name in unique(names):
            if formats.get(name) != "flag":
                continue
            first = row_prompt_example(load(name).examples)
            if first is None:
                continue
            if stage.type not in ROW_PROMPT_STAGES:
                raise InputError(
                    f"{first.where}: row has a 'prompt', which stage {stage.name!r} ({stage.type}) cannot apply per "
                    f"row (only {', '.join(ROW_PROMPT_STAGES)} stages can); set use_prompt: false on data set "
                    f"{name!r} to train without the rows' prompts"
                )
            if not template or "{instruction}" not in template:
                raise InputError(
                    f"{first.where}: row has a 'prompt', but the model's query tower takes no instruction "
                    f"(care_config.json query_prompt_template {template!r} has no {{instruction}} slot); set "
                    f"use_prompt: false on data set {name!r} to train without the rows' prompts"
                )


def row_prompted(examples: list[Example], config: Any) -> tuple[list[Example], list[str]]:
    """``examples`` with their rows' own query prompts written in where any row has one (:func:`with_row_prompts`,
    ``config``: the model's :class:`~care_retriever.model.config.CareConfig`), and the columns a stage still
    gives the model's query prompt: ``["anchor"]``, or none once the prompts are in the texts."""
    if row_prompt_example(examples) is None:
        return examples, ["anchor"]
    return with_row_prompts(examples, config.query_prompt_template, config.query_prompt()), []


def with_row_prompts(examples: list[Example], template: str | None, default_prompt: str | None) -> list[Example]:
    """The examples with their query prompt written into the query: a row's own instruction filled into
    ``template``, ``default_prompt`` (the model's prompt, may be None) for the others; for FlagEmbedding's
    symmetric_sts/clustering rows the row's prompt goes before the positive and negatives too. A stage that
    trains these passes no query prompt for the anchor column (it is in the text; the same tokens as the
    trainer's ``prompts`` give: no pooling here excludes prompt tokens)."""
    from care_retriever.model.towers.prompts import fill_query_prompt

    out: list[Example] = []
    for e in examples:
        own = fill_query_prompt(template, e.instruction) if e.instruction is not None else None
        prompt = own if own is not None else (default_prompt or "")
        if e.instruct_candidates and own is not None:
            out.append(
                replace(e, query=prompt + e.query, positive=own + e.positive, negatives=[own + n for n in e.negatives])
            )
        else:
            out.append(replace(e, query=prompt + e.query))
    return out
