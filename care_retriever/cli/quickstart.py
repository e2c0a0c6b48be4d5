"""``care-retriever quickstart``: train a miniature CARE offline on the shipped sample, index, search, score."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def quickstart(
    out: Annotated[Path, typer.Option(help="Folder for the model (OUT/model), index (OUT/index) and run.")] = Path(
        "care-quickstart"
    ),
    force: Annotated[bool, typer.Option(help="Replace OUT if it exists.")] = False,
    recipe: Annotated[str, typer.Option(help="Recipe to train (default: the bundled quickstart).")] = "quickstart",
    progress: Annotated[bool, typer.Option(help="Show progress bars.")] = True,
) -> None:
    """Build a miniature CARE from scratch on the shipped sample (offline; the README gives its measured time)."""
    from care_retriever.model.towers.loading import quiet_transformers
    from care_retriever.training import require

    require("datasets", "accelerate", "peft", "bm25s", "jieba", "pytrec_eval", extra="train,eval")
    from care_retriever.training.quickstart import run_quickstart

    quiet_transformers()
    typer.echo("care-retriever quickstart: sample data written for the project, not medical advice (仅供演示).")
    run_quickstart(out, force=force, recipe=recipe, echo=typer.echo, show_progress=progress)


def register(app: typer.Typer) -> None:
    app.command()(quickstart)
