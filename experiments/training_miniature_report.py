"""Score miniature training runs (one per seed) and write benchmarks/results/miniature.md and .json.

    care-retriever train --recipe miniature-ablations --out runs/ablations --seeds 3
    nice -n 10 python -m experiments.training_miniature_report --run runs/ablations/seed-*
    python -m experiments.training_miniature_report --from-json benchmarks/results/miniature.json   # re-render only
    python -m experiments.training_miniature_report --from-json benchmarks/results/miniature.json --seed-labels 0 1 2

Every model of a run (``final`` and each export under ``models/``) and BM25 go through the
product's own evaluation harness (``care_retriever.evaluation``, the code behind
``care-retriever eval``) on the ``../shared/data/tasks`` dev halves: two retrieval tasks
(nDCG@10), one rerank task (MAP@10), one STS task (Pearson). A run's scores are kept in
``RUN/miniature_scores.json`` (``--rescore`` recomputes them), so the report of several runs
re-renders in seconds. Figures are mean +- sd (sample sd) over the runs' seeds.

Avg is the training targets' measure: the mean of kuake-qtr retrieval nDCG@10 and kuake-qtr rerank
MAP@10. The gap-closure ratio is (asymmetric - small) / (large - small) on the seeds' mean Avg,
defined only when the large symmetric model is the better one. The asymmetric model is also scored on
im-qa with its documents cut to 64 tokens (the old recipes' max_length): the target "its im-qa score
rises with the longer documents", measured on the same model. ``benchmarks/results/miniature.json`` keeps every
seed as ``{"seeds": [{"seed": 0, "models": {name: {task: {"main_score": x}}}}]}`` (plus each run's
``stage_times``, so ``--from-json`` re-renders the stage tables too).

Scoring a run (its models, their rows, the harness, the cached scores, its stage times) is
``experiments/training_miniature_scoring.py``; this module is the arithmetic over seeds, the document and the command.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
from datetime import date
from pathlib import Path

from experiments.training_miniature_scoring import (
    HYBRID,
    IMQA,
    KUAKE_RETRIEVAL,
    RERANK,
    SHORT_DOCUMENTS,
    STS,
    TABLE4,
    TABLE5,
    TABLE7,
    TASKS,
    hybrid_name,
    miniature_stages,
    score_run,
    short_name,
    stage_record,
)

# re-exported: the report's tests read them here
from experiments.training_miniature_scoring import SCORES_FILE as SCORES_FILE
from experiments.training_miniature_scoring import SharedDocumentEmbeddings as SharedDocumentEmbeddings
from experiments.training_miniature_scoring import seed_of as seed_of

REPO = Path(__file__).resolve().parents[1]
MINIATURE_BUDGET_MIN = 30.0
TARGET_GAP, TARGET_CLOSURE, TARGET_BM25, TARGET_HYBRID = 0.03, 0.90, 0.02, 0.02


# ---------------------------------------------------------------------------- arithmetic
def score(entry: dict, model: str, task: str) -> float | None:
    value = entry["models"].get(model, {}).get(task, {}).get("main_score")
    return None if value is None else float(value)


def avg(entry: dict, model: str) -> float | None:
    """The target measure: mean of kuake-qtr retrieval nDCG@10 and kuake-qtr rerank MAP@10."""
    parts = [score(entry, model, KUAKE_RETRIEVAL), score(entry, model, RERANK)]
    return None if None in parts else (parts[0] + parts[1]) / 2


def values(seeds: list[dict], model: str, measure: str) -> list[float]:
    found = [avg(e, model) if measure == "avg" else score(e, model, measure) for e in seeds]
    return [v for v in found if v is not None]


def mean_sd(data: list[float]) -> tuple[float, float] | None:
    if not data:
        return None
    return statistics.fmean(data), (statistics.stdev(data) if len(data) > 1 else 0.0)


def cell(data: list[float], seeds: int) -> str:
    """mean ± sd; a model some seeds lack (not trained yet) says over how many seeds it is."""
    stats = mean_sd(data)
    if stats is None:
        return ""
    return f"{stats[0]:.4f} ± {stats[1]:.4f}" + (f" ({len(data)} of {seeds} seeds)" if len(data) < seeds else "")


def gap_closure(seeds: list[dict]) -> float | None:
    """(asym - small) / (large - small) on the mean Avg; None unless large beats small."""
    means = {m: mean_sd(values(seeds, m, "avg")) for m in TABLE4}
    if any(v is None for v in means.values()):
        return None
    small, large, asym = (means[m][0] for m in TABLE4)
    return None if large <= small else (asym - small) / (large - small)


def targets(seeds: list[dict]) -> list[str]:
    """Each training target (the paper's claims at miniature scale): met, missed (by how much) or not measurable."""
    lines = []
    mean = {m: (mean_sd(values(seeds, m, "avg")) or (None,))[0] for m in (*TABLE4, *TABLE5)}
    small, large, asym = (mean[m] for m in TABLE4)
    n = len(seeds)
    if small is not None and large is not None:
        margin = large - small
        met = margin >= TARGET_GAP
        lines.append(
            f"- large-symmetric >= small-symmetric + {TARGET_GAP} on Avg (mean of {n} seeds): "
            f"**{'met' if met else 'missed'}** ({large:.4f} vs {small:.4f}, {margin:+.4f}"
            + ("" if met else f"; short by {TARGET_GAP - margin:.4f}")
            + ")."
        )
    closure = gap_closure(seeds)
    if closure is not None:
        met = closure >= TARGET_CLOSURE
        lines.append(
            f"- the asymmetric model closes >= {TARGET_CLOSURE:.0%} of that gap: **{'met' if met else 'missed'}**, "
            f"closed {closure:.0%} (asymmetric Avg {asym:.4f}; paper: 78% at 4B, 89% at 8B)."
        )
    elif small is not None and large is not None and asym is not None:
        lines.append(
            f"- the asymmetric model closes >= {TARGET_CLOSURE:.0%} of that gap: **missed (not measurable)**: "
            f"large-symmetric does not beat small-symmetric, there is no gap to close (asymmetric Avg {asym:.4f})."
        )
    margins = [
        score(e, "asymmetric-two-stage", KUAKE_RETRIEVAL) - score(e, "bm25", KUAKE_RETRIEVAL)
        for e in seeds
        if score(e, "asymmetric-two-stage", KUAKE_RETRIEVAL) is not None and score(e, "bm25", KUAKE_RETRIEVAL)
    ]
    if margins:
        met = len(margins) == n and min(margins) >= TARGET_BM25
        lines.append(
            f"- the asymmetric model beats BM25 on {KUAKE_RETRIEVAL} by >= {TARGET_BM25} nDCG@10 in every seed: "
            f"**{'met' if met else 'missed'}** (margins {', '.join(f'{m:+.4f}' for m in margins)})."
        )
    whole = values(seeds, "asymmetric-two-stage", IMQA)
    short = values(seeds, short_name("asymmetric-two-stage"), IMQA)
    if whole and len(short) == len(whole):
        gains = [w - c for w, c in zip(whole, short, strict=True)]
        met = min(gains) > 0
        lines.append(
            f"- the asymmetric model's {IMQA} score rises with the longer documents (whole answers, 256 tokens, "
            f"against the same model's documents cut to {SHORT_DOCUMENTS['asymmetric-two-stage']} tokens): "
            f"**{'met' if met else 'missed'}** ({statistics.fmean(whole):.4f} vs {statistics.fmean(short):.4f}; "
            f"per seed {', '.join(f'{g:+.4f}' for g in gains)})."
        )
    order = [mean[m] for m in ("asymmetric-two-stage", "without-stage-ii", "without-stage-i")]
    if None not in order:
        met = order[0] > order[1] > order[2]
        lines.append(
            "- the paper's ablation order full > without Stage II > without Stage I (mean Avg): "
            f"**{'met' if met else 'missed'}** ({order[0]:.4f} / {order[1]:.4f} / {order[2]:.4f})."
        )
    return lines


def hybrid_targets(seeds: list[dict]) -> list[str]:
    """Hybrid search's quality target: hybrid >= max(BM25, dense) + 0.02 nDCG@10 on both retrieval tasks."""
    dense, fused = "asymmetric-two-stage", hybrid_name("asymmetric-two-stage")
    lines = []
    for task in (KUAKE_RETRIEVAL, IMQA):
        means = {m: mean_sd(values(seeds, m, task)) for m in (dense, "bm25", fused)}
        if any(v is None for v in means.values()):
            continue
        best = max(means[dense][0], means["bm25"][0])
        margin = means[fused][0] - best
        met = margin >= TARGET_HYBRID
        lines.append(
            f"- {fused} >= max(BM25, dense) + {TARGET_HYBRID} nDCG@10 on {task} (hybrid target, mean of {len(seeds)} "
            f"seeds): **{'met' if met else 'missed'}** ({means[fused][0]:.4f} vs {best:.4f}, {margin:+.4f})."
        )
    return lines


# ---------------------------------------------------------------------------- rendering
def table(seeds: list[dict], info: dict, models: tuple[str, ...], *, bm25: bool = False) -> list[str]:
    lines = [
        "| model | query tower | document tower | kuake-qtr-retrieval | kuake-qtr-rerank | Avg | im-qa-retrieval "
        "| chip-sts | queries/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in (*models, *(("bm25",) if bm25 else ())):
        if not any(name in e["models"] for e in seeds):
            continue
        meta = info.get(name, {})
        q, d, qps = meta.get("query_params"), meta.get("document_params"), meta.get("queries_per_s")
        lines.append(
            f"| {'BM25' if name == 'bm25' else name} | {'' if q is None else f'{q / 1e6:.1f}M'} | "
            f"{'' if d is None else f'{d / 1e6:.1f}M'} | "
            + " | ".join(cell(values(seeds, name, m), len(seeds)) for m in (KUAKE_RETRIEVAL, RERANK, "avg", IMQA, STS))
            + f" | {'' if qps is None else f'{qps:.0f}'} |"
        )
    return lines


def render(seeds: list[dict], info: dict, machine: dict | None, notes: list[str] = ()) -> str:
    n = len(seeds)
    labels = [e.get("label") for e in seeds if e.get("label")] + list(notes)
    lines = [
        "# Miniature reproduction",
        "",
        f"Generated by `python -m experiments.training_miniature_report` on {date.today()} from {n} seed(s) "
        f"({', '.join(str(e['seed']) for e in seeds)})"
        + (
            f" ({machine['arch']}, {machine['cpus']} CPUs; 5-minute load average {machine['load_before']} before "
            f"scoring, {machine['load_after']} after)"
            if machine
            else ""
        )
        + ". Nothing in this file is typed by hand: re-run the script to refresh it; every seed's scores are "
        "in `miniature.json`.",
        "",
        *(f"> {label}" for label in labels),
        *([""] if labels else []),
        "Scored by the evaluation harness (`care-retriever eval`) on the dev halves of `../shared/data/tasks`: "
        "nDCG@10 for retrieval, MAP@10 for rerank, Pearson for STS; mean ± sd over the seeds (sd 0 with one "
        "seed). Avg = mean of kuake-qtr-retrieval and kuake-qtr-rerank (the targets' measure). BM25 is bm25s "
        "over jieba tokens. Queries/s: the query path, one query per call, on this CPU (first run's models).",
        "",
        "## Table 4: small, large and asymmetric",
        "",
        *table(seeds, info, (*TABLE4, *map(hybrid_name, HYBRID), *map(short_name, SHORT_DOCUMENTS)), bm25=True),
        "",
    ]
    closure = gap_closure(seeds)
    lines.append(
        "Gap-closure ratio (asymmetric - small) / (large - small) on mean Avg: "
        + ("undefined (large-symmetric does not beat small-symmetric)" if closure is None else f"{closure:.0%}")
        + "."
    )
    lines += ["", "## Table 5: ablations", "", *table(seeds, info, TABLE5), ""]
    lines += ["## Table 7: score distillation", "", *table(seeds, info, TABLE7), ""]
    lines += ["## Targets (training and hybrid search, dev halves)", "", *targets(seeds), *hybrid_targets(seeds), ""]
    for entry in seeds:
        if "stage_times" in entry:
            lines += stage_times(entry["stage_times"])
    return "\n".join(lines)


def stage_times(record: dict) -> list[str]:
    lines = [
        f"Time per stage, `{record['run']}` (from its `run.json`; training = the optimisation loop, wall = the "
        "whole stage):",
        "",
        "| stage | steps | training s | wall s | loss first -> last |",
        "|---|---|---|---|---|",
    ]
    walls = {r["name"]: r["wall_seconds"] for r in record["stages"] if r["wall_seconds"] is not None}
    for report in record["stages"]:
        first, last = report["first_loss"], report["last_loss"]
        loss = f"{first:.3f} -> {last:.3f}" if first is not None and last is not None else ""
        wall = report["wall_seconds"]
        lines.append(
            f"| {report['name']} | {report['steps']} | {report['seconds']:.0f} | "
            f"{'' if wall is None else f'{wall:.0f}'} | {loss} |"
        )
    stages = [name for name in miniature_stages() if name in walls]
    miniature = sum(walls[name] for name in stages) + record["init_seconds"]
    total = sum(walls.values()) + record["init_seconds"]
    lines += [
        "",
        f"Wall time, all stages: {total / 60:.1f} min; the stages `miniature.yaml` runs: {miniature / 60:.1f} min "
        f"(budget {MINIATURE_BUDGET_MIN:.0f} min on 2 CPU cores).",
        "",
    ]
    return lines


def convert_legacy(path: Path) -> dict:
    """A seed entry from the single-seed ``{"results": ...}`` file this script wrote before seeds."""
    old = json.loads(path.read_text("utf-8"))
    models, info = {}, {}
    for name, row in old["results"].items():
        models[name] = {
            task: {"main_score": row[task], "metrics": row.get(f"{task}_metrics", {})}
            for task in TASKS
            if row.get(task) is not None
        }
        if "query_params" in row:
            info[name] = {k: row[k] for k in ("query_params", "document_params", "queries_per_s")}
    label = (
        "Seed 0 is the single-seed run of 2026-11-23 (`miniature-ablations` v4: `mini` towers from scratch, one "
        "CLM epoch over the training texts, max_length 64, no foundation), converted from the previous "
        "`benchmarks/results/miniature.json`; it has no Table 5 Stage I variants."
    )
    return {"seed": 0, "label": label, "models": models, "info": info}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, nargs="*", default=[], help="Run folders, one per seed.")
    parser.add_argument(
        "--data-dir", type=Path, default=Path(os.environ.get("CARE_SHARED_DATA", REPO.parent / "shared" / "data"))
    )
    parser.add_argument("--doc", type=Path, default=REPO / "benchmarks" / "results" / "miniature.md")
    parser.add_argument("--json", type=Path, default=REPO / "benchmarks" / "results" / "miniature.json")
    parser.add_argument("--plot", type=Path, default=None, help="Also draw accuracy vs query speed here.")
    parser.add_argument("--from-json", type=Path, default=None, help="Re-render from a miniature.json.")
    parser.add_argument(
        "--seed-labels",
        type=int,
        nargs="+",
        default=None,
        help="With --from-json: the seed of each of its entries, in order (a file written before the report took "
        "a run's seed from its run.json labelled seed-1 as a second 0).",
    )
    parser.add_argument("--convert-legacy", type=Path, default=None, help="Single-seed JSON to keep as seed 0.")
    parser.add_argument("--rescore", action="store_true", help="Score the runs again (ignore their cached scores).")
    parser.add_argument("--note", action="append", default=[], help="A line for the top of the document.")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[1]
    seeds: list[dict] = []
    if args.seed_labels is not None and not args.from_json:
        parser.error("--seed-labels relabels the entries of --from-json: give --from-json")
    if args.from_json:
        seeds = json.loads(args.from_json.read_text("utf-8"))["seeds"]
        if args.seed_labels is not None:
            if len(args.seed_labels) != len(seeds):
                raise SystemExit(
                    f"error: --seed-labels gives {len(args.seed_labels)} seed(s); {args.from_json} holds {len(seeds)}"
                )
            seeds = [{**entry, "seed": seed} for entry, seed in zip(seeds, args.seed_labels, strict=True)]
    if args.convert_legacy:
        seeds.append(convert_legacy(args.convert_legacy))
    scored = False
    for folder in args.run:
        state = json.loads((folder / "run.json").read_text("utf-8"))
        entry, fresh = score_run(folder, args.data_dir, args.rescore)
        entry["stage_times"] = stage_record(folder, state)
        seeds.append(entry)
        scored |= fresh
    if not seeds:
        raise SystemExit("nothing to report: give --run folders, --from-json or --convert-legacy")
    repeated = sorted({e["seed"] for e in seeds if [x["seed"] for x in seeds].count(e["seed"]) > 1})
    if repeated:
        raise SystemExit(f"error: seed(s) {repeated} given more than once: a mean over seeds must count each seed once")
    info: dict = {}
    for entry in seeds:  # the first seed that measured a model gives its sizes and speed
        for name, meta in entry.get("info", {}).items():
            info.setdefault(name, meta)
    machine = {
        "cpus": os.cpu_count(),
        "arch": platform.machine(),
        "load_before": round(load_before, 2),
        "load_after": round(os.getloadavg()[1], 2),
    }
    args.doc.parent.mkdir(parents=True, exist_ok=True)
    # the load average describes this call's scoring: none when every score came from the runs' caches
    args.doc.write_text(render(seeds, info, machine if scored else None, args.note), encoding="utf-8")
    kept = {"seeds": [{k: e[k] for k in ("seed", "label", "models", "info", "stage_times") if k in e} for e in seeds]}
    args.json.write_text(json.dumps(kept, indent=2, ensure_ascii=False), encoding="utf-8")
    if args.plot:
        write_plot(args.plot, seeds[0], info)
    print(f"wrote {args.doc} and {args.json} ({len(seeds)} seeds)")


def write_plot(path: Path, entry: dict, info: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for name in entry["models"]:
        value = avg(entry, name)
        if value is None:
            continue
        if name == "bm25":
            ax.axhline(value, color="grey", linestyle="--", label="BM25")
            continue
        if name in info:
            ax.scatter(info[name]["queries_per_s"], value)
            ax.annotate(
                name, (info[name]["queries_per_s"], value), textcoords="offset points", xytext=(4, 4), fontsize=8
            )
    ax.set_xscale("log")
    ax.set_xlabel("queries per second (one query per call, CPU)")
    ax.set_ylabel("Avg of kuake-qtr retrieval (nDCG@10) and rerank (MAP@10)")
    ax.set_title("Miniature CARE: accuracy vs query speed")
    ax.legend(loc="upper left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
