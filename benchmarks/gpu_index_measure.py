"""The measurement loop of ``benchmarks.gpu_index``: every side on one corpus, alternating for a number of rounds
from a collected heap, and the row of figures each side's best round gives."""

from __future__ import annotations

import gc
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

# the sides' runs are looked up on their module at each call (a test records them there)
from benchmarks import gpu_index_sides as sides_of
from benchmarks.gpu_index_sides import INDEX_SIDES, ST_DEFAULT_BATCH, cannot_run, st_padding, token_lengths, tower_copy
from benchmarks.gpu_index_tower import flops_per_token, linear_flops_per_token, matmul_peak
from benchmarks.gpu_profile import profile_run, summarize


class SideRun:
    """One side set up on its own tower copy (``model``: the embedder it runs): ``side_run(round, docs, texts)`` is
    its timed run over the corpus, ``run_on(docs, texts, tag)`` the same run over any documents (the profile's
    sample)."""

    def __init__(self, run_on: Callable[[list[Any], list[str], str], dict[str, Any]], model: Any) -> None:
        self.run_on, self.model = run_on, model

    def __call__(self, r: int, docs: list[Any], texts: list[str]) -> dict[str, Any]:
        return self.run_on(docs, texts, str(r))


def _set_up(
    embedder: Any,
    label: str,
    docs: list[Any],
    texts: list[str],
    lengths: list[int],
    batch_size: int,
    device: str,
    work: Path,
    name: str,
    best_batch: int,
) -> tuple[SideRun, dict[str, Any]]:
    """A side's tower copy, set up and warmed (its compiling measured), and what the row says of it."""
    from care_retriever.runtime.forward import forward_state

    if label in INDEX_SIDES:
        copy, encode = tower_copy(embedder), INDEX_SIDES[label]
        sides_of.run_index(copy, docs[:batch_size], batch_size, device, work / f"{name}-{label}-warm", **encode)
        state = forward_state(copy.document_model)
        info = {"forward": state.forward, "compile": state.compile, "dtype": state.dtype, "norms": state.norms}
        info["compile_seconds"] = round(state.compile_seconds, 2)

        def run_on(some: list[Any], _texts: list[str], tag: str) -> dict[str, Any]:
            return sides_of.run_index(copy, some, batch_size, device, work / f"{name}-{label}-{tag}", **encode)

        return SideRun(run_on, copy), info
    if label == "encode_document best":
        copy, batch, first = sides_of.st_best(embedder, texts, best_batch, device)
        info = {"batch": batch, "compile": "on", "compile_seconds": round(first, 2)}
    else:
        batch = ST_DEFAULT_BATCH if label == "encode_document defaults" else batch_size
        copy = embedder
        sides_of.run_st(copy, texts[:batch], batch, device)  # warm-up
        info = {"batch": batch, "compile": "off", "compile_seconds": 0.0}
    info["padded_tokens"] = st_padding(texts, lengths, batch)

    def st_run_on(_docs: list[Any], some: list[str], _tag: str) -> dict[str, Any]:
        return sides_of.run_st(copy, some, batch, device)

    return SideRun(st_run_on, copy), info


def progress(name: str, label: str, info: dict[str, Any], run: dict[str, Any], docs: int) -> None:
    """One line per timed run on stderr, as it ends: a run stopped by its time limit keeps what it measured."""
    extra = f", cosine to fp32 min {info['cosine_min']:.5f}" if "cosine_min" in info else ""
    print(
        f"[gpu_index] {name} | {label}: {docs / run['seconds']:,.1f} docs/s ({run['seconds']:.2f} s), "
        f"compile {info.get('compile', 'off')} {info.get('compile_seconds', 0.0):.1f} s, "
        f"peak {run['peak_bytes'] / 2**20:,.0f} MiB{extra}",
        file=sys.stderr,
        flush=True,
    )


def release(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


def fresh_compiler() -> None:
    """Forget what torch.compile compiled for the sides before (as a new process would): each compiled side pays
    and reports its own compiling, and the sides' graphs do not add up to dynamo's recompile limit (8 per code
    object: past it, a side would run eager while reporting compile on)."""
    import torch

    torch._dynamo.reset()


FIDELITY_DOCS = 512  # an fp32 pass of the 4B tower over 512 answers: seconds on a GPU


def fidelity_reference(embedder: Any, texts: list[str], device: str) -> dict[str, Any]:
    """The vectors each side's are compared with: the tower's weights in fp32 (a copy, let go after), padded and
    eager, over an even spread of at most :data:`FIDELITY_DOCS` of the corpus's texts. Not the bf16 tower's own:
    two bf16 runs of one random tower that batch the texts differently already differ by more than FP8's target
    (cosine min 0.993 on the CPU, at 2 to 36 layers), so each side, sentence-transformers' too, is read against
    the one precise answer."""
    import copy

    import torch

    from care_retriever.model.encoding import encode_texts

    step = max(1, len(texts) // FIDELITY_DOCS)
    sample = texts[::step][:FIDELITY_DOCS]
    prompt = embedder.config.document_prompt
    precise = copy.deepcopy(embedder.document_model).to(torch.float32)
    vectors = encode_texts(precise, sample, prompt=prompt, batch_size=64)
    del precise
    release(device)
    return {"texts": sample, "vectors": vectors, "prompt": prompt}


def fidelity(model: Any, reference: dict[str, Any], label: str) -> dict[str, float]:
    """Cosine of each document vector a side gives (``model``: the embedder it runs) to its fp32 reference vector
    (both normalised): min and mean."""
    import numpy as np

    from care_retriever.model.encoding import encode_texts

    texts, prompt = reference["texts"], reference["prompt"]
    if label in INDEX_SIDES:
        vectors = encode_texts(model.document_model, texts, prompt=prompt, batch_size=64)
    else:  # sentence-transformers' own encoding, as the side runs it
        kwargs = {"prompt": prompt} if prompt else {}
        vectors = model.document_model.encode_document(texts, batch_size=64, normalize_embeddings=True, **kwargs)
    cosines = np.sum(np.asarray(vectors, dtype=np.float32) * reference["vectors"], axis=1)
    return {"cosine_min": round(float(cosines.min()), 5), "cosine_mean": round(float(cosines.mean()), 5)}


def failure(exc: BaseException) -> str:
    """An exception in one line: its type and the first line of its message."""
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:160]}"


def profiled(
    runner: SideRun, sample: dict[str, Any], runs: list[dict[str, Any]], label: str, info: dict[str, Any], peak: float
) -> dict[str, Any]:
    """A side run once more under the profiler over ``sample`` (made in :func:`measure`): ``{"profile": the figures
    of benchmarks.gpu_profile.summarize}``, or ``{"profile_error": why}`` where the profiler failed (a machine whose
    CUPTI is not allowed, say): the side's timed figures stand either way. One line on stderr."""
    try:
        return {"profile": _profiled(runner, sample, runs, label, info, peak)}
    except Exception as exc:  # the profile is an extra: it never costs the run the sides still to measure
        why = failure(exc)
        print(f"[gpu_index] {sample['corpus']} | {label} profile failed: {why}", file=sys.stderr, flush=True)
        return {"profile_error": why}


def _profiled(
    runner: SideRun, sample: dict[str, Any], runs: list[dict[str, Any]], label: str, info: dict[str, Any], peak: float
) -> dict[str, Any]:
    import re

    texts, lengths, config, device = sample["texts"], sample["lengths"], sample["config"], sample["device"]
    trace = None
    if sample["traces"] is not None:
        sample["traces"].mkdir(parents=True, exist_ok=True)
        slug = re.sub(r"[^a-z0-9]+", "-", f"{sample['corpus']} {label}".lower()).strip("-")
        trace = sample["traces"] / f"{slug}.json.gz"
    gc.collect()
    run, breakdown = profile_run(lambda: runner.run_on(sample["docs"], texts, "profile"), device, trace)
    own = sum(lengths)
    computed = run.get("padded_tokens") or st_padding(texts, lengths, info.get("batch", len(texts)))
    figures = summarize(
        breakdown,
        texts=len(texts),
        seconds=min(r["seconds"] for r in runs) * sample["share"],
        linear_flops=linear_flops_per_token(config) * computed,
        forward_flops=flops_per_token(config, own / len(texts)) * own,
        peak=peak,
    )
    shares = ", ".join(f"{kind} {share:.0%}" for kind, share in figures["shares"].items() if share >= 0.005)
    print(
        f"[gpu_index] {sample['corpus']} | {label} profile: busy {figures['busy']:.0%}; {shares}; matmul "
        f"{figures['matmul_tflops']} TFLOP/s ({figures['matmul_of_peak']}), MFU ceiling {figures['mfu_ceiling']}",
        file=sys.stderr,
        flush=True,
    )
    return figures


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
    profile: int = 0,
    traces: Path | None = None,
) -> dict[str, Any]:
    """Every side on ``docs``, alternating for ``rounds``; ``peaks``: the matmul peaks measured so far (appended
    to). ``sides``: the labels to run (default: ``index`` and ``encode_document``). ``profile``: after its timed
    runs, each side runs once more under the profiler over an even spread of this many texts
    (:mod:`benchmarks.gpu_profile`); ``traces``: a folder for their Chrome traces."""
    sides = sides or ["index", "encode_document"]
    texts = [d.embedding_text() for d in docs]
    model = embedder.document_model
    lengths = token_lengths(model, texts, embedder.config.document_prompt)
    own = sum(lengths)
    config = model[0].auto_model.config
    flops = flops_per_token(config, own / len(texts)) * own
    runners: dict[str, Any] = {}
    info: dict[str, dict[str, Any]] = {}
    results: dict[str, list[dict[str, Any]]] = {}
    # one round: each side is set up, run and let go before the next, so that one tower copy (8 GB for the 4B
    # tower) is held at a time and each side's token budget sees the same free memory; several rounds alternate
    # the sides, so every side's copy is held throughout
    one_at_a_time = rounds == 1
    # every side's vectors against the tower's in fp32: packed, compiled and fp8 must compute the same function
    reference = fidelity_reference(embedder, texts, device)
    step = max(1, len(texts) // profile) if profile else 1
    picked = list(range(0, len(texts), step))[:profile]
    sample = {
        "docs": [docs[i] for i in picked],
        "texts": [texts[i] for i in picked],
        "lengths": [lengths[i] for i in picked],
        "share": sum(lengths[i] for i in picked) / own,  # of the corpus's tokens: scales a timed run to the sample
        "config": config,
        "device": device,
        "traces": traces,
        "corpus": name,
    }
    for label in sides:
        reason = cannot_run(label, device)
        try:
            if reason is None:
                if one_at_a_time:
                    fresh_compiler()
                set_up = _set_up(embedder, label, docs, texts, lengths, batch_size, device, work, name, best_batch)
                runner, info[label] = set_up
                info[label].update(fidelity(runner.model, reference, label))
                if one_at_a_time:
                    peaks.append(matmul_peak(device, matmul_dtype))
                    gc.collect()
                    results[label] = [runner(0, docs, texts)]
                    progress(name, label, info[label], results[label][0], len(texts))
                    if profile:
                        info[label].update(profiled(runner, sample, results[label], label, info[label], max(peaks)))
                else:
                    runners[label] = runner
        except Exception as exc:  # one side's failure (an op its compiler cannot take, say) costs that side alone
            results.pop(label, None)
            reason = f"failed: {failure(exc)}"
        finally:
            if one_at_a_time:
                set_up = runner = None  # the side's tower copy let go before the next
                release(device)
        if reason is not None:
            info[label] = {"not_run": reason}
            print(f"[gpu_index] {name} | {label}: not run: {reason}", file=sys.stderr, flush=True)
    for label in runners:
        results[label] = []
    for r in range(rounds if runners else 0):  # the matmul peak measured beside each round: the best is the machine's
        peaks.append(matmul_peak(device, matmul_dtype))
        # each side starts from a collected heap (a full collection of the process's half-million objects took
        # about 0.25 s on the CPU, and fell in whichever side crossed the threshold), and the sides take turns
        # at going first
        for label, runner in list(runners.items()) if r % 2 == 0 else list(runners.items())[::-1]:
            gc.collect()
            results[label].append(runner(r, docs, texts))
            progress(name, label, info[label], results[label][-1], len(texts))
    for label, runner in runners.items() if profile else ():
        info[label].update(profiled(runner, sample, results[label], label, info[label], max(peaks)))

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
    row["fidelity_docs"] = len(reference["texts"])
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
