"""What a training recipe says, as typed values: the model to start from (:class:`ModelSpec`), the data sets
(:class:`DatasetSpec`), one dataclass per stage type (:data:`STAGE_CLASSES`) and the :class:`Recipe` that holds them,
with the vocabularies their fields take.

These are read and checked from YAML by :mod:`care_retriever.training.recipe`; the stages and the runner take them
as they are. Importing this module imports no training library.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from care_retriever.errors import InputError

DATA_FORMATS = ("pairs", "qtr", "sts", "qa", "alignment", "text", "flag")
EXPORT_KINDS = ("asymmetric", "query-symmetric", "document-symmetric")
# Keys of ``defaults`` that are ours; everything else is a training argument.
OWN_DEFAULT_KEYS = {"temperature", "gather_across_devices", "length_buckets", "forward", "compile"}
HARD_NEGATIVE_KEYS = {"num", "mine", "range_min", "range_max", "duplicate_threshold", "miner"}
ALIGNMENT_KEYS = {"queries", "documents"}
MSE_TARGETS = ("renormalised", "sliced")


@dataclass
class DatasetSpec:
    """One training file and how to read it (see :mod:`care_retriever.training.pairs`)."""

    name: str
    path: str
    format: str = "pairs"
    min_label: float | None = None  # pairs/qtr: rows with label >= this are positives
    max_negative_label: float | None = None  # qtr: rows with label <= this are negatives of their query
    min_score: float | None = None  # sts: pairs with score >= this are positives
    with_description: bool = False  # qa: append the patient's description to the question
    max_rows: int | None = None  # read at most this many examples (after filtering)
    use_prompt: bool = True  # flag: a row's 'prompt' is its query instruction (false: rows get the model's default)


MODEL_SOURCES = ("preset", "path", "foundation", "query_model")


@dataclass
class ModelSpec:
    """Where the starting model comes from: a preset from scratch, a saved CARE folder, or two towers."""

    preset: str | None = None
    vocab_from: list[str] = field(default_factory=list)
    # Keys of the preset's architecture replaced (with ``preset`` only), e.g. a scaling curve's decoder
    # depth: ``document_config: {num_hidden_layers: 2}``.
    query_config: dict[str, Any] | None = None
    document_config: dict[str, Any] | None = None
    path: str | None = None
    # A finished ``miniature-foundation`` run folder (or its ``final``): language-model-pretrained towers.
    foundation: str | None = None
    query_model: str | None = None
    document_model: str | None = None
    dim: int | None = None  # expected shared dim; a different model is an error
    max_length: int | None = None
    # Replace the query tower's pooling (from scratch: "mean" trains far faster than "cls", whose
    # random-init outputs are nearly identical for every text).
    query_pooling: str | None = None
    # Replace the document tower's pooling. Pretrained LLM embedders (Qwen3-Embedding) keep their
    # "last_token"; for the miniature's from-scratch decoder "mean" was no better (kuake-qtr nDCG@10
    # 0.485 vs 0.52 with last_token), so the bundled recipes keep the default.
    document_pooling: str | None = None
    trust_remote_code: bool = False
    # The query prompt template kept in the model's care_config.json, e.g. the CARE authors' inference form
    # "<instruct>{instruction}\n<query>" (a flag row's ``prompt`` fills the slot; other rows get the default
    # instruction); None keeps the model's own.
    query_prompt_template: str | None = None
    # With query_model/document_model: "authors-release" reads the towers with the conventions of the CARE
    # authors' released models (care_retriever.model.towers.release), e.g. a new query tower against a released
    # ``doc_encoder``; a saved model (``path``) keeps its own conventions.
    convention: str | None = None


@dataclass
class StageSpec:
    """Keys every stage type takes; each stage type is a subclass adding its own (see ``STAGE_CLASSES``)."""

    name: str
    type: str
    source: str | None = None  # "from": the stage whose output this one starts from
    datasets: list[str] = field(default_factory=list)
    args: dict[str, Any] = field(default_factory=dict)
    export: dict[str, str] = field(default_factory=dict)  # export name -> kind
    max_examples: int | None = None  # a seeded sample of at most this many rows

    @classmethod
    def recipe_keys(cls) -> set[str]:
        """The YAML keys this stage type takes (``source`` is spelled ``from`` in a recipe)."""
        return {"from" if f.name == "source" else f.name for f in dataclasses.fields(cls)}

    @property
    def options(self) -> dict[str, Any]:
        """The type-specific keys and their values (for reports)."""
        common = {f.name for f in dataclasses.fields(StageSpec)}
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in common}


@dataclass
class MlmStage(StageSpec):
    """Masked-LM pretraining of a from-scratch BERT query tower (the paper's tower used RetroMAE)."""

    mlm_probability: float = 0.15


@dataclass
class ClmStage(StageSpec):
    """Causal-LM pretraining of a from-scratch decoder document tower (how LLMs are pretrained)."""


@dataclass
class EmbeddingStage(StageSpec):
    """Keys of the stages the sentence-transformers trainer runs (the LM stages use transformers' own)."""

    # Character-length bounds, e.g. [64]: each data set is split into buckets by its rows' longest text, so a
    # batch of short titles is not padded to the length of one long answer (each batch comes from one
    # bucket). Also a recipe ``defaults`` key.
    length_buckets: list[int] | None = None


@dataclass
class ContrastiveStage(EmbeddingStage):
    """Keys of the InfoNCE stages; ``None`` falls back to the recipe's ``defaults``."""

    temperature: float | None = None
    gather_across_devices: bool | str | None = None  # "auto": on when several processes train
    mini_batch_size: int | None = None  # GradCache: memory of a mini-batch, gradients of the batch


@dataclass
class Stage0QueryStage(ContrastiveStage):
    """Symmetric InfoNCE of the query tower."""


@dataclass
class Stage0DocumentStage(ContrastiveStage):
    """Symmetric InfoNCE + Matryoshka of the document tower (LoRA unless ``lora: false``)."""

    lora: dict[str, Any] | bool | None = None  # None/true: default LoRA; false: full training
    matryoshka_dims: list[int] | str | None = None  # "auto"/None: native, shared, half of shared


@dataclass
class Stage1AlignStage(EmbeddingStage):
    """Query alignment against the frozen document tower."""

    alignment: dict[str, list[str]] = field(default_factory=dict)  # queries/documents data set names
    lambda1: float = 1.0  # Asym-InfoNCE weight
    lambda2: float = 1.0  # MSE weight
    temperature: float | None = None
    gather_across_devices: bool | str | None = None
    teacher: str = "cached"  # "cached": the document tower runs once per text; "recompute": every step
    # The MSE's teacher row: "renormalised" (the document embedding sliced to the shared dim, then normalised:
    # the model's document vector) or "sliced" (normalised at the tower's full width, then sliced: the
    # CARE authors' code, whose row is shorter than 1 by the weight of the dims cut off).
    mse_target: str = "renormalised"
    # Caps of one side's alignment texts (a seeded sample), instead of max_examples: short query-side
    # texts are cheap steps, long document-side texts dear ones.
    max_query_texts: int | None = None
    max_document_texts: int | None = None
    # The frozen document tower's forward pass, decided as ``index`` decides it (care_retriever.runtime.forward):
    # auto | packed | padded (auto packs where a varlen kernel runs: CUDA in fp16 / bf16), and for the teacher
    # cache's encoding compile auto | on | off. None: the recipe's ``defaults``, else auto.
    forward: str | None = None
    compile: str | None = None


@dataclass
class Stage2JointStage(ContrastiveStage):
    """Joint fine-tuning: Asym-InfoNCE with hard negatives, LoRA on the document tower."""

    lora: dict[str, Any] | bool | None = None
    hard_negatives: dict[str, Any] = field(default_factory=dict)
    # The document side's forward pass with gradients: auto | packed | padded, as Stage1AlignStage's (not
    # compiled: LoRA and activation checkpointing wrap the layers a compile would replace).
    forward: str | None = None


@dataclass
class DistillStage(EmbeddingStage):
    """Baseline (Table 7): score distillation (KL + InfoNCE) from the document tower into the query tower."""

    hard_negatives: dict[str, Any] = field(default_factory=dict)
    kl_weight: float = 1.0
    temperature: float | None = None
    # The frozen document tower's passes (mining, the teacher scores): auto | packed | padded, as Stage2JointStage's.
    forward: str | None = None


STAGE_CLASSES: dict[str, type[StageSpec]] = {
    "mlm": MlmStage,
    "clm": ClmStage,
    "stage0_query": Stage0QueryStage,
    "stage0_document": Stage0DocumentStage,
    "stage1_align": Stage1AlignStage,
    "stage2_joint": Stage2JointStage,
    "distill": DistillStage,
}
STAGE_TYPES = tuple(STAGE_CLASSES)


@dataclass
class Recipe:
    """A validated recipe; ``raw`` is its YAML mapping as read, what :meth:`fingerprint` hashes."""

    name: str
    model: ModelSpec
    datasets: dict[str, DatasetSpec]
    stages: list[StageSpec]
    defaults: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    final: str | None = None
    # A folder of evaluation tasks (relative to --data-dir): training examples whose query is one of
    # their queries are dropped before anything trains (see training.pairs.task_queries).
    exclude_task_queries: str | None = None
    source_path: str = "<recipe>"
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def final_stage(self) -> str:
        return self.final or self.stages[-1].name

    def fingerprint(self, **extra: Any) -> str:
        """Identifies what a run computes; a resume from another recipe's folder is refused with it."""
        payload = json.dumps({"recipe": self.raw, **extra}, sort_keys=True, ensure_ascii=False, default=str)
        return hashlib.blake2b(payload.encode("utf-8"), digest_size=12).hexdigest()

    def with_seed(self, seed: int) -> Recipe:
        """The same recipe under another seed (its own fingerprint: a run of one seed never resumes another's)."""
        return dataclasses.replace(self, seed=seed, raw={**self.raw, "seed": seed})

    def trusting_remote_code(self) -> Recipe:
        """The same recipe with ``model.trust_remote_code`` on (``train --trust-remote-code``)."""
        model = dataclasses.replace(self.model, trust_remote_code=True)
        raw_model = {**self.raw.get("model", {}), "trust_remote_code": True}
        return dataclasses.replace(self, model=model, raw={**self.raw, "model": raw_model})

    def stage(self, name: str) -> StageSpec:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise InputError(f"{self.source_path}: no stage named {name!r}")
