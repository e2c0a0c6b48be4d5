"""The measurement loop of ``benchmarks.gpu_index``: every side on one corpus, alternating for a number of rounds
from a collected heap, and the row of figures each side's best round gives."""

from __future__ import annotations

import gc
import statistics
from pathlib import Path
from typing import Any

# the sides' runs are looked up on their module at each call (a test records them there)
from benchmarks import gpu_index_sides as sides_of
from benchmarks.gpu_index_sides import INDEX_SIDES, ST_DEFAULT_BATCH, cannot_run, st_padding, token_lengths, tower_copy
from benchmarks.gpu_index_tower import flops_per_token, matmul_peak


def measure(
    embedder: Any,
    name: str,
    docs: list[Any],
    batch_size: int,
    rounds: int,
    device: str,
    peaks: list[float],
    matmul_dtype: Any,
    work: Path,
    sides: list[str] | None = None,
    best_batch: int = 2048,
) -> dict[str, Any]:
    """Every side on ``docs``, alternating for ``rounds``; ``peaks``: the matmul peaks measured so far (appended
    to). ``sides``: the labels to run (default: ``index`` and ``encode_document``)."""
    from care_retriever.model.forward import forward_state

    sides = sides or ["index", "encode_document"]
    texts = [d.embedding_text() for d in docs]
    model = embedder.document_model
    lengths = token_lengths(model, texts, embedder.config.document_prompt)
    own = sum(lengths)
    config = model[0].auto_model.config
    flops = flops_per_token(config, own / len(texts)) * own
    runners: dict[str, Any] = {}
    info: dict[str, dict[str, Any]] = {}
    for label in sides:
        reason = cannot_run(label, device)
        if reason is not None:
            info[label] = {"not_run": reason}
            continue
        if label in INDEX_SIDES:
            copy, encode = tower_copy(embedder), INDEX_SIDES[label]
            warm = sides_of.run_index(
                copy, docs[:batch_size], batch_size, device, work / f"{name}-{label}-warm", **encode
            )
            state = forward_state(copy.document_model)
            info[label] = {"forward": state.forward, "compile": state.compile, "dtype": state.dtype}
            info[label]["compile_seconds"] = round(state.compile_seconds, 2)

            def runner(r: int, copy: Any = copy, label: str = label, encode: dict[str, str] = encode) -> Any:
                return sides_of.run_index(copy, docs, batch_size, device, work / f"{name}-{label}-{r}", **encode)

            runners[label] = runner
            del warm
        else:
            if label == "encode_document best":
                copy, batch, first = sides_of.st_best(embedder, texts, best_batch, device)
                info[label] = {"batch": batch, "compile": "on", "compile_seconds": round(first, 2)}
            else:
                batch = ST_DEFAULT_BATCH if label == "encode_document defaults" else batch_size
                copy = embedder
                sides_of.run_st(copy, texts[:batch], batch, device)  # warm-up
                info[label] = {"batch": batch, "compile": "off", "compile_seconds": 0.0}
            info[label]["padded_tokens"] = st_padding(texts, lengths, batch)

            def st_runner(r: int, copy: Any = copy, batch: int = batch) -> Any:
                return sides_of.run_st(copy, texts, batch, device)

            runners[label] = st_runner
    results: dict[str, list[dict[str, Any]]] = {label: [] for label in runners}
    for r in range(rounds):  # the matmul peak measured beside each round too: the best is the machine's
        peaks.append(matmul_peak(device, matmul_dtype))
        # each side starts from a collected heap (a full collection of the process's half-million objects took
        # about 0.25 s on the CPU, and fell in whichever side crossed the threshold), and the sides take turns
        # at going first
        for label, runner in list(runners.items()) if r % 2 == 0 else list(runners.items())[::-1]:
            gc.collect()
            results[label].append(runner(r))

    def side(label: str) -> dict[str, Any]:
        runs = results.get(label)
        if not runs:
            return {**info.get(label, {}), "not_run": info.get(label, {}).get("not_run", "not asked for")}
        best = min(runs, key=lambda run: run["seconds"])
        padded = runs[-1].get("padded_tokens", info[label].get("padded_tokens", own))
        compile_seconds = float(info[label].get("compile_seconds", 0.0))
        return {
            **info[label],
            "docs_per_second": round(len(texts) / best["seconds"], 1),
            "docs_per_second_rounds": [round(len(texts) / run["seconds"], 1) for run in runs],
            # one run's docs/s with the compiling counted: the first pass of a run on a fresh process pays it
            "docs_per_second_with_compile": round(len(texts) / (best["seconds"] + compile_seconds), 1),
            "tokens_per_second": round(own / best["seconds"], 1),
            "padding_ratio": round(padded / own, 3),
            "flops_per_second": flops / best["seconds"],  # MFU: over the best matmul of the whole run (main)
            "peak_mib": round(max(run["peak_bytes"] for run in runs) / 2**20, 1),
            "max_batch_tokens": runs[-1].get("max_batch_tokens"),
        }

    row: dict[str, Any] = {
        "corpus": name,
        "docs": len(texts),
        "tokens_per_doc": round(own / len(texts), 1),
        "batch_size": batch_size,
        "sides": {label: side(label) for label in sides},
    }
    row["index"], row["encode_document"] = row["sides"].get("index"), row["sides"].get("encode_document")
    base = row["sides"].get("encode_document") or {}
    for figures in row["sides"].values():
        if "docs_per_second" in figures and base.get("docs_per_second"):
            figures["vs_encode_document"] = round(figures["docs_per_second"] / base["docs_per_second"], 3)
    if row["index"] and "docs_per_second" in row["index"] and "docs_per_second" in base:
        row["ratio"] = row["index"]["vs_encode_document"]
        # the two sides of each round compared (they ran back to back): steadier than the best rounds on a machine
        # whose load changes from round to round
        row["ratio_median_of_rounds"] = round(
            statistics.median(
                st["seconds"] / ix["seconds"]
                for st, ix in zip(results["encode_document"], results["index"], strict=True)
            ),
            3,
        )
    return row
