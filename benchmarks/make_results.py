"""Generate benchmarks/results/dev-tasks.md (and its .png, .jsonl) from real runs on the shared dev tasks; its main
table reaches docs/results.md through ``benchmarks.results_page``.

    python -m benchmarks.make_results                          # BM25 on every task in ../shared/data/tasks
    python -m benchmarks.make_results --models OUT/model M2    # plus these models (CARE folders, ST models)
    python -m benchmarks.make_results --models OUT/model --hybrid   # plus each model + BM25 (search --mode hybrid)
    python -m benchmarks.make_results --from-json a.jsonl      # reuse `care-retriever eval --json` output
    python -m benchmarks.make_results --from-miniature m.json  # reuse training_miniature_report.py --json scores

Every number in the document comes from ``care-retriever``'s evaluation harness (or a saved
``--json`` run of it); nothing is typed by hand. Query throughput for the plot is measured here, on
this machine, with the models' own ``embed_queries``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TASKS = Path(os.environ.get("CARE_SHARED_DATA", REPO.parent / "shared" / "data")) / "tasks"
RESULTS = REPO / "benchmarks" / "results"
# shared/data/README.md, "Reference figures measured on these dev halves" (BM25, jieba tokens, bm25s).
README_REFERENCE = {
    "kuake-qtr-retrieval": {"ndcg@10": 0.546, "recall@100": 0.937},
    "im-qa-retrieval": {"ndcg@10": 0.189, "recall@100": 0.515},
}

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def run_evals(models: list[str], tasks_dir: Path, hybrid: bool = False) -> list[dict]:
    """Every model on every dev task; with ``hybrid``, each dense model fused with BM25 (the default
    fusion of ``care-retriever search --mode hybrid``) on the retrieval tasks too, as its own row."""
    from care_retriever.cli.eval import display_name
    from care_retriever.evaluation.hybrid import HybridModel, mode_label
    from care_retriever.evaluation.runner import Timer, evaluate
    from care_retriever.evaluation.suites import resolve_suite
    from care_retriever.evaluation.tasks import load_task
    from care_retriever.model.baselines import load_embedder
    from care_retriever.sparse.fusion import FusionConfig

    tasks = [load_task(p) for p in resolve_suite("all", tasks_dir)]
    rows = []
    for name in models:
        embedder = load_embedder(name)
        variants = [(display_name(name), embedder, tasks)]
        if hybrid and name != "bm25":
            # Rerank and STS score the dense tower alone (no BM25 side there): hybrid rows are retrieval only.
            retrieval = [t for t in tasks if t.type == "retrieval"]
            fusion = FusionConfig()
            variants.append(
                (mode_label(display_name(name), "hybrid", fusion), HybridModel(embedder, fusion), retrieval)
            )
        for label, model, its_tasks in variants:
            for task in its_tasks:
                print(f"evaluating {label} on {task.name} ...", file=sys.stderr, flush=True)
                result = evaluate(model, task, model_name=label, timer=Timer(), show_progress=True)
                rows.append(result.to_dict())
        del embedder, variants
    return rows


def query_speed(models: list[str], queries_file: Path, n: int) -> dict[str, dict]:
    """Batch-1 and batch-32 query encoding speed of each dense model, by display name."""
    from care_retriever.cli.eval import display_name
    from care_retriever.evaluation import speed
    from care_retriever.evaluation.benchmark import read_texts, tower_params
    from care_retriever.model.baselines import load_embedder

    queries = read_texts(queries_file, n)
    out = {}
    for name in models:
        if name == "bm25":
            continue
        embedder = load_embedder(name)
        q_params, d_params = tower_params(embedder)
        out[display_name(name)] = {
            **{f"batch_{b}": speed.query_encoding(embedder, queries, b).to_dict() for b in (1, 32)},
            "params": [q_params, d_params],
        }
        del embedder
    return out


def to_results(rows: list[dict]):
    from care_retriever.evaluation.runner import TaskResult

    keys = set(TaskResult.__dataclass_fields__)
    return [TaskResult(**{k: v for k, v in r.items() if k in keys}) for r in rows]


def plot(rows: list[dict], speeds: dict[str, dict], path: Path) -> Path | None:
    """Mean main score over the retrieval and rerank tasks (as the paper's Table 4) vs batch-1 query QPS."""
    if not speeds:
        return None
    from care_retriever.evaluation.benchmark import BenchResult, ModelBench, hardware
    from care_retriever.evaluation.report import plot_accuracy_vs_qps

    ranking = [r for r in rows if r["type"] in ("retrieval", "rerank") and r["main_score"] is not None]
    models = []
    for name, q in speeds.items():
        mine = [r["main_score"] for r in ranking if r["model"] == name]
        role = (
            "symmetric LLM"
            if name.endswith("#document")
            else "small symmetric"
            if name.endswith("#query")
            else "asymmetric"
        )
        q_params, d_params = q.get("params", [None, None])
        batches = {k: v for k, v in q.items() if k.startswith("batch_")}
        accuracy = sum(mine) / len(mine) if mine else None
        models.append(ModelBench(name, role, 0, q_params, d_params, query=batches, accuracy=accuracy))
    bm25 = [r["main_score"] for r in ranking if r["model"] == "bm25"]
    references = {"BM25 (no query encoder)": sum(bm25) / len(bm25)} if bm25 else None
    result = BenchResult(hardware=hardware(), models=models)
    return plot_accuracy_vs_qps(
        result,
        path,
        references=references,
        title="Dev tasks: mean retrieval + rerank main score vs query speed",
    )


def reference_check(rows: list[dict]) -> str:
    lines = ["| task | metric | shared/data README | this harness | difference |", "|---|---|---|---|---|"]
    for task, ref in README_REFERENCE.items():
        ours = next((r for r in rows if r["model"] == "bm25" and r["task"] == task), None)
        if ours is None:
            continue
        for metric, value in ref.items():
            got = ours["metrics"][metric]
            lines.append(f"| {task} | {metric} | {value:.3f} | {got:.4f} | {got - value:+.4f} |")
    return "\n".join(lines)


def speed_table(speeds: dict[str, dict]) -> str:
    from care_retriever.evaluation.report import _params

    lines = [
        "| model | Q / D params | batch 1 q/s | p50 ms | p99 ms | batch 32 q/s |",
        "|---|---|---|---|---|---|",
    ]
    for name, q in speeds.items():
        b1, b32 = q["batch_1"], q["batch_32"]
        sizes = " / ".join(_params(n) for n in q.get("params", [None, None]))
        lines.append(
            f"| {name} | {sizes} | {b1['per_second']:.1f} | {b1['p50_ms']:.1f} | {b1['p99_ms']:.1f} "
            f"| {b32['per_second']:.1f} |"
        )
    return "\n".join(lines)


def write_doc(rows: list[dict], speeds: dict[str, dict], png: Path | None, out: Path, argv: list[str]) -> None:
    from benchmarks.core_common import machine_line
    from care_retriever.evaluation.report import comparison_table, detail_table

    results = to_results(rows)
    parts = [
        "# Results on the shared dev tasks",
        "",
        f"Generated by `python -m benchmarks.make_results {' '.join(argv)}`".rstrip() + " on "
        f"{machine_line()}. Do not edit by hand: re-run the script.",
        "",
        "Tasks: the dev halves in `../shared/data/tasks` (see `shared/data/README.md`): kuake-qtr-retrieval "
        "(32,176 page titles, 709 queries, graded 0..3; binary metrics count grade >= 2), im-qa-retrieval "
        "(3,829 doctor answers, 480 questions), kuake-qtr-rerank (199 queries), chip-sts (2,012 pairs). "
        "Main scores: nDCG@10 (retrieval), MAP@10 as MTEB defines it (rerank), Pearson of cosine (STS); "
        "all from pytrec_eval / scipy. Query instructions: the paper's Table 8.",
        "",
        "BM25 is bm25s (Lucene variant, k1 1.5, b 0.75) over the sparse side's tokens "
        "(`care_retriever/sparse/tokenizer.py`: jieba search mode, NFKC, lower case, punctuation and function "
        "words dropped), the tokens `search --mode sparse|hybrid` uses, so it scores above the data README's "
        "plain-jieba reference figures (table below). BM25 has no sentence embedding, so no STS score.",
        "",
        "## BM25 against the data README's reference",
        "",
        reference_check(rows),
        "",
        "The README's Recall@100 for kuake-qtr counts grade >= 1 as relevant; the harness follows the "
        "README's stated rule, grade >= 2.",
        "",
        "## Main scores",
        "",
        comparison_table(results),
        "",
        "## All metrics",
        "",
        detail_table(results),
        "",
        "`seconds` is the wall time of the task (encoding included, model loading excluded); `overhead` is "
        "the share of it spent outside the model's forward passes and the search (loading data, building "
        "runs, metrics).",
    ]
    if speeds:
        parts += ["", "## Query speed on this machine", "", speed_table(speeds)]
    if png is not None:
        parts += ["", f"![accuracy vs query speed]({png.name})", ""]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(parts) + "\n", encoding="utf-8")


def miniature_rows(path: Path, tasks_dir: Path, skip: set[str]) -> list[dict]:
    """Rows in `care-retriever eval --json` form from the miniature report's saved scores (its first seed).

    The report scored every model with the same harness (``evaluation.runner.evaluate``) and keeps each
    seed as ``{"seeds": [{"seed": s, "models": {model: {task: {"main_score", "metrics"}}}}]}``; this table
    shows one run, the first seed's. Models already among the rows (e.g. BM25) are skipped.
    """
    from care_retriever.evaluation.tasks import detect_type

    seeds = json.loads(path.read_text(encoding="utf-8")).get("seeds") or []
    if not seeds:
        expected = "`python -m experiments.training_miniature_report --json`"
        raise SystemExit(f"{path}: no seeds (expected the output of {expected})")
    rows = []
    for model, scores in seeds[0]["models"].items():
        if model in skip:
            continue
        for task, score in scores.items():
            kind, _ = detect_type(tasks_dir / task)
            row = {"task": task, "type": kind, "main_score": score["main_score"], "model": model}
            rows.append({**row, "metrics": score.get("metrics", {}), "seconds": None})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=[], help="Dense models besides BM25.")
    parser.add_argument("--tasks-dir", type=Path, default=DEFAULT_TASKS)
    parser.add_argument(
        "--from-json",
        nargs="*",
        type=Path,
        default=[],
        help="`care-retriever eval --json` outputs to include instead of re-running.",
    )
    parser.add_argument(
        "--time-models",
        nargs="*",
        default=[],
        help="Models to time only (their scores come from --from-json; same names as there).",
    )
    parser.add_argument(
        "--from-miniature",
        type=Path,
        default=None,
        help="`python -m experiments.training_miniature_report --json` output: its models' scores (same harness).",
    )
    parser.add_argument("--no-bm25", action="store_true", help="Skip BM25 (e.g. when it is in --from-json).")
    parser.add_argument(
        "--hybrid", action="store_true", help="Also each --models model fused with BM25 (retrieval tasks)."
    )
    parser.add_argument("--speed-queries", type=int, default=64)
    parser.add_argument("--out", type=Path, default=RESULTS / "dev-tasks.md")
    args = parser.parse_args()
    if not args.tasks_dir.is_dir():
        print(f"shared dev tasks not found at {args.tasks_dir} (set CARE_SHARED_DATA)", file=sys.stderr)
        return 2
    start = time.time()
    rows = []
    for path in args.from_json:
        rows += [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if args.from_miniature:
        rows += miniature_rows(args.from_miniature, args.tasks_dir, skip={r["model"] for r in rows})
    to_run = ([] if args.no_bm25 else ["bm25"]) + args.models
    rows += run_evals(to_run, args.tasks_dir, hybrid=args.hybrid)
    speeds = query_speed(args.models + args.time_models, args.tasks_dir / "kuake-qtr-retrieval", args.speed_queries)
    (args.out.with_suffix(".jsonl")).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    png = plot(rows, speeds, args.out.with_suffix(".png"))
    write_doc(rows, speeds, png, args.out, sys.argv[1:])
    print(f"wrote {args.out} in {time.time() - start:.0f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
