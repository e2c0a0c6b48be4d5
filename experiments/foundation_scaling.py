"""What the miniature foundation's pretraining buys each tower: benchmarks/results/foundation_scaling.md.

    python -m experiments.foundation_scaling --foundation runs/miniature-foundation --out runs/scaling \\
        [--trained runs/ablations/seed-0]

Each tower is trained with the Stage 0 of ``miniature-ablations.yaml`` (the same stage, data, sizes and
seed; the stage is read from the recipe, not copied) from two starts: random weights (``--preset mini``,
the tokenizer trained on the foundation's ``vocab_from``) and the foundation's language-model-pretrained
weights. Each model, used on both sides, is scored by the evaluation harness on the kuake-qtr dev halves
(retrieval nDCG@10, rerank MAP@10). ``--trained RUN`` reuses an ablation run's ``small-symmetric`` and
``large-symmetric`` exports for the foundation rows (the same stage and seed; their scores too, when
`training_miniature_report.py` has scored that run), so only the random-weight rows are trained here.
The pretraining figures (parameters, tokens, compute) are the foundation run's own (``run.json``). A row's
scores are kept in its run folder, so a re-render costs seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from datetime import date
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "training" / "recipes"
TASKS = ("kuake-qtr-retrieval", "kuake-qtr-rerank")
# tower -> (Stage 0 of miniature-ablations.yaml, its symmetric export, the foundation stage that pretrains it)
TOWERS = {
    "query": ("stage0-query", "small-symmetric", "mlm-query"),
    "document": ("stage0-document", "large-symmetric", "clm-document"),
}
SCORES_FILE = "scaling_scores.json"


def one_stage_recipe(
    tower: str, foundation: Path | None, architecture: dict | None = None, *, max_examples: int | None = None
) -> dict:
    """miniature-ablations.yaml cut to one tower's Stage 0, from the foundation or (None) random weights;
    ``architecture`` replaces keys of the random tower's preset shape (``model.query_config`` /
    ``document_config``), ``max_examples`` the stage's sample size."""
    recipe = yaml.safe_load((RECIPES / "miniature-ablations.yaml").read_text("utf-8"))
    stage_name = TOWERS[tower][0]
    recipe["stages"] = [s for s in recipe["stages"] if s["name"] == stage_name]
    if max_examples is not None:
        recipe["stages"][0]["max_examples"] = max_examples
    recipe["final"] = stage_name
    recipe["name"] = f"foundation-scaling-{tower}"
    model = dict(recipe["model"])
    model.pop("foundation", None)
    if foundation is None:
        vocab = yaml.safe_load((RECIPES / "miniature-foundation.yaml").read_text("utf-8"))["model"]["vocab_from"]
        model.update(preset="mini", vocab_from=vocab)
        if architecture:
            model[f"{tower}_config"] = dict(architecture)
    else:
        model["foundation"] = str(foundation.resolve())
    recipe["model"] = model
    return recipe


def train(
    tower: str, foundation: Path | None, out: Path, architecture: dict | None = None, *, max_examples: int | None = None
) -> Path:
    """Train the row's model (resumed if interrupted); returns its symmetric export."""
    export = out / "models" / TOWERS[tower][1]
    if export.is_dir():
        return export
    run_recipe(one_stage_recipe(tower, foundation, architecture, max_examples=max_examples), out)
    return export


def run_recipe(recipe: dict, out: Path) -> None:
    """``care-retriever train`` on ``recipe`` (written beside ``out`` as OUT.yaml) into ``out``, resuming an
    interrupted run."""
    out.mkdir(parents=True, exist_ok=True)
    recipe_file = out.with_name(out.name + ".yaml")
    recipe_file.write_text(yaml.safe_dump(recipe, allow_unicode=True), "utf-8")
    command = [
        sys.executable,
        "-m",
        "care_retriever.cli.main",
        "train",
        "--recipe",
        str(recipe_file),
        "--out",
        str(out),
    ]
    if (out / "run.json").is_file():
        command.append("--resume")
    subprocess.run(command, check=True)


def score(model_dir: Path, data_dir: Path, cache: Path) -> dict[str, float]:
    if cache.is_file():
        return json.loads(cache.read_text("utf-8"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from care_retriever.evaluation.runner import evaluate
    from care_retriever.evaluation.tasks import load_task
    from care_retriever.model.baselines import load_embedder

    embedder = load_embedder(str(model_dir))
    scores = {}
    for name in TASKS:
        result = evaluate(embedder, load_task(data_dir / "tasks" / name), model_name=model_dir.name, show_progress=True)
        scores[name] = result.main_score
        print(f"{model_dir}: {name} {result.main_score:.4f}", flush=True)
    cache.write_text(json.dumps(scores, indent=2), "utf-8")
    return scores


def reuse_report_scores(run: Path, model: str, cache: Path) -> None:
    """Seed ``cache`` with the scores `training_miniature_report.py` already computed for ``model`` of ``run``
    (the same harness on the same tasks), so the model is not scored twice."""
    report = run / "miniature_scores.json"
    if cache.is_file() or not report.is_file():
        return
    found = json.loads(report.read_text("utf-8"))["models"].get(model, {})
    if all(task in found for task in TASKS):
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps({task: found[task]["main_score"] for task in TASKS}, indent=2), "utf-8")


def pretraining(foundation: Path) -> dict[str, dict]:
    """tower -> the foundation run's report of the stage that pretrained it (parameters, tokens, compute)."""
    reports = json.loads((foundation / "run.json").read_text("utf-8")).get("reports", [])
    by_stage = {r["name"]: r for r in reports}
    return {tower: by_stage.get(stage, {}) for tower, (_, _, stage) in TOWERS.items()}


def render(rows: list[dict]) -> str:
    lines = [
        "# What the foundation's pretraining buys each tower",
        "",
        f"Generated by `python -m experiments.foundation_scaling` on {date.today()}. Each tower "
        "trained with `miniature-ablations.yaml`'s Stage 0 (its data, sizes and seed) from random weights or from the "
        "miniature foundation, then used on both sides and scored by the evaluation harness on the kuake-qtr "
        "dev halves. Avg = mean of retrieval nDCG@10 and rerank MAP@10 (the miniature report's measure). Pretraining "
        "figures are the foundation run's own (`run.json`).",
        "",
        "| tower | start | parameters | pretraining tokens | compute | kuake-qtr-retrieval | kuake-qtr-rerank | Avg |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        params, tokens = row.get("parameters"), row.get("tokens", 0)
        lines.append(
            f"| {row['tower']} | {row['start']} | {'' if params is None else f'{params / 1e6:.2f}M'} | "
            f"{tokens / 1e6:.2f}M | {params * tokens if params else 0:.2e} | "
            f"{row['scores'][TASKS[0]]:.4f} | {row['scores'][TASKS[1]]:.4f} | "
            f"{(row['scores'][TASKS[0]] + row['scores'][TASKS[1]]) / 2:.4f} |"
        )
    gains = {}
    for tower in TOWERS:
        pair = {r["start"]: r for r in rows if r["tower"] == tower}
        if {"random", "foundation"} <= set(pair):
            ret, rer = (pair["foundation"]["scores"][t] - pair["random"]["scores"][t] for t in TASKS)
            gains[tower] = [ret, rer, (ret + rer) / 2]
    if gains:
        lines += ["", "Gain of the pretraining (foundation - random):", ""]
        for tower, (ret, rer, both) in gains.items():
            lines.append(f"- {tower} tower: retrieval {ret:+.4f}, rerank {rer:+.4f}, Avg {both:+.4f}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--foundation", type=Path, required=True, help="A finished miniature-foundation run.")
    parser.add_argument("--out", type=Path, required=True, help="Folder for the rows' training runs.")
    parser.add_argument("--trained", type=Path, default=None, help="An ablation run whose Stage 0 exports to reuse.")
    parser.add_argument("--towers", nargs="+", default=list(TOWERS), choices=list(TOWERS))
    parser.add_argument(
        "--data-dir", type=Path, default=Path(os.environ.get("CARE_SHARED_DATA", REPO.parent / "shared" / "data"))
    )
    parser.add_argument("--doc", type=Path, default=REPO / "benchmarks" / "results" / "foundation_scaling.md")
    args = parser.parse_args(argv)
    pre = pretraining(args.foundation)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for tower in args.towers:
        export = TOWERS[tower][1]
        for start in ("random", "foundation"):
            reused = args.trained / "models" / export if args.trained and start == "foundation" else None
            if reused is not None and reused.is_dir():
                model, cache = reused, args.out / f"{tower}-foundation-reused.{SCORES_FILE}"
                reuse_report_scores(args.trained, export, cache)
            else:
                folder = args.out / f"{tower}-{start}"
                model = train(tower, args.foundation if start == "foundation" else None, folder)
                cache = folder / SCORES_FILE
            report = pre[tower] if start == "foundation" else {}
            rows.append(
                {
                    "tower": tower,
                    "start": start,
                    "model": str(model),
                    "parameters": pre[tower].get("tower_parameters"),
                    "tokens": report.get("tokens", 0),
                    "scores": score(model, args.data_dir, cache),
                }
            )
    args.doc.write_text(render(rows), "utf-8")
    args.doc.with_suffix(".json").write_text(json.dumps({"rows": rows}, indent=2), "utf-8")
    print(f"wrote {args.doc}")


if __name__ == "__main__":
    main()
