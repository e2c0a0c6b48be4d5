"""The training engine: sentence-transformers' trainer with CARE's checkpoints and logs.

Everything a trainer does well (optimizer, schedule, gradient accumulation, bf16/fp16, gradient
checkpointing, seeds, progress bars, DDP/DeepSpeed through accelerate/torchrun) comes from
``SentenceTransformerTrainer``. Two things are changed:

- Checkpoints hold the trained parameters of the model (safetensors; :func:`trainable_state`) plus
  the run's recipe fingerprint. The stock checkpoint writes a sentence-transformers folder, in which a peft
  adapter is saved *without* its base weights and points at the base model's original path; for a
  tower built from scratch that path was a temporary folder, so resuming would fail. Loading a
  checkpoint of another recipe is refused with a one-line error.
- Each ``on_log`` event is appended to ``logs/<stage>.jsonl`` (loss, learning rate, epoch, step).
"""

from __future__ import annotations

import itertools
import json
import os
import time
from pathlib import Path
from typing import Any, Literal, overload

import torch
from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
from transformers import Trainer, TrainerCallback, TrainingArguments

from care_retriever.errors import InputError

STATE_FILE = "care_state.safetensors"
RUN_FILE = "care_run.json"


class JsonlLogCallback(TrainerCallback):
    """Append the trainer's log events (loss, lr, grad norm, epoch, step) to a JSONL file.

    A run killed after its last checkpoint logged steps that the resumed run trains again: at the
    start of training, rows past the step training starts from (the checkpoint's, 0 on a fresh
    start) are dropped, so the file holds each step once.
    """

    def __init__(self, path: Path, stage: str) -> None:
        self.path = path
        self.stage = stage

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero or not self.path.is_file():
            return
        lines = self.path.read_text("utf-8").splitlines(keepends=True)
        kept = [line for line in lines if line.strip() and json.loads(line).get("step", 0) <= state.global_step]
        if len(kept) != len(lines):
            tmp = self.path.with_name(f".{self.path.name}.tmp")
            tmp.write_text("".join(kept), encoding="utf-8")
            os.replace(tmp, self.path)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        row = {"stage": self.stage, "step": state.global_step, "epoch": state.epoch, "time": time.time(), **logs}
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(row, default=float) + "\n")


class CareTrainer(SentenceTransformerTrainer):
    """``SentenceTransformerTrainer`` whose checkpoints are state dicts tagged with the recipe fingerprint."""

    def __init__(self, *args: Any, care_fingerprint: str, **kwargs: Any) -> None:
        self.care_fingerprint = care_fingerprint
        super().__init__(*args, **kwargs)

    def add_model_card_callback(self, default_args_dict: dict[str, Any]) -> None:
        # The model card callback encodes widget examples at start-up: seconds of CPU time per stage
        # for a card nobody reads (the saved CARE model gets its card from save_pretrained).
        return None

    def _save(self, output_dir: str | None = None, state_dict: dict[str, Any] | None = None) -> None:
        from safetensors.torch import save_file

        target = Path(output_dir or self.args.output_dir or ".")  # build_arguments always sets output_dir
        target.mkdir(parents=True, exist_ok=True)
        save_file(trainable_state(self.model), str(target / STATE_FILE))
        (target / RUN_FILE).write_text(json.dumps({"fingerprint": self.care_fingerprint}))
        torch.save(self.args, target / "training_args.bin")

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        from safetensors.torch import load_file

        folder = Path(resume_from_checkpoint)
        if not (folder / STATE_FILE).is_file():
            raise InputError(f"{folder}: not a care-retriever checkpoint (no {STATE_FILE})")
        check_fingerprint(folder, self.care_fingerprint)
        load_trainable_state(model or self.model, load_file(str(folder / STATE_FILE)), folder)


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What a checkpoint holds: the parameters the stage trains, each in its own storage.

    The frozen rest (a LoRA stage's base tower, Stage I's teacher) is the stage's starting model, which
    the run keeps on disk until the stage is done, so a checkpoint of a 4B LoRA stage is megabytes, not
    16 GB. Each tensor is copied out of shared storage: transformers' weight conversion of some towers
    (gte's fused qkv chunked into q/k/v) leaves parameters that are views of one larger storage, which
    safetensors refuses to save ("found no suitable name to keep for saving").
    """
    return {
        name: param.detach().to("cpu", copy=True).contiguous()
        for name, param in model.named_parameters()
        if param.requires_grad
    }


def load_trainable_state(model: torch.nn.Module, state: dict[str, torch.Tensor], folder: Path) -> None:
    """Copy a checkpoint's parameters into ``model`` (a checkpoint holding every weight loads too);
    one missing trainable parameter or one name the model lacks is refused."""
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    missing = sorted(n for n, p in params.items() if p.requires_grad and n not in state)
    unknown = sorted(n for n in state if n not in params and n not in buffers)
    if missing or unknown:
        what = f"lacks {missing[0]}" if missing else f"holds {unknown[0]}, which this model has no place for"
        raise InputError(f"{folder}: checkpoint {what}; use a new --out")
    model.load_state_dict(state, strict=False)


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Give a sentence-transformers model the ``activation_checkpointing_enable`` the trainer calls.

    transformers 5 renamed ``gradient_checkpointing_enable``: the trainer calls the new name where a
    model defines it and otherwise warns (``FutureWarning``) and calls the old one, which warns again.
    ``SentenceTransformer`` defines only the old name; this forwards the new one to each tower's
    transformers model (``PreTrainedModel.activation_checkpointing_enable``), which is what the old one did.
    """
    from sentence_transformers.sentence_transformer.modules import Transformer

    def activation_checkpointing_enable(activation_checkpointing_kwargs=None, **kwargs: Any) -> None:
        for module in model.modules():
            if isinstance(module, Transformer):
                module.auto_model.activation_checkpointing_enable(
                    activation_checkpointing_kwargs=activation_checkpointing_kwargs, **kwargs
                )

    if not hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable = activation_checkpointing_enable  # type: ignore[assignment]


def check_fingerprint(folder: Path, fingerprint: str) -> None:
    """Refuse a checkpoint written by another recipe (or by no care-retriever run)."""
    run = folder / RUN_FILE
    if not run.is_file():
        raise InputError(f"{folder}: not a care-retriever checkpoint (no {RUN_FILE})")
    found = json.loads(run.read_text()).get("fingerprint")
    if found != fingerprint:
        raise InputError(
            f"{folder}: checkpoint of another recipe (fingerprint {found}, this run {fingerprint}); use a new --out"
        )


class CareLmTrainer(Trainer):
    """The language-model pretraining trainer (``mlm``/``clm``): stock checkpoints, tagged with the
    recipe fingerprint like :class:`CareTrainer`'s, and refused on resume by another recipe."""

    def __init__(self, *args: Any, care_fingerprint: str, **kwargs: Any) -> None:
        self.care_fingerprint = care_fingerprint
        super().__init__(*args, **kwargs)

    def _save(self, output_dir: str | None = None, state_dict: dict[str, Any] | None = None) -> None:
        super()._save(output_dir, state_dict)
        target = Path(output_dir or self.args.output_dir or ".")  # build_arguments always sets output_dir
        (target / RUN_FILE).write_text(json.dumps({"fingerprint": self.care_fingerprint}))

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        check_fingerprint(Path(resume_from_checkpoint), self.care_fingerprint)
        super()._load_from_checkpoint(resume_from_checkpoint, model)


@overload
def build_arguments(
    output_dir: Path,
    settings: dict[str, Any],
    *,
    seed: int,
    router_mapping: dict[str, str] | None = None,
    prompts: dict[str, Any] | None = None,
    max_steps: int | None = None,
    plain: Literal[False] = False,
) -> SentenceTransformerTrainingArguments: ...
@overload
def build_arguments(
    output_dir: Path,
    settings: dict[str, Any],
    *,
    seed: int,
    router_mapping: dict[str, str] | None = None,
    prompts: dict[str, Any] | None = None,
    max_steps: int | None = None,
    plain: Literal[True],
) -> TrainingArguments: ...
def build_arguments(
    output_dir: Path,
    settings: dict[str, Any],
    *,
    seed: int,
    router_mapping: dict[str, str] | None = None,
    prompts: dict[str, Any] | None = None,
    max_steps: int | None = None,
    plain: bool = False,
) -> TrainingArguments:
    """Trainer arguments: CARE defaults, then the recipe's ``defaults``, then the stage's ``args``.

    ``plain``: ``transformers.TrainingArguments`` for a non-sentence-transformers model (MLM).
    """
    from sentence_transformers.base.sampler import BatchSamplers

    args: dict[str, Any] = {
        "per_device_train_batch_size": 32,
        "learning_rate": 1e-4,
        "warmup_steps": 0.05,  # a float < 1 is a ratio of the total steps (transformers v5)
        "lr_scheduler_type": "linear",
        "num_train_epochs": 1,
        "logging_steps": 10,
        "save_strategy": "steps",
        "save_steps": 500,
        "save_total_limit": 2,
        "report_to": "none",
        "batch_sampler": BatchSamplers.NO_DUPLICATES,
        "dataloader_drop_last": False,
        "seed": seed,
    }
    args.update(settings)
    if max_steps is not None:
        args["max_steps"] = max_steps  # a dry run saves checkpoints as the real run does (one at its end)
    if not torch.cuda.is_available():
        args["use_cpu"] = True
        if args.get("fp16"):
            raise InputError("fp16 needs a CUDA GPU; use bf16 (or neither) on CPU")
    try:
        if plain:
            for key in ("batch_sampler", "multi_dataset_batch_sampler"):
                args.pop(key, None)
            return TrainingArguments(output_dir=str(output_dir), **args)
        return SentenceTransformerTrainingArguments(
            output_dir=str(output_dir),
            router_mapping=router_mapping or {},
            prompts=prompts or None,
            **args,
        )
    except (ValueError, TypeError) as exc:
        raise InputError(f"training arguments: {str(exc).splitlines()[0]}") from exc


def bucket_by_length(dataset: Any, prompts: Any, bounds: list[int]) -> tuple[Any, Any, dict[str, int]]:
    """Split each data set into buckets by the character length of its rows' longest text.

    The trainer draws every batch from one data set (a ``DatasetDict``), so a bucket's batches pad to
    lengths like their own: a batch of 20-character titles no longer pays for one 200-character answer
    (at max_length 256 most batches of the mixed miniature data held one). Per-data-set prompts follow
    their data set's buckets. Returns the data sets, the prompts and the rows per bucket.
    """
    from datasets import DatasetDict

    sets = dict(dataset) if isinstance(dataset, DatasetDict) else {"train": dataset}
    keyed = isinstance(prompts, dict) and any(name in prompts for name in sets)
    edges: list[int | None] = [0, *bounds, None]
    buckets: dict[str, Any] = {}
    bucket_prompts: dict[str, Any] = {}
    for name, data in sets.items():
        columns = [c for c in data.column_names if getattr(data.features[c], "dtype", None) == "string"]
        lengths = [max(map(len, texts)) for texts in zip(*(data[c] for c in columns), strict=True)]
        for lo, hi in itertools.pairwise(edges):
            assert lo is not None  # only the last edge is open
            rows = [i for i, n in enumerate(lengths) if n >= lo and (hi is None or n < hi)]
            if rows:
                label = f"{name}@{lo}+" if hi is None else f"{name}@{lo}-{hi - 1}"
                buckets[label] = data.select(rows)
                if keyed and name in prompts:
                    bucket_prompts[label] = prompts[name]
    sizes = {label: len(data) for label, data in buckets.items()}
    return DatasetDict(buckets), (bucket_prompts or None) if keyed else prompts, sizes


def last_checkpoint(output_dir: Path) -> str | None:
    """The newest *complete* ``checkpoint-N`` folder, or None.

    The trainer writes a checkpoint in place (model, optimizer, scheduler, RNG states, then
    ``trainer_state.json`` last): a run killed while saving leaves a newer folder with only some
    of those files. Resuming from it would fail or restore a mix; the previous checkpoint is used.
    """
    from transformers.trainer import TRAINER_STATE_NAME
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    if not output_dir.is_dir():
        return None
    steps: list[tuple[int, Path]] = []
    for folder in output_dir.glob(f"{PREFIX_CHECKPOINT_DIR}-*"):
        suffix = folder.name.removeprefix(f"{PREFIX_CHECKPOINT_DIR}-")
        if folder.is_dir() and suffix.isdigit():
            steps.append((int(suffix), folder))
    for _, folder in sorted(steps, reverse=True):
        try:
            json.loads((folder / TRAINER_STATE_NAME).read_text("utf-8"))
        except (OSError, ValueError):
            continue  # half-written: the kill came before (or while) its last file was written
        return str(folder)
    return None


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main_process() -> bool:
    """Rank 0 of a torchrun job, or the only process: the one that writes the run folder."""
    return int(os.environ.get("RANK", "0")) == 0


def process_state():
    """accelerate's process state, as the trainer builds it (``cpu`` without CUDA): on CPU, a bare
    ``PartialState()`` would not see torchrun's processes and its barriers would not wait."""
    from accelerate import PartialState

    return PartialState(cpu=not torch.cuda.is_available())


def wait_for_everyone() -> None:
    """A barrier across torchrun's processes (starting the process group if needed); no-op alone."""
    if world_size() > 1:
        process_state().wait_for_everyone()
