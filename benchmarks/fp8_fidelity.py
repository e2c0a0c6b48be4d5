"""FP8 fidelity measured on the CPU: a model's scores on the dev retrieval tasks with its document tower in fp32 and
through the FP8 rounding ``--dtype fp8`` computes (weights and activations of the decoder layers' Linear layers
rounded to float8 e4m3, rowwise scaled; :func:`care_retriever.runtime.fp8.emulate_fp8`), and the cosine of each
document vector to its fp32 one.

    python -m benchmarks.fp8_fidelity --model runs/ablations-v3/seed-0/stage2   # a trained miniature
    python -m benchmarks.fp8_fidelity                                            # the tiny random tower (no model)
    python -m benchmarks.fp8_fidelity --tower qwen3-4b                           # the real-size random tower

``--tower qwen3-4b`` builds ``benchmarks.gpu_index``'s random Qwen3-4B-shaped tower (36 layers; about 16 GB in fp32)
and reads its document vectors over an even spread of each dev corpus's texts three ways: fp32, bf16 (the tower cast
as a GPU run loads it) and bf16 with the FP8 rounding: the cosine of each to the others, by corpus. A random tower
has no retrieval scores; this is the depth's share of the rounding, which the trained miniature (2 layers) cannot
show. The vectors of each pass are kept in ``--cache`` as they are made, so a stopped run resumes at the next pass.

Writes its section of benchmarks/results/gpu.md (``--no-write``: print only). The emulation rounds as the GPU does but
multiplies in fp32: it measures what FP8's rounding costs, not the GPU's accumulation order.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

SHARED = Path(os.environ.get("CARE_SHARED_DATA") or "/work/shared/data")
TASKS = ("kuake-qtr-retrieval", "im-qa-retrieval")
DOC = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "gpu.md"


def load_model(model: str | None, vocab: list[Path]) -> tuple[Any, str]:
    from care_retriever.model.embedder import AsymmetricEmbedder

    if model:
        return AsymmetricEmbedder.from_pretrained(model, device="cpu", dtype="fp32"), model
    from care_retriever.model.scratch import init_from_scratch

    return init_from_scratch("tiny", vocab, seed=0), "tiny (random weights, untrained)"


def scores(embedder: Any, tasks: dict[str, Any]) -> dict[str, float]:
    from care_retriever.evaluation.runner import evaluate

    return {name: float(evaluate(embedder, task, model_name="fp8-fidelity").main_score) for name, task in tasks.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a saved CARE model (default: the tiny random tower)")
    parser.add_argument(
        "--tower", choices=["qwen3-4b", "tiny"], default=None, help="a random tower (qwen3-4b: real size): cosines only"
    )
    parser.add_argument("--texts", type=int, default=192, help="--tower: texts a corpus (an even spread)")
    parser.add_argument(
        "--layers", type=int, default=None, help="--tower qwen3-4b: this many decoder layers (a depth curve)"
    )
    parser.add_argument("--batch-size", type=int, default=32, help="--tower: texts a forward pass")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/care-fp8-fidelity"), help="--tower: vectors kept")
    parser.add_argument("--split", default="test", help="the split the shared tasks ship (test)")
    parser.add_argument("--cosine-docs", type=int, default=4000, help="documents whose vectors are compared")
    parser.add_argument("--docs", type=Path, default=DOC)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)

    from benchmarks.gpu_index_report import command_line, publish
    from care_retriever.evaluation.tasks import load_task
    from care_retriever.model.encoding import encode_texts
    from care_retriever.model.towers.loading import quiet_transformers
    from care_retriever.runtime.fp8 import emulate_fp8

    quiet_transformers()
    present = {name: SHARED / "tasks" / name for name in TASKS if (SHARED / "tasks" / name).is_dir()}
    if not present:
        print(f"fp8_fidelity: no task under {SHARED / 'tasks'}; nothing measured", file=sys.stderr)
        return 0
    if args.tower:
        from benchmarks.fp8_fidelity_tower import real_size

        return real_size(args, present, argv)
    tasks = {name: load_task(path, split=args.split) for name, path in present.items()}
    embedder, described = load_model(args.model, [p / "corpus.jsonl" for p in present.values()])
    start = time.perf_counter()
    exact = scores(embedder, tasks)
    model = embedder.document_model
    texts = [t for task in tasks.values() for t in task.corpus_texts[: args.cosine_docs]]
    before = encode_texts(model, texts)
    layers = emulate_fp8(model)
    after = encode_texts(model, texts)
    rounded = scores(embedder, tasks)
    cosine = (before * after).sum(axis=1) / (np.linalg.norm(before, axis=1) * np.linalg.norm(after, axis=1))
    result = {
        "model": described,
        "split": args.split,
        "linear_layers_rounded": layers,
        "ndcg10_fp32": exact,
        "ndcg10_fp8": rounded,
        "delta": {k: round(rounded[k] - exact[k], 4) for k in exact},
        "cosine_min": float(cosine.min()),
        "cosine_mean": float(cosine.mean()),
        "documents_compared": len(texts),
        "seconds": round(time.perf_counter() - start, 1),
        "command": command_line("fp8_fidelity", argv),
    }
    lines = [
        f"### fp8 fidelity (CPU emulation): {described}, {args.split} split, {time.strftime('%Y-%m-%d %H:%M')}",
        "",
        f"Command: `{result['command']}`. {layers} Linear layers rounded (weights and activations, e4m3 rowwise).",
        "",
        "| task | nDCG@10 fp32 | nDCG@10 fp8 (emulated) | difference |",
        "|---|---|---|---|",
        *(f"| {k} | {exact[k]:.4f} | {rounded[k]:.4f} | {rounded[k] - exact[k]:+.4f} |" for k in exact),
        "",
        f"* Document vectors, fp8 vs fp32, over {len(texts):,} documents: cosine min {cosine.min():.5f}, "
        f"mean {cosine.mean():.5f}.",
    ]
    text = "\n".join(lines) + "\n"
    publish(result, text, args.docs, "fp8", write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
