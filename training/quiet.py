"""Trainer output a person reads: one progress bar per stage, no raw ``{'loss': ...}`` dicts.

Hugging Face's Trainer prints every log dict (``ProgressCallback`` under its bar, ``PrinterCallback``
without one): about 320 lines for the quickstart. The losses are kept where they belong, in each
stage's ``logs/STAGE.jsonl`` (``JsonlLogCallback``) and its report.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from transformers.trainer_callback import PrinterCallback, ProgressCallback  # the trainer needs transformers anyway


class BarOnlyProgressCallback(ProgressCallback):
    """The training bar, named after its stage, without the log lines written under it."""

    def __init__(self, label: str | None = None) -> None:
        super().__init__()
        self.label = label

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        super().on_train_begin(args, state, control, **kwargs)
        if self.training_bar is not None and self.label:
            self.training_bar.set_description(self.label)

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        return None


def quiet_trainer(trainer: Any, label: str | None = None) -> Any:
    """Swap the Trainer's printing callbacks for one bar named ``label`` (none when ``disable_tqdm``).

    ``disable_tqdm`` is the caller's to set: the Trainer's default turns the bar off whenever
    transformers' verbosity is above WARNING, which the CLI sets to keep model loading quiet.
    """
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    if not trainer.args.disable_tqdm:
        trainer.add_callback(BarOnlyProgressCallback(label))
    return trainer


@contextmanager
def quiet_logger(name: str, level: int = logging.WARNING) -> Iterator[None]:
    """Raise logger ``name`` to ``level`` for the block (the quickstart's stage table replaces the INFO lines)."""
    target = logging.getLogger(name)
    before = target.level
    target.setLevel(level)
    try:
        yield
    finally:
        target.setLevel(before)
