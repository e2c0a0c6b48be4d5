"""``care-retriever train``: run a training recipe (Stage 0 / I / II) into ``--out``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def train(
    recipe: Annotated[str, typer.Option(help="Recipe YAML file, or a bundled name (quickstart, miniature, paper).")],
    out: Annotated[Path, typer.Option(help="Run folder: final model in OUT/final, checkpoints and logs beside it.")],
    data_dir: Annotated[
        Path | None,
        typer.Option(
            help="Folder the recipe's data paths are relative to (default: $CARE_SHARED_DATA, ../shared/data)."
        ),
    ] = None,
    resume: Annotated[bool, typer.Option(help="Continue a run of the same recipe in OUT.")] = False,
    dry_run_steps: Annotated[
        int | None, typer.Option(help="Validate the recipe: N training steps per stage on a sample of the data.")
    ] = None,
    preset: Annotated[
        str | None,
        typer.Option(
            help="Use a from-scratch preset (tiny|mini|base) instead of the recipe's model (dry-run paper.yaml on CPU)."
        ),
    ] = None,
    device: Annotated[
        str | None, typer.Option(help="cpu | cuda (default: auto; torchrun/accelerate set it per process).")
    ] = None,
    progress: Annotated[bool, typer.Option(help="Show progress bars.")] = True,
) -> None:
    """Train a CARE model from a recipe; the final model is left in OUT/final."""
    from care_retriever.cli.core import quiet_transformers
    from care_retriever.training import require

    require("datasets", "accelerate", "peft", extra="train")
    from care_retriever.training.recipe import load_recipe
    from care_retriever.training.runner import run_recipe

    quiet_transformers()
    spec = load_recipe(recipe)
    result = run_recipe(
        spec,
        out,
        data_dir,
        dry_run_steps=dry_run_steps,
        resume=resume,
        preset=preset,
        device=device,
        show_progress=progress,
    )
    for report in result.reports:
        first, last = report.get("first_loss"), report.get("last_loss")
        losses = f"loss {first:.4f} -> {last:.4f}" if first is not None and last is not None else "no loss logged"
        typer.echo(f"{report['name']:>20}: {report['steps']} steps, {report['seconds']:.1f}s, {losses}")
    for name, path in result.exports.items():
        typer.echo(f"exported {name}: {path}")
    typer.echo(f"final model: {result.final}")


def register(app: typer.Typer) -> None:
    app.command()(train)
