"""Trainer output a person reads: one progress bar per stage, no raw ``{'loss': ...}`` dicts.

Hugging Face's Trainer prints every log dict (``ProgressCallback`` under its bar, ``PrinterCallback``
without one): about 320 lines for the quickstart. The losses are kept where they belong, in each
stage's ``logs/STAGE.jsonl`` (``JsonlLogCallback``) and its report.
"""

from __future__ import annotations

from typing import Any

from transformers.trainer_callback import PrinterCallback, ProgressCallback  # the trainer needs transformers anyway


class BarOnlyProgressCallback(ProgressCallback):
    """The training bar without the log lines written under it."""

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        return None


def quiet_trainer(trainer: Any) -> Any:
    """Swap the Trainer's printing callbacks for the bar alone (none when its bar is disabled)."""
    had_bar = any(isinstance(cb, ProgressCallback) for cb in trainer.callback_handler.callbacks)
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    if had_bar:
        trainer.add_callback(BarOnlyProgressCallback)
    return trainer
