"""Tables of evaluation results: one row per model, one column per task (main scores), as the paper."""

from __future__ import annotations

from collections.abc import Sequence

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
        cells.append(
            _fmt(avg, digits) + ("" if len(scored) == len(tasks) else f" ({len(scored)}/{len(tasks)})")
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def detail_table(results: Sequence[TaskResult], *, digits: int = 4) -> str:
    """Markdown: every metric of every (model, task), with wall time and the harness's overhead share."""
    lines = ["| model | task | type | main | metrics | seconds | overhead |", "|---|---|---|---|---|---|---|"]
    for r in results:
        if r.skipped:
            lines.append(
                f"| {r.model} | {r.task} | {r.type} | n/a | skipped: {r.skipped} | {r.seconds:.1f} | |"
            )
            continue
        metrics = ", ".join(f"{k} {v:.{digits}f}" for k, v in r.metrics.items())
        overhead = r.timing.get("overhead_fraction")
        share = "" if overhead is None else f"{100 * overhead:.1f}%"
        main = _fmt(r.main_score, digits)
        lines.append(f"| {r.model} | {r.task} | {r.type} | {main} | {metrics} | {r.seconds:.1f} | {share} |")
    return "\n".join(lines)
