"""Indexing at full speed: ``care-retriever index`` (the writer into FAISS) vs sentence-transformers'
``encode_document`` on the same document tower and the same texts, side by side in one run.

    python -m benchmarks.gpu_index                      # writes its section of benchmarks/results/gpu.md
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
import json
import os
import re
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.gpu_index_measure import measure
from benchmarks.gpu_index_report import describe_device, markdown, write_section
from benchmarks.gpu_index_sides import INDEX_SIDES, ST_DEFAULT_BATCH, ST_SIDES, run_index, run_st
from benchmarks.gpu_index_tower import QWEN3_4B, build_embedder, flops_per_token, matmul_peak

# the script's face: what other scripts and the tests take from it, wherever it is defined
__all__ = [
    "DOC",
    "INDEX_SIDES",
    "QWEN3_4B",
    "ST_DEFAULT_BATCH",
    "ST_SIDES",
    "describe_device",
    "flops_per_token",
    "main",
    "markdown",
    "measure",
    "run_index",
    "run_st",
    "write_section",
]

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("CARE_SHARED_DATA") or "/work/shared/data")
CORPORA = {
    "kuake-qtr titles": SHARED / "tasks" / "kuake-qtr-retrieval",
    "im-qa answers": SHARED / "tasks" / "im-qa-retrieval",
}
DOC = REPO / "benchmarks" / "results" / "gpu.md"


def finished(head: dict[str, Any], rows: list[dict[str, Any]], peak: float) -> dict[str, Any]:
    """The run's result from the rows measured so far: each side's MFU over the best matmul of the run."""
    import copy

    rows = copy.deepcopy(rows)
    for row in rows:
        for figures in row["sides"].values():
            if "flops_per_second" in figures:
                figures["mfu"] = round(figures.pop("flops_per_second") / peak, 4)
    return {**head, "matmul_tflops": peak / 1e12, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cuda | cpu (default: cuda where available)")
    parser.add_argument("--tower", default="auto", choices=["auto", "tiny", "qwen3-4b"], help="auto: by device")
    parser.add_argument("--corpus", action="append", type=Path, help="instead of the shared corpora (repeatable)")
    parser.add_argument("--limit", type=int, default=None, help="at most N documents of each corpus")
    parser.add_argument(
        "--only",
        action="append",
        default=None,
        help="measure only this corpus (repeatable, in this order; the tokenizer still trains on every corpus "
        "found, so token counts match a full run); the doc's section is then this corpus's own",
    )
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
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="after its timed run, run each side once more under torch.profiler over an even spread of N texts and "
        "report where its time goes (benchmarks/gpu_profile.py)",
    )
    parser.add_argument("--profile-traces", type=Path, default=None, help="write the profiles' Chrome traces here")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)

    import torch

    from care_retriever.indexing.corpus import read_corpus
    from care_retriever.model.towers.loading import quiet_transformers

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
    vocab = [path / "corpus.jsonl" if path.is_dir() else path for path in present.values()]
    if args.only:
        missing = [name for name in args.only if name not in present]
        if missing:
            parser.error(f"--only {missing}: not among the corpora found ({', '.join(present)})")
        present = {name: present[name] for name in args.only}
    loaded = {name: list(read_corpus(path, skip_invalid=True))[: args.limit] for name, path in present.items()}
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
    config = model[0].auto_model.config
    command = "python -m benchmarks.gpu_index " + shlex.join(argv if argv is not None else sys.argv[1:])
    kind = "cuda" if device.startswith("cuda") else "cpu"
    section = kind + "".join(f"-{re.sub(r'[^a-z0-9]+', '-', name.lower()).strip('-')}" for name in args.only or [])
    head: dict[str, Any] = {
        "device_kind": kind,
        "device": describe_device(device),
        "tower": f"{tower} (random; {config.num_hidden_layers} layers, {config.hidden_size} wide, "
        f"{sum(p.numel() for p in model.parameters()) / 1e6:,.1f}M parameters)",
        "dtype": str(dtype).removeprefix("torch."),
        "attn_implementation": getattr(config, "_attn_implementation", None),
        "matmul_dtype": str(matmul_dtype).removeprefix("torch."),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": command.strip(),
        "skipped": skipped,
    }
    result: dict[str, Any] = {}
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
                    profile=args.profile,
                    traces=args.profile_traces,
                )
            )
            # the section is written after each corpus: a run stopped by its time limit keeps the corpora it did
            result = finished(head, rows, max(peaks))
            if not args.no_write:
                write_section(args.docs, section, markdown(result))
    print(json.dumps(result, ensure_ascii=False) if args.json else markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
