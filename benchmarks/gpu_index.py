"""Indexing at full speed: ``care-retriever index`` (the writer into FAISS) vs sentence-transformers'
``encode_document`` on the same document tower and the same texts, side by side in one run.

    python -m benchmarks.gpu_index                      # writes its section of docs/gpu.md
    python -m benchmarks.gpu_index --limit 2000 --no-write --json

The tower is built here, with no hub: on CUDA a real-size random Qwen3-4B-shaped decoder (36 layers, 2,560 wide,
bf16, the ``base`` preset's 151,936-row embedding), on the CPU the ``tiny`` preset (fp32). The texts are the shared
dev corpora: kuake-qtr's page titles and im-qa's doctor answers (``$CARE_SHARED_DATA``, default /work/shared/data;
a corpus that is absent is skipped with a message; ``--corpus`` names others).

Each side runs ``--rounds`` times, alternating (the side going first alternates too, each from a collected heap),
and keeps its best round; the median of the rounds' own ratios is reported beside the best rounds' ratio. Reported
per side: docs/s, tokens/s (the texts' own tokens), padding ratio (tokens computed / own tokens), MFU (the forward
passes' FLOPs on the own tokens per second over a measured dense matmul: bf16 on a GPU, fp32 on the CPU), peak
memory (GPU: allocated by torch; CPU: resident set growth), and the device that gave them. The ``index`` side is the
writer into a fresh FAISS store (hashing, docstore and index writes included; the BM25 side off: it is not encoding)
with the command's defaults (``--max-batch-tokens auto``) and the same ``--batch-size`` as sentence-transformers.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shlex
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("CARE_SHARED_DATA") or "/work/shared/data")
CORPORA = {
    "kuake-qtr titles": SHARED / "tasks" / "kuake-qtr-retrieval",
    "im-qa answers": SHARED / "tasks" / "im-qa-retrieval",
}
DOC = REPO / "docs" / "gpu.md"
# Qwen3-4B's decoder (config.json of Qwen/Qwen3-4B): what a GPU run builds at random
QWEN3_4B = {
    "hidden_size": 2560,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 9728,
}


# ------------------------------------------------------------------ the tower
def build_embedder(device: str, vocab: list[Path], tower: str) -> Any:
    """A CARE model with random weights on ``device``: ``qwen3-4b`` (real size) or ``tiny``."""
    from care_retriever.model.towers.scratch import init_from_scratch

    if tower == "qwen3-4b":
        return init_from_scratch("base", vocab, device=device, document_config=QWEN3_4B)
    return init_from_scratch("tiny", vocab, device=device)


def flops_per_token(config: Any, mean_tokens: float) -> float:
    """Forward FLOPs of one token through a decoder: 2 x the weights it multiplies (embeddings excluded) plus the
    attention scores and values over a sequence of ``mean_tokens``."""
    hidden = config.hidden_size
    heads, kv = config.num_attention_heads, getattr(config, "num_key_value_heads", config.num_attention_heads)
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    inter, layers = config.intermediate_size, config.num_hidden_layers
    per_layer = hidden * heads * head_dim + 2 * hidden * kv * head_dim + heads * head_dim * hidden + 3 * hidden * inter
    attention = 2 * heads * head_dim * mean_tokens  # QK^T and AV, causal: half of 2 x 2 x heads x dim x length
    return layers * (2 * per_layer + 2 * attention)


def matmul_peak(device: str, dtype: Any) -> float:
    """FLOP/s of a large dense matmul on ``device`` in ``dtype`` (the best of a few)."""
    import torch

    n = 8192 if device.startswith("cuda") else 1024
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(5):
        sync(device)
        start = time.perf_counter()
        for _ in range(4):
            a @ b
        sync(device)
        best = min(best, (time.perf_counter() - start) / 4)
    return 2 * n**3 / best


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


class PeakMemory:
    """Peak memory of what runs inside: torch's allocated bytes on CUDA, resident set growth on the CPU."""

    def __init__(self, device: str) -> None:
        self.device, self.peak = device, 0

    def __enter__(self) -> PeakMemory:
        import torch

        if self.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
            self._base = torch.cuda.memory_allocated()
        else:
            import psutil  # type: ignore[import-untyped]

            self._proc = psutil.Process()
            self._base = self._proc.memory_info().rss
            self._stop = threading.Event()
            self._top = self._base
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            self._top = max(self._top, self._proc.memory_info().rss)

    def __exit__(self, *exc: object) -> None:
        import torch

        if self.device.startswith("cuda"):
            self.peak = torch.cuda.max_memory_allocated() - self._base
        else:
            self._stop.set()
            self._thread.join()
            self.peak = max(self._top, self._proc.memory_info().rss) - self._base


# ------------------------------------------------------------------ the two sides
def token_lengths(model: Any, texts: list[str], prompt: str | None) -> list[int]:
    from care_retriever.model.encoding import sequence_lengths

    lengths: list[int] = []
    for start in range(0, len(texts), 1024):
        lengths += sequence_lengths(model.preprocess(texts[start : start + 1024], prompt=prompt)).tolist()
    return lengths


def st_padding(texts: list[str], lengths: list[int], batch_size: int) -> int:
    """Tokens sentence-transformers' batches compute: sorted by characters over the whole input, padded to each
    batch's longest (its own ``_inference``)."""
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    return sum(
        len(batch) * max(lengths[i] for i in batch)
        for batch in (order[s : s + batch_size] for s in range(0, len(order), batch_size))
    )


def tower_copy(embedder: Any) -> Any:
    """A model over a fresh copy of ``embedder``'s document tower: each side sets its own forward pass up (packed,
    compiled, FP8) on a tower of its own, from the same weights."""
    import copy
    import dataclasses

    tower = embedder.tower("document")
    return embedder.with_tower("document", dataclasses.replace(tower, modules=copy.deepcopy(list(tower.modules))))


def run_st(embedder: Any, texts: list[str], batch_size: int, device: str) -> dict[str, float]:
    model = embedder.document_model
    prompt = embedder.config.document_prompt
    kwargs = {"prompt": prompt} if prompt else {}
    with PeakMemory(device) as memory:
        sync(device)
        start = time.perf_counter()
        model.encode_document(texts, batch_size=batch_size, normalize_embeddings=True, **kwargs)
        sync(device)
        seconds = time.perf_counter() - start
    return {"seconds": seconds, "peak_bytes": memory.peak}


def run_index(
    embedder: Any, docs: list[Any], batch_size: int, device: str, folder: Path, **encode: Any
) -> dict[str, Any]:
    from care_retriever.indexing.config import EncodeConfig
    from care_retriever.indexing.writer import DocumentStoreWriter

    # the BM25 side is not encoding: off, as the module docstring says (the writer's default is on)
    config = EncodeConfig(batch_size=batch_size, **encode)
    writer = DocumentStoreWriter(embedder, f"faiss:{folder}", encode=config, show_progress=False, sparse=False)
    with PeakMemory(device) as memory:
        sync(device)
        report = writer.write(docs)
        sync(device)
    writer.store.close()
    return {
        "seconds": report.seconds,
        "peak_bytes": memory.peak,
        "tokens": report.tokens,
        "padded_tokens": report.padded_tokens,
        "max_batch_tokens": writer.limits.tokens,
    }


# The sides of a corpus's rows. `index` sides: the writer with these EncodeConfig fields (``forward``, ``compile``,
# ``dtype``), each on a copy of the tower; `auto` is the command's default. sentence-transformers' sides:
# ``encode_document`` at the benchmark's batch, at its own defaults (batch 32), and at the best a user could set (its
# ``compile(dynamic=True)`` and the largest batch that fits, from ``--st-best-batch`` down, halved on out-of-memory).
INDEX_SIDES: dict[str, dict[str, str]] = {
    "index": {},
    "index padded": {"forward": "padded", "compile": "off"},
    "index padded+compiled": {"forward": "padded", "compile": "on"},
    "index packed": {"forward": "packed", "compile": "off"},
    "index packed+compiled": {"forward": "packed", "compile": "on"},
    "index fp8": {"dtype": "fp8", "compile": "on"},
}
ST_SIDES = ("encode_document", "encode_document defaults", "encode_document best")
ST_DEFAULT_BATCH = 32


def cannot_run(label: str, device: str) -> str | None:
    """Why a side does not run on ``device``, or None."""
    from care_retriever.model.fp8 import fp8_refusal

    if "fp8" in label:
        return fp8_refusal(device)
    return None


def st_best(embedder: Any, texts: list[str], batch: int, device: str) -> tuple[Any, int, float]:
    """sentence-transformers at its best settings: its own compile and the largest batch that fits (from ``batch``,
    halved on out-of-memory); returns the model, the batch and the seconds of the first (compiling) call."""
    import torch

    from care_retriever.model.encoding import OOM_ERRORS

    model = tower_copy(embedder)
    model.document_model.compile(dynamic=True)
    longest = sorted(texts, key=len)[-batch:]
    while True:
        try:
            start = time.perf_counter()
            run_st(model, longest, batch, device)  # the longest texts: the batch that fits them fits every batch
            return model, batch, time.perf_counter() - start
        except OOM_ERRORS:
            if batch <= 1:
                raise
            batch //= 2
            if device.startswith("cuda"):
                torch.cuda.empty_cache()


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
            warm = run_index(copy, docs[:batch_size], batch_size, device, work / f"{name}-{label}-warm", **encode)
            state = forward_state(copy.document_model)
            info[label] = {"forward": state.forward, "compile": state.compile, "dtype": state.dtype}
            info[label]["compile_seconds"] = round(state.compile_seconds, 2)

            def runner(r: int, copy: Any = copy, label: str = label, encode: dict[str, str] = encode) -> Any:
                return run_index(copy, docs, batch_size, device, work / f"{name}-{label}-{r}", **encode)

            runners[label] = runner
            del warm
        else:
            if label == "encode_document best":
                copy, batch, first = st_best(embedder, texts, best_batch, device)
                info[label] = {"batch": batch, "compile": "on", "compile_seconds": round(first, 2)}
            else:
                batch = ST_DEFAULT_BATCH if label == "encode_document defaults" else batch_size
                copy = embedder
                run_st(copy, texts[:batch], batch, device)  # warm-up
                info[label] = {"batch": batch, "compile": "off", "compile_seconds": 0.0}
            info[label]["padded_tokens"] = st_padding(texts, lengths, batch)

            def st_runner(r: int, copy: Any = copy, batch: int = batch) -> Any:
                return run_st(copy, texts, batch, device)

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


# ------------------------------------------------------------------ the report
def describe_device(device: str) -> str:
    import platform

    import torch

    if device.startswith("cuda"):
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, CUDA {torch.version.cuda}"
    return (
        f"CPU ({platform.processor() or platform.machine()}), {os.cpu_count()} cores, {torch.get_num_threads()} "
        f"torch threads, torch {torch.__version__}"
    )


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"### {result['device_kind']}: {result['device']}",
        "",
        f"Tower: {result['tower']} ({result['dtype']}, attention {result['attn_implementation']}). Matmul peak "
        f"measured: {result['matmul_tflops']:.3f} TFLOP/s ({result['matmul_dtype']}). {result['date']}.",
        f"Command: `{result['command']}`",
        "",
        "| corpus | docs | tokens/doc | batch | side | forward | docs/s (best) | docs/s per round | x encode_document "
        "| docs/s with compile | compile s | tokens/s | padding | MFU | peak MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        for label, side in row["sides"].items():
            head = f"| {row['corpus']} | {row['docs']:,} | {row['tokens_per_doc']} "
            batch = side.get("batch", row["batch_size"])
            if "docs_per_second" not in side:
                lines.append(f"{head}| {batch} | `{label}` | not run: {side.get('not_run')} |" + " |" * 9)
                continue
            budget = f", budget {side['max_batch_tokens']}" if side.get("max_batch_tokens") else ""
            forward = side.get("forward", "padded (sentence-transformers)")
            dtype = f", {side['dtype']}" if "fp8" in str(side.get("dtype", "")) else ""
            lines.append(
                f"{head}| {batch} | `{label}` | {forward}{dtype}, compile {side.get('compile', 'off')}{budget} "
                f"| {side['docs_per_second']:,.1f} | {', '.join(f'{v:,.1f}' for v in side['docs_per_second_rounds'])} "
                f"| {side.get('vs_encode_document', 1.0):.3f} | {side['docs_per_second_with_compile']:,.1f} "
                f"| {side.get('compile_seconds', 0.0):.1f} | {side['tokens_per_second']:,.0f} "
                f"| {side['padding_ratio']:.3f} | {side['mfu']:.2%} | {side['peak_mib']:,.1f} |"
            )
    lines.append("")
    lines += [
        f"* {row['corpus']}: `index` / `encode_document` = **{row['ratio']:.3f}** (best rounds; median of the "
        f"rounds' ratios {row['ratio_median_of_rounds']:.3f})"
        for row in result["rows"]
        if "ratio" in row
    ]
    for name in result["skipped"]:
        lines.append(f"* {name}: skipped (corpus not found)")
    return "\n".join(lines) + "\n"


def write_section(doc: Path, kind: str, text: str) -> None:
    """Replace (or add) this device kind's section of ``doc`` between its markers, keeping the others."""
    begin, end = f"<!-- gpu_index:{kind}:begin -->", f"<!-- gpu_index:{kind}:end -->"
    block = f"{begin}\n{text}{end}"
    current = doc.read_text(encoding="utf-8") if doc.is_file() else "# Indexing on GPUs\n\n"
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    if pattern.search(current):
        updated = pattern.sub(lambda _m: block, current)
    else:
        updated = current.rstrip("\n") + "\n\n" + block + "\n"
    doc.write_text(updated, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cuda | cpu (default: cuda where available)")
    parser.add_argument("--tower", default="auto", choices=["auto", "tiny", "qwen3-4b"], help="auto: by device")
    parser.add_argument("--corpus", action="append", type=Path, help="instead of the shared corpora (repeatable)")
    parser.add_argument("--limit", type=int, default=None, help="at most N documents of each corpus")
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (CPU)")
    parser.add_argument("--docs", type=Path, default=DOC, help="the doc whose section is written")
    parser.add_argument(
        "--sides",
        default="index,encode_document",
        help=f"comma-separated, or all: {', '.join([*INDEX_SIDES, *ST_SIDES])}",
    )
    parser.add_argument("--st-best-batch", type=int, default=None, help="encode_document best: from this batch down")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)

    import torch

    from care_retriever.indexing.corpus import read_corpus
    from care_retriever.model.loading import quiet_transformers

    quiet_transformers()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    tower = args.tower if args.tower != "auto" else ("qwen3-4b" if device.startswith("cuda") else "tiny")
    corpora = {p.name: p for p in args.corpus} if args.corpus else CORPORA
    present = {name: path for name, path in corpora.items() if path.exists()}
    skipped = [name for name in corpora if name not in present]
    for name in skipped:
        print(f"skipping {name}: {corpora[name]} not found (set CARE_SHARED_DATA or pass --corpus)", file=sys.stderr)
    if not present:
        print("gpu_index: no corpus found; nothing measured", file=sys.stderr)
        return 0
    loaded = {name: list(read_corpus(path, skip_invalid=True))[: args.limit] for name, path in present.items()}
    vocab = [path / "corpus.jsonl" if path.is_dir() else path for path in present.values()]
    embedder = build_embedder(device, vocab, tower)
    model = embedder.document_model
    dtype = next(model.parameters()).dtype
    matmul_dtype = dtype if device.startswith("cuda") else torch.float32
    peaks = [matmul_peak(device, matmul_dtype)]
    rows = []
    sides = [*INDEX_SIDES, *ST_SIDES] if args.sides == "all" else [s.strip() for s in args.sides.split(",")]
    unknown = sorted(set(sides) - {*INDEX_SIDES, *ST_SIDES})
    if unknown:
        parser.error(f"unknown sides {unknown}")
    best_batch = args.st_best_batch or (4 * args.batch_size if device.startswith("cuda") else args.batch_size)
    with tempfile.TemporaryDirectory(prefix="gpu-index-") as tmp:
        for name, docs in loaded.items():
            rows.append(
                measure(
                    embedder,
                    name,
                    docs,
                    args.batch_size,
                    args.rounds,
                    device,
                    peaks,
                    matmul_dtype,
                    Path(tmp),
                    sides,
                    best_batch,
                )
            )
    peak = max(peaks)
    for row in rows:
        for figures in row["sides"].values():
            if "flops_per_second" in figures:
                figures["mfu"] = round(figures.pop("flops_per_second") / peak, 4)
    config = model[0].auto_model.config
    command = "python -m benchmarks.gpu_index " + shlex.join(argv if argv is not None else sys.argv[1:])
    result: dict[str, Any] = {
        "device_kind": "cuda" if device.startswith("cuda") else "cpu",
        "device": describe_device(device),
        "tower": f"{tower} (random; {config.num_hidden_layers} layers, {config.hidden_size} wide, "
        f"{sum(p.numel() for p in model.parameters()) / 1e6:,.1f}M parameters)",
        "dtype": str(dtype).removeprefix("torch."),
        "attn_implementation": getattr(config, "_attn_implementation", None),
        "matmul_tflops": peak / 1e12,
        "matmul_dtype": str(matmul_dtype).removeprefix("torch."),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": command.strip(),
        "rows": rows,
        "skipped": skipped,
    }
    text = markdown(result)
    print(json.dumps(result, ensure_ascii=False) if args.json else text)
    if not args.no_write:
        write_section(args.docs, result["device_kind"], text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
