"""``care-retriever bench``: speed and memory of the asymmetric model against its symmetric baselines."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from care_retriever import strict_json
from care_retriever.cli.eval import GreedyCommand, display_name
from care_retriever.cli.options import TrustRemoteCode
from care_retriever.cli.panels import COMMON
from care_retriever.errors import InputError


def bench_command(
    model: Annotated[
        str | None,
        typer.Option(help="CARE model folder; DIR#query and DIR#document are added.", rich_help_panel=COMMON),
    ] = None,
    models: Annotated[
        list[str] | None,
        typer.Option(help="More models (sentence-transformers ids or folders, CARE folders).", rich_help_panel=COMMON),
    ] = None,
    symmetric: Annotated[
        bool, typer.Option(help="Also time DIR#query (small symmetric) and DIR#document (symmetric LLM).")
    ] = True,
    out: Annotated[
        Path, typer.Option(help="Folder for bench.json, bench.md and bench.png.", rich_help_panel=COMMON)
    ] = Path("bench"),
    queries: Annotated[
        Path | None,
        typer.Option(help="Query texts: JSONL, BEIR folder or text (default: shipped sample).", rich_help_panel=COMMON),
    ] = None,
    corpus: Annotated[
        Path | None,
        typer.Option(
            help="Documents to index: JSONL or BEIR folder (default: shipped sample).", rich_help_panel=COMMON
        ),
    ] = None,
    n_queries: Annotated[int, typer.Option(help="Queries timed per batch size.")] = 128,
    index_docs: Annotated[int, typer.Option(help="Documents indexed to time the writer (0: skip).")] = 128,
    search_sizes: Annotated[
        list[int] | None, typer.Option(help="Corpus sizes N for search latency (repeat the flag).")
    ] = None,
    search_queries: Annotated[int, typer.Option(help="Queries timed per search backend.")] = 200,
    memory: Annotated[bool, typer.Option(help="Peak RSS of query-only vs both-tower processes.")] = True,
    task: Annotated[list[Path] | None, typer.Option(help="Score accuracy on these task folders too.")] = None,
    accuracy_from: Annotated[
        Path | None, typer.Option(help="Accuracy from `care-retriever eval --json` output (matched by name).")
    ] = None,
    device: Annotated[str | None, typer.Option(help="cpu | cuda (default: auto).", rich_help_panel=COMMON)] = None,
    trust_remote_code: TrustRemoteCode = False,
) -> None:
    """Query QPS, p50/p99 at batch 1 and 32, indexing docs/s, search latency, memory: JSON, Markdown, plot."""
    from care_retriever.evaluation import benchmark as B
    from care_retriever.evaluation.report import bench_markdown, plot_accuracy_vs_qps
    from care_retriever.model.baselines import is_care_model

    names: list[str] = []
    if model:
        if not is_care_model(model):
            raise InputError(
                f"--model {model}: not a CARE model (no care_config.json, not the authors' release layout); "
                "use --models"
            )
        names += [model] + ([f"{model}#query", f"{model}#document"] if symmetric else [])
    names += models or []
    if not names:
        raise InputError("give --model DIR (a CARE model) and/or --models A B")
    if n_queries < 32:
        raise InputError("--n-queries must be >= 32 (one batch of 32)")
    query_texts = B.read_texts(queries or B.SAMPLE_DIR / "queries.jsonl", n_queries)
    docs = B.read_documents(corpus or B.SAMPLE_DIR / "corpus.jsonl", index_docs) if index_docs > 0 else []
    labels = {n: display_name(n) for n in names}

    result = B.BenchResult(
        hardware=B.hardware(),
        models=[],
        settings={
            "n_queries": n_queries,
            "index_docs": len(docs),
            "search_sizes": search_sizes or [10_000, 50_000],
            "search_queries": search_queries,
        },
    )
    result.models = B.bench_models(
        names, queries=query_texts, documents=docs, device=device, labels=labels, trust_remote_code=trust_remote_code
    )
    if not result.models:
        raise InputError("no dense model to benchmark")
    first = names[0]
    if search_sizes != [0]:
        from care_retriever.model.baselines import load_embedder
        from care_retriever.sparse.bm25 import BM25Model

        embedder = (
            load_embedder(first, device=device, load="query", trust_remote_code=trust_remote_code)
            if is_care_model(first)
            else load_embedder(first, device=device, trust_remote_code=trust_remote_code)
        )
        if isinstance(embedder, BM25Model):
            raise InputError(f"the search benchmark encodes queries with the first model; {first} has no query tower")
        qvec = embedder.embed_queries(B.read_texts(queries or B.SAMPLE_DIR / "queries.jsonl", search_queries))
        del embedder
        result.search = B.bench_search(qvec, search_sizes or [10_000, 50_000])
    if memory and model:
        result.memory = B.bench_memory(model, trust_remote_code)
    evals = []
    if accuracy_from:
        evals += B.read_eval_json(accuracy_from)
    if task:
        from care_retriever.evaluation.runner import evaluate
        from care_retriever.evaluation.tasks import load_task
        from care_retriever.model.baselines import load_embedder

        loaded = [load_task(t) for t in task]
        for name in names:
            embedder = load_embedder(name, device=device, trust_remote_code=trust_remote_code)
            evals += [evaluate(embedder, t, model_name=labels[name]).to_dict() for t in loaded]
    B.attach_accuracy(result.models, evals)

    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(strict_json.dumps(result.to_dict(), indent=2) + "\n")
    table = bench_markdown(result)
    (out / "bench.md").write_text(table + "\n")
    plot_accuracy_vs_qps(result, out / "bench.png")
    typer.echo(table)
    typer.echo(f"\nwrote {out / 'bench.json'}, {out / 'bench.md'}, {out / 'bench.png'}", err=True)


class BenchCommand(GreedyCommand):
    greedy = (*GreedyCommand.greedy, "--search-sizes")


def register(app: typer.Typer) -> None:
    app.command("bench", cls=BenchCommand)(bench_command)
