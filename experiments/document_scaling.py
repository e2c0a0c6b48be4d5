"""Why large-symmetric does not beat small-symmetric: the document tower's score against its pretraining tokens.

    python -m experiments.document_scaling --out runs/document-scaling [--points 6:0.25 2:0.25 1:0.25 ...]

Writes benchmarks/results/document_scaling.md, .json and .png. Each point ``LAYERS:EPOCHS`` pretrains a decoder
document tower with the miniature foundation's causal-LM stage (``miniature-foundation.yaml``'s
``clm-document``: its data, tokenizer, batch, learning rate and seed; the stage is read from the recipe,
not copied) at that depth (the ``mini`` decoder's width, vocabulary and tied embedding table, fewer
layers) for that many epochs, then gives it ``miniature-ablations.yaml``'s Stage 0 and scores it on both
sides, exactly as the document rows of ``foundation_scaling.py`` (whose functions this reuses). The curve
also trains both towers from random weights through the same Stage 0 (zero tokens; the small tower as a
reference line) and takes the miniature foundation itself (6 layers, 2.5 epochs: 87 minutes) from the
published files instead of pretraining it again: its figures from
``benchmarks/results/foundation_scaling.json``, its scores from seed 0's ``large-symmetric`` in
``benchmarks/results/miniature.json`` (the same tower through today's Stage 0).

The measure is the miniature report's: Avg = mean of kuake-qtr retrieval nDCG@10 and rerank MAP@10; the
target (the miniature's training target for large-symmetric) is seed 0's small-symmetric + 0.03. A
log-linear fit of Avg on compute (parameters x tokens) over the pretrained points says how far that target
is, in compute and in hours of this machine at the points' own measured speed: an extrapolation, stated as one.

Every point is its own resumable run under ``--out`` (an interrupted curve continues where it stopped) and
its scores are kept there, so a re-render costs seconds. The fit and the report (table, statements, plot) are
``experiments/document_scaling_report.py``; this module measures the points.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import yaml

from experiments import foundation_scaling as fs  # one definition of Stage 0 and scoring
from experiments.document_scaling_report import LARGE_BERT_LABEL, SMALL_BERT, SMALL_SYMMETRIC, draw, render
from experiments.document_scaling_report import log_fit as log_fit  # re-exported: the curve's tests read them here
from experiments.document_scaling_report import size_statements as size_statements

REPO = Path(__file__).resolve().parents[1]
CLM_STAGE = "clm-document"
FOUNDATION_JSON = REPO / "benchmarks" / "results" / "foundation_scaling.json"
MINIATURE_JSON = REPO / "benchmarks" / "results" / "miniature.json"
# The `mini` decoder's depth, width and feed-forward size on a BERT (6 heads of 64, like the decoder's queries).
LARGE_BERT = {"num_hidden_layers": 6, "hidden_size": 384, "num_attention_heads": 6, "intermediate_size": 1024}
DEFAULT_POINTS = ("6:0.25", "2:0.25", "1:0.25", "6:0.75", "2:1.0")


def parse_point(text: str) -> tuple[int, float]:
    try:
        layers, epochs = text.split(":")
        point = int(layers), float(epochs)
    except ValueError:
        raise argparse.ArgumentTypeError(f"point {text!r}: expected LAYERS:EPOCHS, e.g. 2:0.5") from None
    if point[0] < 1 or point[1] <= 0:
        raise argparse.ArgumentTypeError(f"point {text!r}: layers >= 1 and epochs > 0")
    return point


def point_name(layers: int, epochs: float) -> str:
    return f"layers{layers}-epochs{epochs:g}"


def foundation_recipe() -> tuple[dict, dict]:
    """miniature-foundation.yaml as data, and its causal-LM stage (an item of the recipe's ``stages``)."""
    recipe = yaml.safe_load((fs.RECIPES / "miniature-foundation.yaml").read_text("utf-8"))
    (stage,) = [s for s in recipe["stages"] if s["name"] == CLM_STAGE]
    return recipe, stage


def pretraining_recipe(layers: int, epochs: float) -> dict:
    """miniature-foundation.yaml cut to its causal-LM stage, with ``layers`` decoder layers and ``epochs`` epochs."""
    recipe, stage = foundation_recipe()
    stage["args"] = {**stage.get("args", {}), "num_train_epochs": epochs}
    recipe["stages"] = [stage]
    recipe["final"] = CLM_STAGE
    recipe["name"] = f"document-scaling-{point_name(layers, epochs)}"
    recipe["model"] = {**recipe["model"], "document_config": {"num_hidden_layers": layers}}
    return recipe


def pretrain(layers: int, epochs: float, out: Path) -> Path:
    """The point's pretrained towers (a finished run folder, resumed if interrupted)."""
    if not (out / "final").is_dir():
        fs.run_recipe(pretraining_recipe(layers, epochs), out)
    return out


def stage_report(run: Path, stage: str) -> dict:
    """One stage's report in a finished run's ``run.json`` (examples, steps, seconds, ...)."""
    for report in json.loads((run / "run.json").read_text("utf-8")).get("reports", []):
        if report.get("name") == stage:
            return report
    return {}


def measure_point(layers: int, epochs: float, out: Path, data_dir: Path) -> dict:
    folder = out / point_name(layers, epochs)
    foundation = pretrain(layers, epochs, folder / "pretraining")
    model = fs.train("document", foundation, folder / "stage0")
    report = fs.pretraining(foundation)["document"]
    return {
        "layers": layers,
        "epochs": epochs,
        "parameters": report["tower_parameters"],
        "tokens": report["tokens"],
        "pretraining_seconds": report.get("seconds"),
        "model": str(model),
        "scores": fs.score(model, data_dir, folder / "stage0" / fs.SCORES_FILE),
        "source": "this curve",
    }


def foundation_point(scaling_json: Path, miniature_json: Path) -> dict | None:
    """The miniature foundation's decoder (6 layers, the recipe's epochs) as a curve point.

    Its pretraining figures are the foundation run's own (``foundation_scaling.json``); its scores are seed 0's
    ``large-symmetric`` in ``miniature.json``: the same tower through the current Stage 0 (the scores in
    ``foundation_scaling.json`` predate the Stage 0 length buckets, so they are not used next to these points).
    """
    if not (scaling_json.is_file() and miniature_json.is_file()):
        return None
    pretrained = next(
        r for r in json.loads(scaling_json.read_text("utf-8"))["rows"] if r["tower"] == "document" and r["tokens"]
    )
    scores = seed0_scores(miniature_json, "large-symmetric")
    _, stage = foundation_recipe()
    return {
        "layers": 6,
        "epochs": stage["args"]["num_train_epochs"],
        "parameters": pretrained["parameters"],
        "tokens": pretrained["tokens"],
        "pretraining_seconds": None,
        "model": "runs/ablations-v3/seed-0/models/large-symmetric",
        "scores": scores,
        "source": "the miniature foundation (miniature.json, seed 0, large-symmetric)",
    }


def seed0_scores(miniature_json: Path, model: str) -> dict[str, float]:
    seeds = json.loads(miniature_json.read_text("utf-8"))["seeds"]
    found = next(s for s in seeds if s["seed"] == 0)["models"][model]
    return {task: found[task]["main_score"] for task in fs.TASKS}


def random_row(
    tower: str, out: Path, data_dir: Path, render_only: bool, architecture: dict | None = None, name: str = ""
) -> dict | None:
    """A tower from random weights through the same Stage 0 (the curve's zero-token point, and references)."""
    folder = out / f"{tower}-random{name}"
    if render_only and not (folder / fs.SCORES_FILE).is_file():
        return None
    model = fs.train(tower, None, folder, architecture)
    return {
        "layers": 6 if tower == "document" else None,
        "epochs": 0,
        "parameters": tower_parameters(model),
        "tokens": 0,
        "pretraining_seconds": None,
        "model": str(model),
        "scores": fs.score(model, data_dir, folder / fs.SCORES_FILE),
        "source": "random weights (this script)",
    }


def stage0_data_rows(
    out: Path,
    data_dir: Path,
    examples: int,
    point: tuple[int, float],
    small: dict | None,
    decoder: dict | None,
    render_only: bool,
) -> list[dict]:
    """The small random BERT and the ``point`` decoder through Stage 0 on ``examples`` examples instead of the
    recipe's: does the larger tower gain more from more fine-tuning data? ``small`` / ``decoder``: the same
    towers' rows at the recipe's size (a tower without one is skipped)."""
    layers, epochs = point
    towers = {
        SMALL_BERT: (small, "query", None, out / f"query-random-examples{examples}"),
        f"decoder, {layers} layers, {epochs:g} epochs": (
            decoder,
            "document",
            out / point_name(layers, epochs) / "pretraining",
            out / point_name(layers, epochs) / f"stage0-examples{examples}",
        ),
    }
    rows = []
    for label, (baseline, tower, foundation, folder) in towers.items():
        if baseline is None or (render_only and not (folder / fs.SCORES_FILE).is_file()):
            continue
        model = fs.train(tower, foundation, folder, max_examples=examples)
        scores = fs.score(model, data_dir, folder / fs.SCORES_FILE)
        trained = stage_report(folder, fs.TOWERS[tower][0]).get("examples", examples)  # all there are, if fewer
        rows.append({"label": label, "examples": trained, "scores": scores, "baseline": baseline["scores"]})
    return rows


def tower_parameters(model_dir: Path) -> int:
    """Parameters of a symmetric export's tower (its query route: the same tower as its document route)."""
    from care_retriever.model.embedder import AsymmetricEmbedder
    from care_retriever.training.lora import transformer_of

    embedder = AsymmetricEmbedder.from_pretrained(str(model_dir), load="query")
    return sum(p.numel() for p in transformer_of(embedder.query_modules).auto_model.parameters())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="Folder for the points' runs.")
    parser.add_argument("--points", nargs="+", type=parse_point, default=[parse_point(p) for p in DEFAULT_POINTS])
    parser.add_argument(
        "--data-dir", type=Path, default=Path(os.environ.get("CARE_SHARED_DATA", REPO.parent / "shared" / "data"))
    )
    parser.add_argument("--doc", type=Path, default=REPO / "benchmarks" / "results" / "document_scaling.md")
    parser.add_argument(
        "--render-only", action="store_true", help="Render the points already measured under --out; train nothing."
    )
    parser.add_argument(
        "--stage0-examples",
        type=int,
        default=None,
        help="Also train the small random BERT and the --stage0-point decoder through Stage 0 on this many examples.",
    )
    parser.add_argument("--stage0-point", type=parse_point, default=parse_point("6:0.75"))
    args = parser.parse_args(argv)
    references: dict[str, dict] = {}
    data_rows: list[dict] = []
    rows: list[dict] = []
    if MINIATURE_JSON.is_file():
        references[SMALL_SYMMETRIC] = {"scores": seed0_scores(MINIATURE_JSON, "small-symmetric")}
    foundation = foundation_point(FOUNDATION_JSON, MINIATURE_JSON)
    if foundation is not None:
        rows.append(foundation)

    def write() -> None:
        # After every point: an interrupted curve still leaves its measured points in docs/.
        plot = args.doc.with_suffix(".png")
        draw(rows, references, plot)
        args.doc.write_text(render(rows, references, plot.name, data_rows), "utf-8")
        saved = {"rows": rows, "references": references, "stage0_data": data_rows}
        args.doc.with_suffix(".json").write_text(json.dumps(saved, indent=2), "utf-8")
        print(f"wrote {args.doc}", flush=True)

    for tower in ("query", "document"):
        row = random_row(tower, args.out, args.data_dir, args.render_only)
        if row is not None and tower == "document":
            rows.append(row)
        elif row is not None:
            references[SMALL_BERT] = row
    # Is it the decoder, or size? A BERT query tower with the decoder's depth and width, from random weights.
    wide = random_row("query", args.out, args.data_dir, args.render_only, LARGE_BERT, name="-large-bert")
    if wide is not None:
        references[f"{LARGE_BERT_LABEL} ({wide['parameters'] / 1e6:.1f}M), random weights"] = wide
    for layers, epochs in args.points:
        scores = args.out / point_name(layers, epochs) / "stage0" / fs.SCORES_FILE
        if args.render_only and not scores.is_file():
            continue
        rows.append(measure_point(layers, epochs, args.out, args.data_dir))
        write()
    if args.stage0_examples:
        decoder = next((r for r in rows if (r["layers"], r["epochs"]) == args.stage0_point), None)
        small = references.get(SMALL_BERT)
        data_rows.extend(
            stage0_data_rows(
                args.out, args.data_dir, args.stage0_examples, args.stage0_point, small, decoder, args.render_only
            )
        )
    write()


if __name__ == "__main__":
    main()
