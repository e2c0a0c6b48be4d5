"""``care-retriever train``: run a training recipe (Stage 0 / I / II) into ``--out``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from care_retriever.cli.options import TrustRemoteCode
from care_retriever.cli.panels import COMMON


def train(
    recipe: Annotated[
        str,
        typer.Option(
            help="Recipe YAML file, or a bundled name (quickstart, miniature, miniature-ablations, "
            "miniature-foundation, paper).",
            rich_help_panel=COMMON,
        ),
    ],
    out: Annotated[
        Path,
        typer.Option(
            help="Run folder: final model in OUT/final, checkpoints and logs beside it.", rich_help_panel=COMMON
        ),
    ],
    data_dir: Annotated[
        Path | None,
        typer.Option(
            help="Folder the recipe's data paths are relative to (default: $CARE_SHARED_DATA, ../shared/data).",
            rich_help_panel=COMMON,
        ),
    ] = None,
    resume: Annotated[
        bool, typer.Option(help="Continue a run of the same recipe in OUT.", rich_help_panel=COMMON)
    ] = False,
    dry_run_steps: Annotated[
        int | None, typer.Option(help="Validate the recipe: N training steps per stage on a sample of the data.")
    ] = None,
    preset: Annotated[
        str | None,
        typer.Option(
            help="Replace the recipe's towers by random ones of a preset's shapes (tiny|mini|base): checks data "
            "and stages without downloading; not the recipe's towers.",
            rich_help_panel=COMMON,
        ),
    ] = None,
    device: Annotated[
        str | None,
        typer.Option(
            help="cpu | cuda (default: auto; torchrun/accelerate set it per process).", rich_help_panel=COMMON
        ),
    ] = None,
    progress: Annotated[bool, typer.Option(help="Show progress bars.")] = True,
    seeds: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Train N runs with seeds S..S+N-1 (S: the recipe's seed) into OUT/seed-<k> (for mean +- sd).",
        ),
    ] = None,
    stage: Annotated[
        list[str] | None,
        typer.Option(
            help="Train only this stage and the stages it starts from (repeatable); --resume trains the rest later.",
        ),
    ] = None,
    keep_stages: Annotated[
        bool,
        typer.Option(
            help="Keep every stage's model in OUT/stages (default: only what --resume and the final model need)."
        ),
    ] = False,
    trust_remote_code: TrustRemoteCode = False,
) -> None:
    """Train a CARE model from a recipe; the final model is left in OUT/final."""
    from care_retriever.model.loading import quiet_transformers
    from care_retriever.training import require

    require("datasets", "accelerate", "peft", extra="train")
    from care_retriever.training.engine import is_main_process
    from care_retriever.training.recipe import load_recipe
    from care_retriever.training.runner import run_recipe

    quiet_transformers()
    spec = load_recipe(recipe)
    if trust_remote_code:  # the same switch as the recipe's model.trust_remote_code
        spec = spec.trusting_remote_code()
    runs = (
        [(spec, out)]
        if seeds is None
        else [(spec.with_seed(spec.seed + k), out / f"seed-{spec.seed + k}") for k in range(seeds)]
    )
    speaks = is_main_process()  # under torchrun every rank runs this; rank 0 reports (it wrote the run)
    for seeded, folder in runs:
        if seeds is not None and speaks:
            typer.echo(f"seed {seeded.seed} -> {folder}")
        result = run_recipe(
            seeded,
            folder,
            data_dir,
            dry_run_steps=dry_run_steps,
            resume=resume,
            preset=preset,
            device=device,
            show_progress=progress,
            stages=stage,
            keep_stages=keep_stages,
        )
        if speaks:
            print_reports(result)


def print_reports(result) -> None:
    from care_retriever.training.pretraining import compute_ratio

    for report in result.reports:
        first, last = report.get("first_loss"), report.get("last_loss")
        losses = f"loss {first:.4f} -> {last:.4f}" if first is not None and last is not None else "no loss logged"
        typer.echo(f"{report['name']:>20}: {report['steps']} steps, {report['seconds']:.1f}s, {losses}")
        if "compute" in report:
            typer.echo(
                f"{'':>20}  {report['tower']} tower pretraining: {report['tower_parameters'] / 1e6:.2f}M parameters "
                f"x {report['tokens'] / 1e6:.2f}M tokens = {report['compute']:.3e}"
            )
    ratio = compute_ratio(result.reports)
    if ratio is not None:
        typer.echo(f"pretraining compute, document / query tower: {ratio:.1f}x")
    for name, path in result.exports.items():
        typer.echo(f"exported {name}: {path}")
    if result.final is None:
        typer.echo("final model: not yet (its stage was not selected; train it with --resume)")
    else:
        typer.echo(f"final model: {result.final}")


def register(app: typer.Typer) -> None:
    app.command()(train)
