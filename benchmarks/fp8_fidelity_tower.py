"""FP8's rounding at real depth, on the CPU: ``python -m benchmarks.fp8_fidelity --tower qwen3-4b``.

The random Qwen3-4B-shaped tower ``benchmarks.gpu_index`` times on a GPU, built here in fp32, encodes an even spread
of each dev corpus's texts three times: in fp32 (the precise answer), cast to bf16 (as a GPU run loads it), then in
bf16 with its decoder layers' Linear layers rounded as ``--dtype fp8`` rounds them
(:func:`care_retriever.runtime.fp8.emulate_fp8`: e4m3 rows, products in fp32, one rounding to bf16). Reported: the
cosine of each pass's vectors to the others', min and mean by corpus. Each pass's vectors are saved in ``--cache``
as soon as they are made (keyed by the tower, the texts and the batch size), so a stopped run resumes at the pass it
had not finished; a tower is built only where a pass is left to run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

PASSES = ("fp32", "bf16", "fp8")  # in this order: each pass casts or rounds the tower the pass before left
PAIRS = (("bf16", "fp32"), ("fp8", "fp32"), ("fp8", "bf16"))


def spread(texts: list[str], n: int) -> list[str]:
    """An even spread of ``n`` of ``texts`` in their order: the rule ``benchmarks.gpu_index`` reads its vectors by."""
    step = max(1, len(texts) // n)
    return texts[::step][:n]


def corpus_texts(folder: Path, n: int) -> list[str]:
    """What the document tower sees for an even spread of ``n`` of the documents in ``folder``."""
    from care_retriever.documents import document_text
    from care_retriever.indexing.corpus import read_corpus

    docs = list(read_corpus(folder / "corpus.jsonl", skip_invalid=True))
    return spread([document_text(doc.title, doc.text) for doc in docs], n)


def tower(vocab: list[Path], name: str, layers: int | None) -> Any:
    """``benchmarks.gpu_index``'s random tower on the CPU; ``layers``: the 4B shape at another depth."""
    from benchmarks.gpu_index_tower import QWEN3_4B, build_embedder
    from care_retriever.model.scratch import init_from_scratch

    if layers and name == "qwen3-4b":
        return init_from_scratch("base", vocab, device="cpu", document_config={**QWEN3_4B, "num_hidden_layers": layers})
    return build_embedder("cpu", vocab, name)


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def prepare(model: Any, name: str) -> int:
    """Turn the tower the pass before left into pass ``name``'s: returns the Linear layers rounded (fp8 only)."""
    import torch

    from care_retriever.runtime.fp8 import emulate_fp8

    if name == "bf16":
        model.to(torch.bfloat16)
    if name == "fp8":
        return emulate_fp8(model)
    return 0


def real_size(args: argparse.Namespace, present: dict[str, Path], argv: list[str] | None) -> int:
    from benchmarks.gpu_index_report import command_line, publish

    texts = {name: corpus_texts(folder, args.texts) for name, folder in present.items()}
    layers = args.layers
    shape = [args.tower, args.batch_size, texts] + ([layers] if layers else [])  # the first key form kept as it was
    key = hashlib.sha256(json.dumps(shape, ensure_ascii=False).encode()).hexdigest()
    cache = args.cache / key[:16]
    cache.mkdir(parents=True, exist_ok=True)
    saved = {p: cache / f"{p}.npz" for p in PASSES}
    vectors: dict[str, dict[str, np.ndarray]] = {p: dict(np.load(f)) for p, f in saved.items() if f.is_file()}
    meta_file = cache / "meta.json"  # what the passes measured beside their vectors
    meta: dict[str, Any] = json.loads(meta_file.read_text()) if meta_file.is_file() else {}
    seconds: dict[str, float] = meta.get("seconds", {})
    tokens: dict[str, float] = meta.get("tokens", {})
    rounded: int = meta.get("rounded", 0)
    described: str = meta.get("tower", args.tower)
    start = time.perf_counter()
    embedder: Any = None
    if any(p not in vectors for p in PASSES):
        from care_retriever.model.encoding import encode_texts

        vocab = [folder / "corpus.jsonl" for folder in present.values()]
        embedder = tower(vocab, args.tower, layers)
        print(f"tower built in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
        model, prompt = embedder.document_model, embedder.config.document_prompt
        described = describe(args.tower, model)
        tokens = {n: float(np.mean([len(ids) for ids in model.tokenizer(t)["input_ids"]])) for n, t in texts.items()}
        for name in PASSES:
            rounded = prepare(model, name) or rounded
            if name in vectors:
                continue
            began = time.perf_counter()
            vectors[name] = {
                corpus: encode_texts(model, rows, prompt=prompt, batch_size=args.batch_size, show_progress=True)
                for corpus, rows in texts.items()
            }
            seconds[name] = round(time.perf_counter() - began, 1)
            np.savez(saved[name], **vectors[name])
            meta_file.write_text(
                json.dumps({"seconds": seconds, "tokens": tokens, "rounded": rounded, "tower": described})
            )
            print(f"{name}: {seconds[name]:.0f} s", file=sys.stderr, flush=True)
    result = {
        "tower": described,
        "texts": {n: len(t) for n, t in texts.items()},
        "tokens_per_text": {n: round(v, 1) for n, v in tokens.items()},
        "linear_layers_rounded": rounded,
        "seconds": seconds,
        "cosine": {
            f"{a} vs {b}": {
                corpus: {"min": float(c.min()), "mean": float(c.mean())}
                for corpus in texts
                for c in [cosine(vectors[a][corpus], vectors[b][corpus])]
            }
            for a, b in PAIRS
        },
        "command": command_line("fp8_fidelity", argv),
    }
    text = markdown(result)
    section = f"fp8-real-size-{layers}-layers" if layers else "fp8-real-size"  # a depth curve: one section a depth
    publish(result, text, args.docs, section, write=not args.no_write)
    return 0


def describe(tower: str, model: Any) -> str:
    config = model[0].auto_model.config
    params = sum(p.numel() for p in model.parameters()) / 1e9
    return f"{tower} (random; {config.num_hidden_layers} layers, {config.hidden_size} wide, {params:.2f}B parameters)"


def markdown(result: dict[str, Any]) -> str:
    import torch

    tower = result["tower"]
    pairs = list(result["cosine"])
    lines = [
        f"### fp8 fidelity, random tower (CPU emulation): {tower}, {time.strftime('%Y-%m-%d %H:%M')}",
        "",
        f"Command: `{result['command']}` (torch {torch.__version__}, {torch.get_num_threads()} threads). "
        f"{result['linear_layers_rounded'] or 'The'} Linear layers rounded (weights and activations, e4m3 rowwise, "
        "products in fp32, one rounding to bf16). Seconds a pass: "
        + ", ".join(f"{k} {v:,.0f}" for k, v in result["seconds"].items())
        + ".",
        "",
        "| corpus | texts | tokens/text | " + " | ".join(f"{p}: min / mean cosine" for p in pairs) + " |",
        "|---|---|---|" + "---|" * len(pairs),
    ]
    for corpus, n in result["texts"].items():
        cells = [f"{result['cosine'][p][corpus]['min']:.5f} / {result['cosine'][p][corpus]['mean']:.5f}" for p in pairs]
        lines.append(f"| {corpus} | {n} | {result['tokens_per_text'].get(corpus, '')} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
