"""Core benchmark (b): single-query `embed_queries` latency vs the raw forward pass of the same query
tower on the same tokenised input. Target: median ratio <= 1.15.

For each query the two are timed back to back (raw forward, then `embed_queries`), in many rounds,
so a neighbour's load on a shared machine hits both sides alike. "Raw forward" is the Hugging Face
model call alone (``auto_model(**features)`` under ``torch.inference_mode``) on features tokenised
once beforehand; `embed_queries` adds everything the product does per query: input checks,
tokenisation, pooling, normalisation, conversion to numpy.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from benchmarks.core_common import machine_line, model_dir, sample_queries, table, verdict

TARGET = 1.15


def run(preset: str = "base", n_queries: int = 40, rounds: int = 5) -> tuple[str, bool]:
    import torch

    from care_retriever.model.embedder import AsymmetricEmbedder

    embedder = AsymmetricEmbedder.from_pretrained(model_dir(preset), load="query")
    st = embedder.query_model
    hf = embedder.query_modules[0].auto_model
    prompt = embedder.query_prompt()
    queries = sample_queries(n_queries)
    features = []
    for q in queries:
        f = st.preprocess([q], prompt=prompt)
        features.append({k: v for k, v in f.items() if isinstance(v, torch.Tensor)})

    def raw(f: dict) -> None:
        with torch.inference_mode():
            hf(**f)

    for q, f in zip(queries[:3], features[:3], strict=True):  # warm-up
        raw(f)
        embedder.embed_queries([q])
    raw_ms, api_ms, ratios = [], [], []
    for _ in range(rounds):
        for q, f in zip(queries, features, strict=True):
            t0 = time.perf_counter()
            raw(f)
            t1 = time.perf_counter()
            embedder.embed_queries([q])
            t2 = time.perf_counter()
            raw_ms.append((t1 - t0) * 1000)
            api_ms.append((t2 - t1) * 1000)
            ratios.append((t2 - t1) / (t1 - t0))
    med_raw, med_api = statistics.median(raw_ms), statistics.median(api_ms)
    ratio = med_api / med_raw
    ok = ratio <= TARGET
    rows = [
        [
            "raw forward (HF model call)",
            f"{med_raw:.2f}",
            f"{statistics.quantiles(raw_ms, n=100)[98]:.2f}",
            "1.000",
        ],
        [
            "`embed_queries([q])`",
            f"{med_api:.2f}",
            f"{statistics.quantiles(api_ms, n=100)[98]:.2f}",
            f"{ratio:.3f}",
        ],
    ]
    text = (
        f"### (b) Query overhead ({preset} preset query tower, {len(raw_ms)} paired runs)\n\n"
        + table(["call", "median ms", "p99 ms", "ratio of medians"], rows)
        + f"\n\nMedian of per-pair ratios: {statistics.median(ratios):.3f}. Target: <= {TARGET}: "
        f"**{verdict(ok)}** (ratio of medians {ratio:.3f}).\n"
    )
    return text, ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="base")
    parser.add_argument("--queries", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    text, ok = run(args.preset, args.queries, args.rounds)
    print(f"Machine: {machine_line()}\n\n{text}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
