"""``care-retriever eval``: score models on retrieval, rerank and STS task folders (CMedTEB style)."""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, cast

import typer
from typer._click import Context as TyperClickContext  # typer vendors click: its commands get this Context
from typer.core import TyperCommand

from care_retriever import strict_json
from care_retriever.cli.options import TrustRemoteCode
from care_retriever.cli.panels import COMMON, HYBRID
from care_retriever.errors import InputError
from care_retriever.faults import require_output_file
from care_retriever.sparse.fusion import DEFAULT_FUSION

if TYPE_CHECKING:
    from care_retriever.evaluation.hybrid import HybridModel
    from care_retriever.evaluation.runner import StsEncode
    from care_retriever.model.protocols import Embedder
    from care_retriever.sparse.bm25 import BM25Model

# Options that take several values after one flag (``--task A B --models X Y``), as in the docs.
GREEDY_OPTIONS = ("--task", "--models")


def expand_greedy(args: list[str], greedy: tuple[str, ...] = GREEDY_OPTIONS) -> list[str]:
    """Rewrite ``--task A B`` into ``--task A --task B``; click options take one value per flag."""
    out: list[str] = []
    current: str | None = None
    got_value = False
    for arg in args:
        if arg == "--" or (arg.startswith("--") and len(arg) > 2):
            if current is not None and not got_value:
                out.append(current)  # no value: click reports it
            current, got_value = (arg, False) if arg in greedy else (None, False)
            if current is None:
                out.append(arg)
        elif current is not None:
            out.extend([current, arg])
            got_value = True
        else:
            out.append(arg)
    if current is not None and not got_value:
        out.append(current)
    return out


class GreedyCommand(TyperCommand):
    """A command whose :data:`greedy` options take several values after one flag."""

    greedy: tuple[str, ...] = GREEDY_OPTIONS

    def parse_args(self, ctx: TyperClickContext, args: list[str]) -> list[str]:
        return super().parse_args(ctx, expand_greedy(list(args), self.greedy))


def display_name(model: str) -> str:
    """Short model label for tables: a folder's name (with any ``#tower`` suffix), else the argument."""
    base, sep, tower = model.partition("#")
    path = Path(base)
    label = path.name if (path.exists() and path.name) else base
    return f"{label}{sep}{tower}"


def model_labels(names: list[str]) -> dict[str, str]:
    """Each model's label in the tables and the run files' names: its folder's name, or the argument as given where
    two models share a folder name (one label for both put their runs in one file, the second over the first)."""
    short = {name: display_name(name) for name in names}
    counts = Counter(short.values())
    return {name: label if counts[label] == 1 else name for name, label in short.items()}


def check_run_paths(save_run: Path, labels: list[str], tasks: list[str]) -> None:
    """Each (label, task) gets a run file of its own that can be written, or one line before any work (two runs in
    one file: the second would be written over the first)."""
    many = len(labels) * len(tasks) > 1
    written: dict[Path, str] = {}
    for label in labels:
        for task in tasks:
            path = run_path(save_run, label, task, many)
            if path in written:
                raise InputError(
                    f"--save-run: {written[path]} and {label} on {task} would both be written to {path}; "
                    "give the tasks (or models) folders of different names"
                )
            written[path] = f"{label} on {task}"
            require_output_file(path, "--save-run")


def run_path(save_run: Path, model: str, task: str, many: bool) -> Path:
    if not many:
        return save_run
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in f"{model}.{task}")
    return save_run.with_name(f"{save_run.stem}.{safe}{save_run.suffix or '.trec'}")


def eval_command(
    model: Annotated[
        str | None,
        typer.Option(
            help="bm25 | CARE folder (DIR, DIR#query, DIR#document) | sentence-transformers model.",
            rich_help_panel=COMMON,
        ),
    ] = None,
    task: Annotated[
        list[Path] | None,
        typer.Option(
            help="Task folder(s) or rows file(s); type detected (retrieval/rerank/STS).", rich_help_panel=COMMON
        ),
    ] = None,
    models: Annotated[
        list[str] | None, typer.Option(help="Several models: one comparison table.", rich_help_panel=COMMON)
    ] = None,
    suite: Annotated[
        tuple[str, Path] | None,
        typer.Option(
            help="NAME DIR: 'cmedteb' (Retrieval, Rerank, STS, CMedQA-v1/v2 subfolders) or 'all'.",
            rich_help_panel=COMMON,
        ),
    ] = None,
    mteb_task: Annotated[
        list[str] | None,
        typer.Option("--mteb-task", help="C-MTEB task via the mteb package (needs the hub)."),
    ] = None,
    instruction: Annotated[str | None, typer.Option(help="Override the per-task query instruction.")] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="One JSON object per (model, task) per line.", rich_help_panel=COMMON)
    ] = False,
    save_run: Annotated[
        Path | None,
        typer.Option(
            help="Write ranked lists (TREC run format); several runs get .MODEL.TASK names.", rich_help_panel=COMMON
        ),
    ] = None,
    split: Annotated[str, typer.Option(help="Split file name: qrels/SPLIT.tsv, SPLIT.jsonl.")] = "test",
    top_k: Annotated[int, typer.Option(help="Retrieval depth per query.", rich_help_panel=COMMON)] = 100,
    sts_encode: Annotated[
        str, typer.Option(help="STS sides: query (both as queries) | document | cross (query vs document).")
    ] = "query",
    query_batch_size: Annotated[int, typer.Option(help="Queries per forward pass.")] = 64,
    doc_batch_size: Annotated[int, typer.Option(help="Documents per forward pass (length-sorted).")] = 64,
    device: Annotated[str | None, typer.Option(help="cpu | cuda (default: auto).", rich_help_panel=COMMON)] = None,
    progress: Annotated[bool, typer.Option(help="Progress bars on stderr.")] = True,
    mode: Annotated[
        list[str] | None,
        typer.Option(
            help="dense | hybrid (the model fused with bm25) | sparse (bm25); repeat for several rows.",
            rich_help_panel=HYBRID,
        ),
    ] = None,
    fusion: Annotated[
        str, typer.Option(help="Hybrid fusion: rrf | dbsf | wsum (docs/hybrid.md).", rich_help_panel=HYBRID)
    ] = DEFAULT_FUSION,
    rrf_k: Annotated[
        int | None, typer.Option(help="RRF constant k (default: docs/hybrid.md's).", rich_help_panel=HYBRID)
    ] = None,
    dense_weight: Annotated[
        float | None, typer.Option(help="wsum: the dense side's weight.", rich_help_panel=HYBRID)
    ] = None,
    trust_remote_code: TrustRemoteCode = False,
) -> None:
    """Score models on retrieval (nDCG@10), rerank (MAP@10) and STS (Pearson) tasks."""
    from care_retriever.evaluation.suites import resolve_suite

    names = [*([model] if model else []), *(models or [])]
    if not names:
        raise InputError("give --model M (or --models A B C)")
    if sts_encode not in ("query", "document", "cross"):
        raise InputError(f"--sts-encode {sts_encode!r}: expected query, document or cross")
    if top_k < 1 or query_batch_size < 1 or doc_batch_size < 1:
        raise InputError("--top-k and batch sizes must be >= 1")
    if save_run is not None:  # before any task is read or model loaded: a run cannot be written after minutes of work
        require_output_file(save_run, "--save-run")
    paths = list(task or [])
    if suite:
        paths.extend(resolve_suite(suite[0], suite[1]))
    if not paths and not mteb_task:
        raise InputError("give --task DIR..., --suite NAME DIR or --mteb-task NAME")

    from care_retriever.evaluation.hybrid import HybridModel, mode_label
    from care_retriever.model.baselines import load_embedder
    from care_retriever.sparse.fusion import DEFAULT_DENSE_WEIGHT, DEFAULT_RRF_K, FusionConfig, check_mode

    modes = [check_mode(m) for m in (mode or ["dense"])]
    fusion_config = FusionConfig(
        fusion,
        k=DEFAULT_RRF_K if rrf_k is None else rrf_k,
        dense_weight=DEFAULT_DENSE_WEIGHT if dense_weight is None else dense_weight,
    )
    from care_retriever.evaluation.report import comparison_table, detail_table
    from care_retriever.evaluation.runner import Timer, evaluate
    from care_retriever.evaluation.tasks import load_task

    # Load every task first: bad input fails before any model spends minutes encoding.
    tasks, load_seconds = [], []
    for p in paths:
        t0 = time.perf_counter()
        tasks.append(load_task(p, split=split, instruction=instruction))
        load_seconds.append(time.perf_counter() - t0)
    results = []
    labels = model_labels(names)
    runs = []  # (label, name, mode): bm25 is the sparse mode; hybrid pairs a dense model with bm25
    for name in names:
        for m in modes:
            if m == "sparse" or name.lower() == "bm25":
                if ("bm25", "bm25", "sparse") not in runs:
                    runs.append(("bm25", "bm25", "sparse"))
            else:
                runs.append((mode_label(labels[name], m, fusion_config), name, m))
    if save_run is not None:
        check_run_paths(save_run, [label for label, _, _ in runs], [t.name for t in tasks])
    loaded: dict[str, tuple[Embedder | BM25Model, float]] = {}
    for label, name, m in runs:
        if name not in loaded:
            t0 = time.perf_counter()
            embedder = load_embedder(name, device=device, trust_remote_code=trust_remote_code)
            loaded[name] = (embedder, time.perf_counter() - t0)
        embedder, model_load = loaded[name]
        scored: Embedder | BM25Model | HybridModel = HybridModel(embedder, fusion_config) if m == "hybrid" else embedder
        many = len(runs) * len(tasks) > 1
        for t, loaded_in in zip(tasks, load_seconds, strict=True):
            timer = Timer(loaded_in)
            out = run_path(save_run, label, t.name, many) if save_run else None
            result = evaluate(
                scored,
                t,
                model_name=label,
                query_batch_size=query_batch_size,
                doc_batch_size=doc_batch_size,
                top_k=top_k,
                sts_encode=cast("StsEncode", sts_encode),  # checked against its values above
                save_run=out,
                show_progress=progress,
                timer=timer,
            )
            result.timing["model_load"] = model_load  # once per model; not part of the task's seconds
            results.append(result)
            _emit(result, json_out)
        if mteb_task:
            from care_retriever.evaluation.mteb_adapter import run_mteb_tasks

            for result in run_mteb_tasks(embedder, mteb_task, model_name=label, instruction=instruction):
                results.append(result)
                _emit(result, json_out)
    if not json_out:
        typer.echo("")
        typer.echo(comparison_table(results))
        typer.echo("")
        typer.echo(detail_table(results))


def _emit(result, json_out: bool) -> None:
    if json_out:
        sys.stdout.write(strict_json.dumps(result.to_dict()) + "\n")
        sys.stdout.flush()
    elif result.skipped:
        typer.echo(f"{result.model} / {result.task}: skipped ({result.skipped})", err=True)
    else:
        typer.echo(
            f"{result.model} / {result.task} ({result.type}): {result.main_score:.4f} in {result.seconds:.1f}s",
            err=True,
        )


def convert_task(
    fmt: Annotated[str, typer.Argument(help="kuake-qtr | kuake-qqr | chip-sts | qa (question/answer JSONL).")],
    src: Annotated[Path, typer.Argument(help="Raw file: a CBLUE JSON array or JSONL.")],
    out: Annotated[Path, typer.Argument(help="Task folder to write.")],
    as_: Annotated[str, typer.Option("--as", help="kuake-qtr only: retrieval (BEIR) or rerank rows.")] = "retrieval",
    with_description: Annotated[
        bool, typer.Option(help="qa only: append the row's description to the question.")
    ] = False,
    force: Annotated[bool, typer.Option(help="Replace OUT if it exists.")] = False,
) -> None:
    """Convert raw CBLUE JSON (KUAKE-QTR/QQR, CHIP-STS) or question/answer JSONL into an eval task folder."""
    from care_retriever.evaluation.converters import convert
    from care_retriever.evaluation.tasks import load_task

    path = convert(fmt, src, out, as_=as_, force=force, with_description=with_description)
    task = load_task(path)  # read it back: what we write must be what eval reads
    typer.echo(f"wrote {task.type} task {task.name!r} to {path}")


def register(app: typer.Typer) -> None:
    app.command("eval", cls=GreedyCommand)(eval_command)
    app.command("convert-task")(convert_task)
