"""Tables of evaluation results: one row per model, one column per task (main scores), as the paper."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from care_retriever.evaluation.runner import TaskResult

MAIN_NAMES = {"retrieval": "nDCG@10", "rerank": "MAP@10", "sts": "Pearson"}


def _fmt(value: float | None, digits: int = 4) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def comparison_table(results: Sequence[TaskResult], *, digits: int = 4) -> str:
    """Markdown: models x tasks (main score), plus the average over the tasks a model was scored on."""
    models = list(dict.fromkeys(r.model for r in results))
    tasks = list(dict.fromkeys(r.task for r in results))
    kinds = {r.task: r.type for r in results}
    by = {(r.model, r.task): r for r in results}
    header = ["model", *(f"{t} ({MAIN_NAMES.get(kinds[t], kinds[t])})" for t in tasks), "avg"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for model in models:
        cells = [model]
        scored: list[float] = []
        for task in tasks:
            r = by.get((model, task))
            value = None if r is None else r.main_score
            cells.append(_fmt(value, digits))
            if value is not None:
                scored.append(value)
        # An average over fewer tasks than the others would not compare; mark it.
        avg = sum(scored) / len(scored) if scored else None
        cells.append(_fmt(avg, digits) + ("" if len(scored) == len(tasks) else f" ({len(scored)}/{len(tasks)})"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def detail_table(results: Sequence[TaskResult], *, digits: int = 4) -> str:
    """Markdown: every metric of every (model, task), with wall time and the harness's overhead share."""
    lines = ["| model | task | type | main | metrics | seconds | overhead |", "|---|---|---|---|---|---|---|"]
    for r in results:
        if r.skipped:
            lines.append(f"| {r.model} | {r.task} | {r.type} | n/a | skipped: {r.skipped} | {_fmt(r.seconds, 1)} | |")
            continue
        metrics = ", ".join(f"{k} {v:.{digits}f}" for k, v in r.metrics.items())
        overhead = r.timing.get("overhead_fraction")
        share = "" if overhead is None else f"{100 * overhead:.1f}%"
        main = _fmt(r.main_score, digits)
        # seconds is None for scores carried over from a report that did not keep the wall time
        lines.append(f"| {r.model} | {r.task} | {r.type} | {main} | {metrics} | {_fmt(r.seconds, 1)} | {share} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------- benchmarks
def _params(n: int | None) -> str:
    if n is None:
        return "?"
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.0f}M" if n >= 1e6 else f"{n / 1e3:.0f}K"


def bench_markdown(result: Any) -> str:
    """Markdown tables of a :class:`~care_retriever.evaluation.benchmark.BenchResult`."""
    hw = result.hardware
    lines = [
        f"Hardware: {hw.get('processor')} ({hw.get('cpu_count')} CPUs, "
        f"{hw.get('torch_threads')} torch threads"
        + (f", GPU {hw['gpu']}" if hw.get("gpu") else "")
        + f"), torch {hw.get('torch')}"
        + (f", load average {hw['load_average_1m']} at start" if "load_average_1m" in hw else "")
        + ".",
        "",
        "| model | role | Q / D params | dim | batch 1: q/s (p50 / p99 ms) "
        "| batch 32: q/s (p50 / p99 ms per batch) | indexing docs/s | accuracy |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m in result.models:
        cells = []
        for key in ("batch_1", "batch_32"):
            q = m.query.get(key)
            cells.append(f"{q['per_second']:.1f} ({q['p50_ms']:.1f} / {q['p99_ms']:.1f})" if q else "n/a")
        docs = "n/a" if m.indexing_docs_per_s is None else f"{m.indexing_docs_per_s:.1f}"
        acc = "n/a" if m.accuracy is None else f"{m.accuracy:.4f}"
        lines.append(
            f"| {m.name} | {m.role} | {_params(m.query_params)} / {_params(m.document_params)} | {m.dim} "
            f"| {cells[0]} | {cells[1]} | {docs} | {acc} |"
        )
    if result.search:
        lines += [
            "",
            "| search backend | N docs | dim | p50 ms | p99 ms | queries/s | recall@10 vs exact | build s |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for s in result.search:
            if s.get("skipped"):
                lines.append(f"| {s['backend']} | {s['n']} | | | | | skipped: {s['skipped']} | |")
                continue
            recall = next((f"{v:.4f}" for k, v in s.items() if k.startswith("recall@")), "exact")
            lines.append(
                f"| {s['backend']} | {s['n']} | {s['dim']} | {s['p50_ms']:.2f} | {s['p99_ms']:.2f} "
                f"| {s['per_second']:.1f} | {recall} | {s['build_seconds']:.1f} |"
            )
    if result.memory:
        mem = result.memory
        lines += [
            "",
            "| process | peak RSS MiB |",
            "|---|---|",
            f"| load='query', one query encoded (a search process) | {mem['query_only_mb']:.0f} |",
            f"| load='both', one query encoded (document tower mapped, never paged in) "
            f"| {mem.get('both_loaded_query_only_mb', float('nan')):.0f} |",
            f"| load='both', a query and a document encoded (both in use) | {mem['both_towers_mb']:.0f} |",
            f"| ratio search / both in use | {mem['ratio']:.3f} |",
        ]
    return "\n".join(lines)


def plot_accuracy_vs_qps(
    result: Any, path: str | Path, *, title: str | None = None, references: dict[str, float] | None = None
) -> Path:
    """Accuracy against single-query throughput, one point per model (the paper's Figure 1 layout).

    Without accuracy numbers the plot shows throughput alone (a bar per model), so a speed-only run
    still gets its figure.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    models = [m for m in result.models if m.qps_batch1 > 0]
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=150)
    scored = [m for m in models if m.accuracy is not None]
    if scored:
        markers = {"asymmetric": ("*", "tab:red", 260)}
        for m in scored:
            marker, color, size = markers.get(m.role, ("o", "tab:blue", 90))
            if m.role.startswith("symmetric LLM"):
                color = "tab:purple"
            elif m.role.startswith("small symmetric"):
                color = "tab:green"
            ax.scatter(
                m.qps_batch1,
                m.accuracy,
                marker=marker,
                s=size,
                color=color,
                edgecolor="black",
                linewidth=0.6,
                zorder=3,
            )
            sizes = f"\n(Q {_params(m.query_params)} / D {_params(m.document_params)})" if m.query_params else ""
            ax.annotate(
                f"{m.name}{sizes}",
                (m.qps_batch1, m.accuracy),
                textcoords="offset points",
                xytext=(8, 4),
                fontsize=7,
            )
        for name, value in (references or {}).items():  # e.g. BM25: an accuracy line, no query tower
            ax.axhline(value, linestyle="--", color="gray", linewidth=1)
            ax.annotate(
                name,
                (0.01, value),
                xycoords=("axes fraction", "data"),
                textcoords="offset points",
                xytext=(2, 3),
                fontsize=7,
                color="gray",
            )
        ys = [m.accuracy for m in scored] + list((references or {}).values())
        pad = (max(ys) - min(ys)) * 0.15 or 0.05
        ax.set_ylim(min(ys) - pad, max(ys) + 2 * pad)
        ax.set_xscale("log")
        ax.set_xlabel("query throughput, batch 1 (queries/s, log scale)")
        ax.set_ylabel("accuracy (mean main score)")
        ax.grid(True, which="both", alpha=0.3)
        xs = [m.qps_batch1 for m in scored]
        ax.set_xlim(min(xs) / 2, max(xs) * 4)
    else:
        ax.barh([m.name for m in models], [m.qps_batch1 for m in models], color="tab:blue")
        ax.set_xscale("log")
        ax.set_xlabel("query throughput, batch 1 (queries/s, log scale); no accuracy given")
    hw = result.hardware
    what = "Accuracy vs query speed" if scored else "Query speed"
    ax.set_title(title or f"{what} on {hw.get('gpu') or hw.get('processor')}", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
