"""An LLM document tower on a CPU, in the precision ``--dtype auto`` picks against fp32 and sentence-transformers.

    python -m benchmarks.cpu_precision                      # writes its section of benchmarks/results/gpu.md
    python -m benchmarks.cpu_precision --titles 256 --answers 32 --no-write

A random Qwen3-Embedding-0.6B-shaped tower (28 layers, 1,024 wide), saved in bf16 as Qwen3 towers ship, encodes an
even spread of the kuake-qtr titles and im-qa answers three ways, side by side in one run, each side's best of
``--rounds`` (alternating):

* ``index``: the writer into a fresh FAISS store with the command's defaults (``--dtype auto``: bf16 where the CPU
  multiplies bf16 in hardware, Intel AMX; fp32 elsewhere);
* ``index --dtype fp32``: what ``auto`` picked on every CPU before;
* ``encode_document``: sentence-transformers' own loop over the tower as it loads it by default (the config's
  bf16, on any CPU).

Reported: docs/s, the ratio to ``encode_document``, and each side's document vectors against the fp32 tower's
(cosine min / mean). A random tower has no retrieval scores: the cosine says what bf16 costs, not nDCG.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

SHARED = Path(os.environ.get("CARE_SHARED_DATA") or "/work/shared/data")
CORPORA = {"kuake-qtr titles": "kuake-qtr-retrieval", "im-qa answers": "im-qa-retrieval"}
DOC = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "gpu.md"
# Qwen3-Embedding-0.6B's decoder (its config.json): a document tower a CPU can encode a corpus with
QWEN3_EMBEDDING_06B = {
    "hidden_size": 1024,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 3072,
}
SIDES = ("index", "index --dtype fp32", "encode_document")


def build_towers(vocab: list[Path], out: Path) -> tuple[Path, Path]:
    """A random query tower and the 0.6B-shaped document tower, the latter saved again in bf16 (its config then
    says ``bfloat16``, as Qwen3's does)."""
    import torch
    from transformers import AutoModel

    from care_retriever.model.scratch import build_random_towers, iter_vocab_texts

    query, document = build_random_towers("tiny", iter_vocab_texts(vocab), out, document_config=QWEN3_EMBEDDING_06B)
    AutoModel.from_pretrained(document, dtype=torch.float32).to(torch.bfloat16).save_pretrained(document)
    return query, document


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--titles", type=int, default=512, help="kuake-qtr titles (an even spread)")
    parser.add_argument("--answers", type=int, default=64, help="im-qa answers (an even spread)")
    parser.add_argument("--batch-size", type=int, default=32, help="texts a forward pass, every side")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--docs", type=Path, default=DOC)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)

    import torch

    from benchmarks.gpu_index_report import command_line, describe_device, publish
    from benchmarks.gpu_index_sides import run_index, run_st
    from care_retriever.documents import Document
    from care_retriever.indexing.corpus import read_corpus
    from care_retriever.model.embedder import AsymmetricEmbedder
    from care_retriever.model.encoding import encode_texts
    from care_retriever.model.towers.loading import quiet_transformers
    from care_retriever.runtime.device import native_cpu_bf16

    quiet_transformers()
    wanted = {"kuake-qtr titles": args.titles, "im-qa answers": args.answers}
    present = {name: SHARED / "tasks" / folder / "corpus.jsonl" for name, folder in CORPORA.items()}
    present = {name: path for name, path in present.items() if path.is_file() and wanted[name] > 0}
    if not present:
        print(f"cpu_precision: no corpus under {SHARED / 'tasks'}; nothing measured", file=sys.stderr)
        return 0
    corpora: dict[str, list[Document]] = {}
    for name, path in present.items():
        docs = list(read_corpus(path, skip_invalid=True))
        corpora[name] = docs[:: max(1, len(docs) // wanted[name])][: wanted[name]]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="cpu-precision-") as tmp:
        query, document = build_towers(list(present.values()), Path(tmp) / "towers")
        embedders = {
            "index": AsymmetricEmbedder.from_towers(str(query), str(document), device="cpu"),
            "index --dtype fp32": AsymmetricEmbedder.from_towers(str(query), str(document), device="cpu", dtype="fp32"),
        }
        auto = str(next(embedders["index"].document_model.parameters()).dtype).removeprefix("torch.")
        for name, docs in corpora.items():
            texts = [doc.embedding_text() for doc in docs]
            precise = encode_texts(embedders["index --dtype fp32"].document_model, texts, batch_size=args.batch_size)
            seconds: dict[str, list[float]] = {side: [] for side in SIDES}
            for round_ in range(args.rounds):
                for side in SIDES if round_ % 2 == 0 else SIDES[::-1]:
                    if side == "encode_document":
                        result = run_st(embedders["index"], texts, args.batch_size, "cpu")
                    else:
                        with tempfile.TemporaryDirectory(dir=tmp) as folder:
                            result = run_index(embedders[side], docs, args.batch_size, "cpu", Path(folder) / "s")
                    seconds[side].append(result["seconds"])
                    print(f"{name} | {side} | round {round_ + 1}: {result['seconds']:.1f} s", file=sys.stderr)
            best = {side: len(docs) / min(times) for side, times in seconds.items()}
            for side in SIDES:
                model = embedders["index --dtype fp32" if side == "index --dtype fp32" else "index"].document_model
                if side == "encode_document":
                    vectors = model.encode_document(texts, batch_size=args.batch_size, normalize_embeddings=True)
                else:
                    vectors = encode_texts(model, texts, batch_size=args.batch_size)
                cos = cosines(vectors, precise)
                rows.append(
                    {
                        "corpus": name,
                        "docs": len(docs),
                        "side": side,
                        "dtype": "float32" if side == "index --dtype fp32" else auto,
                        "docs_per_second": round(best[side], 2),
                        "per_round": [round(len(docs) / s, 2) for s in seconds[side]],
                        "x_encode_document": round(best[side] / best["encode_document"], 3),
                        "cosine_min": float(cos.min()),
                        "cosine_mean": float(cos.mean()),
                    }
                )
    result = {
        "device": describe_device("cpu"),
        "amx_bf16": native_cpu_bf16(),
        "torch": torch.__version__,
        "tower": "random Qwen3-Embedding-0.6B shape (28 layers, 1,024 wide), saved in bf16",
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": command_line("cpu_precision", argv),
        "rows": rows,
    }
    text = markdown(result)
    publish(result, text, args.docs, "cpu-precision", write=not args.no_write)
    return 0


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"### An LLM document tower on the CPU: {result['device']}, AMX bf16: {result['amx_bf16']}",
        "",
        f"Tower: {result['tower']}. torch {result['torch']}, {result['date']}. Command: `{result['command']}`",
        "",
        "| corpus | docs | side | dtype | docs/s (best) | docs/s per round | x encode_document "
        "| cos to fp32: min / mean |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['corpus']} | {r['docs']:,} | `{r['side']}` | {r['dtype']} | {r['docs_per_second']:,.2f} | "
            + ", ".join(f"{v:,.2f}" for v in r["per_round"])
            + f" | {r['x_encode_document']:.3f} | {r['cosine_min']:.5f} / {r['cosine_mean']:.5f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
