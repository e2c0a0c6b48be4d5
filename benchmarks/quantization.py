"""Compressed stored vectors with rescoring, side by side: FAISS store with quantize none | sq8 | binary | pq.

    python -m benchmarks.quantization --n 1000000                            # synthetic 1M x 768 + the dev tasks
    python -m benchmarks.quantization --n 100000 --skip-tasks                # a quick synthetic run
    python -m benchmarks.quantization --skip-synthetic --model runs/x/final  # the dev tasks, a trained model

Synthetic part (memory, latency, recall): ``--n`` clustered unit vectors (benchmarks/large_index.py's
generator) written through the real ``FaissStore`` (docstore, vector file, checksums: what
``care-retriever index`` writes), one process per setting. Measured per setting: index build time
(upserts + publish), bytes per document in RAM (anonymous memory added by reading index.faiss whole:
the flat vectors or the codes) and on disk (every file of the store), batch-1 p50/p99 of
``store.search`` (rescoring included), recall@10 and recall@100 against exact search, and recall@10
at other ``oversample`` values (search-time override) to choose the defaults.

Dev-task part (quality): each task's corpus encoded once by a tower pair, stored with each setting;
nDCG@10 against the task's qrels and overlap@10 with the exact ranking (the share of the exact top 10
found: recall@10 against exact search). The pair is a random-weight one of the ``base`` preset (768 dims;
``--document-layers`` shortens its decoder so that 36k documents encode on a CPU), or with ``--model`` each
saved CARE model given (its document tower encodes the corpus, its query tower the queries). The random
tower's rows and each model's rows are kept apart in the JSON: a run replaces only what it measured.

Writes ``--json`` (default benchmarks/results/quantization.json) and the marked section of
benchmarks/results/scale.md. A part that is skipped keeps its previous results from the JSON (each row says when it
was measured).

This module is the command; its parts are modules of their own: the settings compared
(``benchmarks/quantization_settings.py``), the synthetic part (``quantization_synthetic.py``), the dev tasks
(``quantization_tasks.py``) and the report (``quantization_report.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from benchmarks.quantization_report import render, write_docs
from benchmarks.quantization_settings import REPO, SETTINGS, TASKS
from benchmarks.quantization_synthetic import run_synthetic, synthetic_worker
from benchmarks.quantization_tasks import load_tasks, merge_rows, model_paths, run_model, run_tasks
from benchmarks.quantization_tasks import read_task as read_task  # re-exported: its test reads a task through here


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--latency-queries", type=int, default=100)
    parser.add_argument("--clusters", type=int, default=2000)
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument(
        "--pq-m", type=int, default=0, help="PQ bytes per vector, dividing the dimension (0: dim/8, 96 at 768 dims)"
    )
    parser.add_argument("--oversample-sweep", default="2,4,10,20,40")
    parser.add_argument("--tasks", default=",".join(TASKS))
    shared = Path(os.environ.get("CARE_SHARED_DATA") or REPO.parent / "shared" / "data")
    parser.add_argument("--data-root", type=Path, default=shared / "tasks", help="folder of the dev tasks")
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="PATH",
        help="saved CARE model(s) scored on the dev tasks instead of the random tower (repeatable or comma list)",
    )
    parser.add_argument("--preset", default="base")
    parser.add_argument(
        "--document-layers", type=int, default=2, help="decoder depth of the random tower (0: preset's)"
    )
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "care-quantization-cache")
    parser.add_argument("--skip-synthetic", action="store_true")
    parser.add_argument("--skip-tasks", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=REPO / "benchmarks" / "results" / "quantization.json")
    parser.add_argument("--docs", type=Path, default=REPO / "benchmarks" / "results" / "scale.md")
    parser.add_argument("--workdir", type=Path, help="scratch folder (default: a temp folder)")
    parser.add_argument("--worker", choices=SETTINGS, help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--truth", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--workdir-store", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        synthetic_worker(args)
        return 0
    unknown = sorted(set(args.settings.split(",")) - set(SETTINGS))
    if unknown:
        parser.error(f"unknown settings {unknown}; choose from {list(SETTINGS)}")
    models = model_paths(args.model)
    missing = [m for m in models if not (Path(m) / "care_config.json").is_file()]
    if missing:
        parser.error(f"--model: not a saved CARE model folder (no care_config.json): {', '.join(missing)}")
    if models and args.skip_tasks:
        parser.error("--model scores the dev tasks: drop --skip-tasks")
    result = json.loads(args.json.read_text()) if args.json.exists() else {}
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp_name:
        tmp = Path(tmp_name)
        command = "python -m benchmarks.quantization " + " ".join(sys.argv[1:] if argv is None else argv)
        if not args.skip_synthetic:
            fresh = run_synthetic(args, tmp)
            for row in fresh["rows"]:
                row["command"] = command
            old = result.get("synthetic") or {}
            if (old.get("n"), old.get("dim")) == (args.n, args.dim):  # settings not re-run keep their rows
                redone = {r["setting"] for r in fresh["rows"]}
                kept = [r for r in old.get("rows", []) if r["setting"] not in redone]
                order = {name: i for i, name in enumerate(SETTINGS)}
                fresh["rows"] = sorted(kept + fresh["rows"], key=lambda r: order[r["setting"]])
            # the commands whose rows are shown, in order
            fresh["commands"] = list(dict.fromkeys(r.get("command", command) for r in fresh["rows"]))
            result["synthetic"] = fresh
        # a note of an older version of this script, replaced by the trained models' own rows
        result.pop("trained_model", None)
        loaded = {} if args.skip_tasks else load_tasks(args)
        if not args.skip_tasks and not loaded:
            print(f"no dev task under {args.data_root}: skipped", file=sys.stderr)
        elif loaded and not models:
            result["dev"] = merge_rows(result.get("dev"), run_tasks(args, tmp, loaded), command)
        elif loaded:
            entries = {d["model"]: d for d in result.get("dev_models", [])}
            for path in models:
                entries[path] = merge_rows(entries.get(path), run_model(args, tmp, loaded, path), command)
            result["dev_models"] = list(entries.values())
    args.json.write_text(json.dumps(result, indent=2))
    write_docs(args.docs, render(result))
    print(render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
