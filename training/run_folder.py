"""The output folder of a training run and the state it records in ``run.json``.

Layout of ``OUT``::

    run.json              recipe name, fingerprint, finished stages, per-stage reports
    stages/<name>/        the model after a stage (LoRA merged; ``init`` is the starting model), each
                          tower in its own dtype (bf16 for a bf16 tower); kept while a stage still to
                          train starts from it (resume), every one with ``keep_stages``
    models/<export>/      models a stage exports (ablation baselines, symmetric variants)
    checkpoints/<name>/   trainer checkpoints of the unfinished stage (resume): its trained parameters
    logs/<name>.jsonl     loss / lr / epoch per logging step
    teacher_cache/        Stage I's memory-mapped teacher embeddings
    final/                the recipe's final model (``from_pretrained``, ``index``, ``search``, ``eval``)

Nothing is overwritten by accident: a non-empty ``OUT`` is only re-entered with ``resume=True``
and only by the same recipe (same fingerprint); finished stages are then loaded, not re-run, and
an unfinished stage continues from its last checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from care_retriever.errors import InputError
from care_retriever.training.recipe_spec import Recipe

RUN_FILE = "run.json"


@dataclass
class RunResult:
    out: Path
    final: Path | None  # None while the final stage is not trained (a run of selected ``stages``)
    reports: list[dict[str, Any]] = field(default_factory=list)
    exports: dict[str, str] = field(default_factory=dict)


def _read_run(out: Path) -> dict[str, Any] | None:
    path = out / RUN_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text("utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: corrupted run file; use a new --out") from exc


def _write_run(out: Path, state: dict[str, Any]) -> None:
    tmp = out / f".{RUN_FILE}.tmp"
    tmp.write_text(json.dumps(state, ensure_ascii=False, indent=2), encoding="utf-8")
    os.replace(tmp, out / RUN_FILE)


def check_output(out: Path, recipe: Recipe, fingerprint: str, resume: bool) -> dict[str, Any] | None:
    """Refuse to touch a folder that holds something else; return the previous run state when resuming."""
    if not out.exists():
        return None
    if not out.is_dir():
        raise InputError(f"--out {out}: exists and is not a folder")
    if not any(out.iterdir()):
        return None
    state = _read_run(out)
    if state is None:
        raise InputError(f"--out {out}: exists, is not empty and holds no training run; nothing overwritten")
    if state.get("fingerprint") != fingerprint:
        raise InputError(
            f"--out {out}: holds a run of recipe {state.get('recipe')!r} with other settings "
            f"(fingerprint {state.get('fingerprint')} != {fingerprint}); use a new --out"
        )
    if not resume:
        raise InputError(f"--out {out}: already holds this recipe's run; pass --resume to continue it")
    return state


@dataclass
class RunState:
    """What ``run.json`` records: the recipe's identity, the finished stages, their reports and exports."""

    recipe: str
    source: str
    fingerprint: str
    done: list[str] = field(default_factory=list)
    reports: list[dict[str, Any]] = field(default_factory=list)
    exports: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # init_seconds, final, foundation, ...

    @classmethod
    def resumed(cls, recipe: Recipe, fingerprint: str, previous: dict[str, Any] | None) -> RunState:
        state = cls(recipe=recipe.name, source=recipe.source_path, fingerprint=fingerprint)
        if previous:
            state.done = list(previous.get("done", []))
            state.reports = list(previous.get("reports", []))
            state.exports = dict(previous.get("exports", {}))
            known = {"recipe", "source", "fingerprint", "done", "reports", "exports"}
            state.extra = {k: v for k, v in previous.items() if k not in known}
        return state

    def save(self, out: Path) -> None:
        _write_run(
            out,
            {
                "recipe": self.recipe,
                "source": self.source,
                "fingerprint": self.fingerprint,
                "done": self.done,
                "reports": self.reports,
                "exports": self.exports,
                **self.extra,
            },
        )


def foundation_dir(path: str | Path) -> Path:
    """The model folder of a foundation: a finished run's ``final``, or a saved CARE model folder."""
    folder = Path(path)
    if (folder / "care_config.json").is_file():
        return folder
    if (folder / "final" / "care_config.json").is_file():
        return folder / "final"
    hint = (
        "the run is not finished; continue it with --resume"
        if (folder / RUN_FILE).is_file()
        else "train it with `care-retriever train --recipe miniature-foundation --out DIR`"
    )
    raise InputError(f"model.foundation {folder}: no finished foundation model there ({hint})")


def foundation_fingerprint(path: str | Path) -> str:
    """What identifies a foundation: its run's fingerprint, else its saved space fingerprint."""
    model = foundation_dir(path)
    run = model.parent / RUN_FILE
    if model.name == "final" and run.is_file():
        return str(json.loads(run.read_text("utf-8")).get("fingerprint"))
    config = json.loads((model / "care_config.json").read_text("utf-8"))
    return str(config.get("space_fingerprint"))


def stage_sources(recipe: Recipe) -> dict[str, str]:
    """Each stage's starting point: its ``from`` stage, else the previous stage (``init`` for the first)."""
    sources: dict[str, str] = {}
    previous = "init"
    for stage in recipe.stages:
        sources[stage.name] = stage.source or previous
        previous = stage.name
    return sources


def needed_stages(recipe: Recipe, state: RunState) -> set[str]:
    """Saved stages a later step reads: the source of every stage not yet trained, and the final stage
    until ``final`` is published."""
    sources = stage_sources(recipe)
    needed = {sources[name] for name in sources if name not in state.done}
    if "final" not in state.extra and recipe.final_stage in state.done:
        needed.add(recipe.final_stage)
    return needed


def prune(recipe: Recipe, out: Path, state: RunState) -> None:
    """Delete what neither ``--resume`` nor the final model needs: saved stages no unfinished stage
    starts from, and the checkpoints of finished stages (rank 0; the others hold the model in memory)."""
    from care_retriever.training.engine import is_main_process

    if not is_main_process():
        return
    needed = needed_stages(recipe, state)
    for name in ["init", *stage_sources(recipe)]:
        if name in state.done and name not in needed:
            shutil.rmtree(out / "stages" / name, ignore_errors=True)
        if name in state.done:
            shutil.rmtree(out / "checkpoints" / name, ignore_errors=True)


def publish_final(recipe: Recipe, out: Path, state: RunState) -> Path | None:
    """Copy the final stage to ``out/final`` through a temporary folder (never half-written); None
    while the final stage is not trained."""
    from care_retriever.training.engine import is_main_process

    if recipe.final_stage not in state.done:
        return None
    final = out / "final"
    if not is_main_process():
        return final
    source = out / "stages" / recipe.final_stage
    if "final" in state.extra and final.is_dir() and not source.is_dir():
        return final  # published by an earlier run, its stage folder since deleted
    tmp = out / ".final.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(source, tmp, copy_function=_link_or_copy)  # hard links: no second copy on disk
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    state.extra["final"] = str(final)
    state.save(out)
    return final


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # a file system without hard links
        shutil.copy2(src, dst)
