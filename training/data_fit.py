"""A stage's batch fitted to its data before the trainer sees it.

The trainer's data loader has no batch at all when every data set of a stage holds fewer rows than one batch
and the last partial batch is dropped (``dataloader_drop_last``: the recipes' setting, for full batches of
in-batch negatives): transformers then stops with ``args.max_steps must be set to a positive value if
dataloader does not have a length``. A real run and a ``--dry-run-steps`` run both get the batch capped to the
largest data set instead (its last partial batch kept), with one warning, so a small data set trains (and a
dry run checks what the real run will meet). An empty stage is refused in one line.
"""

from __future__ import annotations

import logging
from typing import Any

from care_retriever.errors import InputError

logger = logging.getLogger("care_retriever")


def data_set_sizes(dataset: Any) -> dict[str, int]:
    """Rows per data set of a stage (a ``DatasetDict`` or one ``Dataset``)."""
    if hasattr(dataset, "keys") and hasattr(dataset, "values"):
        return {str(name): len(data) for name, data in dataset.items()}
    return {"train": len(dataset)}


def fit_batch_to_data(
    settings: dict[str, Any], dataset: Any, stage: str, *, distributed: bool = False
) -> dict[str, Any]:
    """``settings`` with ``per_device_train_batch_size`` no larger than the largest data set (one warning when
    capped); :class:`InputError` when the stage has no row at all.

    A capped batch also keeps its last partial batch (one process): the sampler that keeps a text out of a batch
    twice fills a batch of a small data set with repeated texts only partly, and dropping partial batches would
    leave none. Under torchrun every rank needs full batches of one size: there the partial batch is dropped.
    """
    sizes = data_set_sizes(dataset)
    largest = max(sizes.values(), default=0)
    if largest == 0:
        raise InputError(f"stage {stage}: its data has no rows; nothing to train")
    batch = int(settings.get("per_device_train_batch_size", 8))
    if batch <= largest:
        return settings
    logger.warning(
        "stage %s: batch of %d is larger than its data (%d rows at most per data set); training with batches of %d",
        stage,
        batch,
        largest,
        largest,
    )
    capped = {**settings, "per_device_train_batch_size": largest}
    if not distributed:
        capped["dataloader_drop_last"] = False
    return capped
