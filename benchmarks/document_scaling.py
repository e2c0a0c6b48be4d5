"""The document tower's retrieval score against its pretraining tokens and size (issue 14, item 4).

    python benchmarks/document_scaling.py --out runs/document-scaling [--points 6:0.25 2:0.25 1:0.25 ...]

Writes docs/document_scaling.md, .json and .png. Each point ``LAYERS:EPOCHS`` pretrains a decoder
document tower with the miniature foundation's causal-LM stage (``miniature-foundation.yaml``'s
``clm-document``: its data, tokenizer, batch, learning rate and seed; the stage is read from the recipe,
not copied) at that depth (the ``mini`` decoder's width, vocabulary and tied embedding table, fewer
layers) for that many epochs, then gives it ``miniature-ablations.yaml``'s Stage 0 and scores it on both
sides, exactly as the document rows of ``foundation_scaling.py`` (whose functions this reuses). Those
rows (random weights; the foundation itself, 6 layers x 2.5 epochs) are read from
``docs/foundation_scaling.json`` as anchors, so a curve costs only its new points.

The measure is issue 14's: Avg = mean of kuake-qtr retrieval nDCG@10 and rerank MAP@10. The target line
is the random-weight small (query) tower's Avg from the same file + 0.03. A log-linear fit of Avg on
compute (parameters x tokens) over the pretrained points says how far that target is, in compute and in
hours of this machine at the points' own measured speed: an extrapolation, stated as one.

Every point is its own resumable run under ``--out`` (an interrupted curve continues where it stopped) and
its scores are kept there, so a re-render costs seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from datetime import date
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import foundation_scaling as fs  # the sibling script: one definition of Stage 0 and scoring

REPO = Path(__file__).resolve().parents[1]
CLM_STAGE = "clm-document"
ANCHORS = REPO / "docs" / "foundation_scaling.json"
TARGET_MARGIN = 0.03  # issue 14: large-symmetric >= small-symmetric + 0.03 on Avg
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


def pretraining_recipe(layers: int, epochs: float) -> dict:
    """miniature-foundation.yaml cut to its causal-LM stage, with ``layers`` decoder layers and ``epochs`` epochs."""
    recipe = yaml.safe_load((fs.RECIPES / "miniature-foundation.yaml").read_text("utf-8"))
    (stage,) = [s for s in recipe["stages"] if s["name"] == CLM_STAGE]
    stage["args"] = {**stage.get("args", {}), "num_train_epochs": epochs}
    recipe["stages"] = [stage]
    recipe["final"] = CLM_STAGE
    recipe["name"] = f"document-scaling-{point_name(layers, epochs)}"
    recipe["model"] = {**recipe["model"], "document_config": {"num_hidden_layers": layers}}
    return recipe


def pretrain(layers: int, epochs: float, out: Path) -> Path:
    """The point's pretrained towers (a finished run folder, resumed if interrupted)."""
    if (out / "final").is_dir():
        return out
    out.mkdir(parents=True, exist_ok=True)
    recipe_file = out.with_name(out.name + ".yaml")
    recipe_file.write_text(yaml.safe_dump(pretraining_recipe(layers, epochs), allow_unicode=True), "utf-8")
    command = [sys.executable, "-m", "care_retriever.cli.main", "train", "--recipe", str(recipe_file)]
    command += ["--out", str(out)]
    if (out / "run.json").is_file():
        command.append("--resume")
    subprocess.run(command, check=True)
    return out


def stage_seconds(run: Path, stage: str) -> float | None:
    """Wall seconds of one stage of a finished run (its ``run.json``)."""
    for report in json.loads((run / "run.json").read_text("utf-8")).get("reports", []):
        if report.get("name") == stage:
            return report.get("seconds")
    return None


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
        "pretraining_seconds": stage_seconds(foundation, CLM_STAGE),
        "model": str(model),
        "scores": fs.score(model, data_dir, folder / "stage0" / fs.SCORES_FILE),
        "source": "this curve",
    }


def anchor_rows(path: Path) -> tuple[list[dict], dict | None]:
    """The document rows of docs/foundation_scaling.json as curve points, and its random query-tower row."""
    if not path.is_file():
        return [], None
    rows = json.loads(path.read_text("utf-8"))["rows"]
    document = [
        {
            "layers": 6,
            "epochs": None,
            "parameters": row["parameters"],
            "tokens": row.get("tokens", 0),
            "pretraining_seconds": None,
            "model": row["model"],
            "scores": row["scores"],
            "source": f"{path.name} ({'random weights' if row['start'] == 'random' else 'the miniature foundation'})",
        }
        for row in rows
        if row["tower"] == "document"
    ]
    small = next((r for r in rows if r["tower"] == "query" and r["start"] == "random"), None)
    return document, small


def avg(row: dict) -> float:
    return (row["scores"][fs.TASKS[0]] + row["scores"][fs.TASKS[1]]) / 2


def compute(row: dict) -> float:
    return float(row["parameters"]) * float(row["tokens"])


def log_fit(rows: list[dict]) -> tuple[float, float] | None:
    """Least-squares ``Avg = a + b * log10(compute)`` over the pretrained rows; None under 3 rows."""
    points = [(math.log10(compute(r)), avg(r)) for r in rows if r["tokens"] > 0]
    if len(points) < 3:
        return None
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    if sxx == 0:
        return None
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sxx
    return mean_y - slope * mean_x, slope


def seconds_per_compute(rows: list[dict]) -> float | None:
    """This machine's measured pretraining seconds per unit of compute (median over the timed points)."""
    rates = sorted(r["pretraining_seconds"] / compute(r) for r in rows if r.get("pretraining_seconds") and r["tokens"])
    return rates[len(rates) // 2] if rates else None


def render(rows: list[dict], small: dict | None, plot: str | None) -> str:
    rows = sorted(rows, key=lambda r: (compute(r), r["layers"]))
    lines = [
        "# The document tower against its pretraining tokens and size",
        "",
        f"Generated by `benchmarks/document_scaling.py` on {date.today()} (issue 14, item 4: why large-symmetric "
        "does not beat small-symmetric). Each point pretrains the miniature's decoder document tower with the "
        "foundation's causal-LM stage (`miniature-foundation.yaml`, `clm-document`: same data, tokenizer, batch, "
        "learning rate, seed) at the given depth (the `mini` decoder's 384 width and 8k-token tied embeddings, "
        "fewer layers) and epochs (one epoch = one pass over the 83,788 pretraining and the training texts), then "
        "trains it with `miniature-ablations.yaml`'s Stage 0 and scores it on both sides on the kuake-qtr dev halves "
        "(Avg = mean of retrieval nDCG@10 and rerank MAP@10, issue 14's measure). One seed (0) a point: Stage 0's "
        "seed-to-seed spread of this tower's Avg is ~0.007 (docs/miniature.md, large-symmetric).",
        "",
        "| layers | parameters | epochs | pretraining tokens | compute | pretraining min | kuake-qtr-retrieval "
        "| kuake-qtr-rerank | Avg | source |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        minutes = row.get("pretraining_seconds")
        epochs = "" if row["epochs"] is None else f"{row['epochs']:g}"
        lines.append(
            f"| {row['layers']} | {row['parameters'] / 1e6:.2f}M | {epochs} | {row['tokens'] / 1e6:.2f}M | "
            f"{compute(row):.2e} | {'' if not minutes else f'{minutes / 60:.1f}'} | "
            f"{row['scores'][fs.TASKS[0]]:.4f} | {row['scores'][fs.TASKS[1]]:.4f} | {avg(row):.4f} | {row['source']} |"
        )
    if plot:
        lines += ["", f"![Avg against pretraining compute]({plot})"]
    lines += ["", "## What the curve says", ""]
    if small is not None:
        target = avg(small) + TARGET_MARGIN
        lines.append(
            f"- Target (issue 14): the document tower's Avg >= the random-weight small tower's {avg(small):.4f} "
            f"+ {TARGET_MARGIN} = {target:.4f} (`foundation_scaling.json`, same Stage 0, seed 0)."
        )
        best = max(rows, key=avg)
        lines.append(
            f"- Best point: {best['layers']} layers, {best['tokens'] / 1e6:.2f}M tokens, Avg {avg(best):.4f} "
            f"({avg(best) - target:+.4f} from the target)."
        )
        fit = log_fit(rows)
        if fit is not None:
            a, b = fit
            n = sum(1 for r in rows if r["tokens"] > 0)
            lines.append(
                f"- Log-linear fit over the {n} pretrained points: Avg = {a:.4f} + {b:.4f} x log10(compute), "
                f"i.e. {b:+.4f} Avg per 10x compute."
            )
            if b > 0:
                needed = 10 ** ((target - a) / b)
                rate = seconds_per_compute(rows)
                hours = f", ~{needed * rate / 3600:,.0f} hours of pretraining on this machine" if rate else ""
                largest = max(compute(r) for r in rows)
                lines.append(
                    f"- Extrapolated (not measured): the target needs ~{needed:.1e} compute, {needed / largest:,.0f}x "
                    f"the largest point{hours} (measured speed of the timed points), against the foundation "
                    "recipe's budget of 3 hours."
                )
            else:
                lines.append("- The fitted slope is not positive: more compute does not raise Avg on this curve.")
    return "\n".join(lines) + "\n"


def draw(rows: list[dict], small: dict | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for layers in sorted({r["layers"] for r in rows}):
        own = sorted((r for r in rows if r["layers"] == layers and r["tokens"] > 0), key=compute)
        if own:
            ax.plot([compute(r) for r in own], [avg(r) for r in own], "o-", label=f"{layers} layers, pretrained")
    for row in rows:
        if row["tokens"] == 0:
            ax.axhline(avg(row), color="grey", linestyle=":", label="6 layers, random weights")
    if small is not None:
        ax.axhline(avg(small), color="tab:green", linestyle="--", label="small tower, random weights")
        ax.axhline(avg(small) + TARGET_MARGIN, color="tab:red", linestyle="--", label="target: small + 0.03")
    ax.set_xscale("log")
    ax.set_xlabel("pretraining compute (parameters x tokens)")
    ax.set_ylabel("Avg (kuake-qtr nDCG@10, MAP@10)")
    ax.set_title("Document tower after Stage 0, by pretraining compute")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="Folder for the points' runs.")
    parser.add_argument("--points", nargs="+", type=parse_point, default=[parse_point(p) for p in DEFAULT_POINTS])
    parser.add_argument(
        "--data-dir", type=Path, default=Path(os.environ.get("CARE_SHARED_DATA", REPO.parent / "shared" / "data"))
    )
    parser.add_argument("--anchors", type=Path, default=ANCHORS)
    parser.add_argument("--doc", type=Path, default=REPO / "docs" / "document_scaling.md")
    parser.add_argument(
        "--render-only", action="store_true", help="Render the points already measured under --out; train nothing."
    )
    args = parser.parse_args(argv)
    anchors, small = anchor_rows(args.anchors)
    rows = list(anchors)
    for layers, epochs in args.points:
        scores = args.out / point_name(layers, epochs) / "stage0" / fs.SCORES_FILE
        if args.render_only and not scores.is_file():
            continue
        rows.append(measure_point(layers, epochs, args.out, args.data_dir))
        # Written after every point: an interrupted curve still leaves its measured points in docs/.
        plot = args.doc.with_suffix(".png")
        draw(rows, small, plot)
        args.doc.write_text(render(rows, small, plot.name), "utf-8")
        args.doc.with_suffix(".json").write_text(json.dumps({"rows": rows}, indent=2), "utf-8")
        print(f"wrote {args.doc}", flush=True)


if __name__ == "__main__":
    main()
