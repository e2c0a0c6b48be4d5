"""The BM25 side while indexing: tokenised in a child process during encoding, or after it (the earlier way).

    nice python benchmarks/index_sparse_overlap.py --model MODEL --corpus ../shared/data/tasks/kuake-qtr-retrieval

Each run is a fresh process that indexes the whole corpus into a new FAISS store exactly as
``care-retriever index`` does (the same writer, chunk and batch sizes), with the BM25 side on, and times:
the whole write; encoding; the time the writer waits for a chunk's BM25 tokens (background) and the
store's upsert (which tokenises in this process when the tokens were not computed beforehand, then
inserts documents and postings in one transaction). Runs alternate between the two ways, so a machine
shared with other work slows both alike; the medians are printed as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def worker(model: str, corpus: str, background: bool, store: str) -> dict[str, float]:
    from care_retriever.indexing.corpus import corpus_file, read_corpus
    from care_retriever.indexing.run import load_document_tower
    from care_retriever.indexing.settings import IndexSettings
    from care_retriever.indexing.writer import DocumentStoreWriter
    from care_retriever.sparse.background import BackgroundTokenizer

    phases = {"encode_s": 0.0, "wait_tokens_s": 0.0, "upsert_s": 0.0}

    def timed(owner: object, name: str, phase: str) -> None:
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                phases[phase] += time.perf_counter() - start

        setattr(owner, name, wrapper)

    start = time.perf_counter()
    settings = IndexSettings(model=model, corpus=Path(corpus), store=f"faiss:{store}", skip_invalid=True)
    embedder = load_document_tower(settings, "cpu")
    writer = DocumentStoreWriter(
        embedder,
        settings.store,
        encode=settings.encode,
        show_progress=False,
        sparse=True,
        background_tokenizer=background,
    )
    timed(writer, "_encode", "encode_s")
    timed(writer.store, "upsert", "upsert_s")
    timed(BackgroundTokenizer, "result", "wait_tokens_s")
    report = writer.write(read_corpus(corpus_file(Path(corpus)), skip_invalid=True))
    writer.store.close()
    return {"wall_s": time.perf_counter() - start, "documents": report.count, **phases}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--worker", choices=["background", "after"])
    parser.add_argument("--store")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.model, args.corpus, args.worker == "background", args.store)))
        return
    runs: dict[str, list[dict[str, float]]] = {"after": [], "background": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            for mode in ("after", "background"):
                store = f"{tmp}/{mode}-{i}"
                cmd = [sys.executable, __file__, "--model", args.model, "--corpus", args.corpus]
                out = subprocess.run([*cmd, "--worker", mode, "--store", store], capture_output=True, text=True)
                if out.returncode:
                    sys.exit(out.stderr)
                runs[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
                print(mode, runs[mode][-1], file=sys.stderr, flush=True)
    summary = {
        mode: {k: round(statistics.median(r[k] for r in rows), 1) for k in rows[0]} for mode, rows in runs.items()
    }
    print(json.dumps({"rounds": args.rounds, "median": summary, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
