"""Section (e) of docs/benchmarks.md: `care-retriever bench` on the base-preset model.

Runs the command itself (asymmetric, small symmetric and symmetric LLM paths in one run; FAISS exact,
FAISS HNSW and Qdrant local search; peak memory of query-only vs both-tower processes) and embeds
its Markdown table and plot. Random weights: speed and memory only, no accuracy.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from benchmarks.core_common import CLI, REPO, model_dir

OUT = REPO / "benchmarks" / "results" / "bench"


def run(
    preset: str = "base", n_queries: int = 64, index_docs: int = 32, sizes: tuple[int, ...] = (10_000, 50_000)
) -> tuple[str, bool]:
    model = model_dir(preset)
    cmd = [
        *CLI,
        "bench",
        "--model",
        str(model),
        "--out",
        str(OUT),
        "--n-queries",
        str(n_queries),
        "--index-docs",
        str(index_docs),
        "--search-queries",
        "200",
        "--search-sizes",
        *map(str, sizes),
    ]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    table = (OUT / "bench.md").read_text(encoding="utf-8").strip()
    table = table.replace(str(model), model.name)
    text = (
        f"### (e) `care-retriever bench` ({preset} preset, random weights)\n\n"
        f"`care-retriever bench --model {model.name} --n-queries {n_queries} --index-docs {index_docs} "
        f"--search-sizes {' '.join(map(str, sizes))}`; full output in `benchmarks/results/bench/bench.json`. Search "
        "latency is one query per call through the store's `search` (documents fetched from the docstore "
        "included) on clustered synthetic unit vectors of the model's width, queried with noisy copies of "
        "corpus vectors (real embeddings have near neighbours; uniform random ones do not); HNSW recall@10 "
        "is against exact search on the same vectors.\n\n"
        f"{table}\n\n![query speed](bench/bench.png)\n"
    )
    return text, True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="base")
    args = parser.parse_args()
    text, _ = run(args.preset)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
