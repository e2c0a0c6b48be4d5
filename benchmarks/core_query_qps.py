"""Core benchmark (d): query throughput of the asymmetric model (BERT query tower) vs encoding the
same queries with the document tower (the symmetric LLM path), at base sizes, batch 1 and 32.

Both paths go through the product's API on the same query texts: `embed_queries` of the CARE model,
and `embed_queries` of ``DIR#document`` (the document tower on the query side, with the
Qwen3-Embedding instruction prompt an LLM embedder uses). The paper's claim is the ratio: query cost
of a small encoder, whatever the document tower's size.
"""

from __future__ import annotations

import argparse
import sys

from benchmarks.core_common import machine_line, model_dir, sample_queries, table


def run(preset: str = "base", n_queries: int = 64) -> tuple[str, bool]:
    from care_retriever.evaluation import speed
    from care_retriever.model.baselines import load_embedder

    folder = model_dir(preset)
    queries = sample_queries(n_queries)
    results = {}
    for label, name in (
        ("asymmetric (query tower)", str(folder)),
        ("symmetric LLM (document tower)", f"{folder}#document"),
    ):
        embedder = load_embedder(name, load="query") if "#" not in name else load_embedder(name)
        results[label] = {b: speed.query_encoding(embedder, queries, b) for b in (1, 32)}
        del embedder
    asym, llm = results["asymmetric (query tower)"], results["symmetric LLM (document tower)"]
    rows = []
    for label, res in results.items():
        rows.append(
            [
                label,
                f"{res[1].per_second:.2f}",
                f"{res[1].p50_ms:.1f}",
                f"{res[1].p99_ms:.1f}",
                f"{res[32].per_second:.2f}",
                f"{res[32].p50_ms:.0f}",
            ]
        )
    speedup1 = asym[1].per_second / llm[1].per_second
    speedup32 = asym[32].per_second / llm[32].per_second
    text = (
        f"### (d) Query QPS: asymmetric vs symmetric LLM path ({preset} preset, {n_queries} queries)\n\n"
        + table(["query encoder", "batch 1 q/s", "p50 ms", "p99 ms", "batch 32 q/s", "p50 ms per batch"], rows)
        + f"\n\nAsymmetric / symmetric-LLM query throughput: **{speedup1:.1f}x** at batch 1, "
        f"**{speedup32:.1f}x** at batch 32.\n"
    )
    return text, speedup1 > 1 and speedup32 > 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="base")
    parser.add_argument("--queries", type=int, default=64)
    args = parser.parse_args()
    text, ok = run(args.preset, args.queries)
    print(f"Machine: {machine_line()}\n\n{text}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
