"""Core benchmark (c): document encoding throughput of the index writer while writing to FAISS vs
`SentenceTransformer.encode_document` on the same document tower. Target: >= 0.95x.

Both sides encode the same documents at the same batch size with the same weights: the writer
through `care-retriever`'s `DocumentStoreWriter` into a fresh FAISS store (hashing, SQLite docstore
and index writes included), sentence-transformers by loading the saved model folder itself
(``SentenceTransformer(dir).encode_document``, routed to the document tower). The two alternate over
several rounds and each side keeps its best round (the least disturbed by other load).
"""

from __future__ import annotations

import argparse
import sys
import time

from benchmarks.core_common import machine_line, model_dir, sample_documents, table, verdict

TARGET = 0.95


def run(preset: str = "base", n_docs: int = 48, batch_size: int = 16, rounds: int = 2) -> tuple[str, bool]:
    from sentence_transformers import SentenceTransformer

    from care_retriever.evaluation import speed
    from care_retriever.model.embedder import AsymmetricEmbedder

    folder = model_dir(preset)
    docs = sample_documents(n_docs)
    texts = [d.embedding_text() for d in docs]
    writer_side = AsymmetricEmbedder.from_pretrained(folder, load="document")
    st = SentenceTransformer(str(folder), device="cpu")
    st.encode_document(texts[:batch_size], batch_size=batch_size)  # warm-up both
    speed.indexing(writer_side, docs[:batch_size], batch_size=batch_size)
    st_rates, writer_rates = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        st.encode_document(texts, batch_size=batch_size, normalize_embeddings=True)
        st_rates.append(len(texts) / (time.perf_counter() - t0))
        writer_rates.append(speed.indexing(writer_side, docs, batch_size=batch_size))
    best_st, best_writer = max(st_rates), max(writer_rates)
    ratio = best_writer / best_st
    ok = ratio >= TARGET
    rows = [
        [
            "`SentenceTransformer.encode_document`",
            f"{best_st:.2f}",
            ", ".join(f"{r:.2f}" for r in st_rates),
            "1.000",
        ],
        [
            "`DocumentStoreWriter` -> FAISS",
            f"{best_writer:.2f}",
            ", ".join(f"{r:.2f}" for r in writer_rates),
            f"{ratio:.3f}",
        ],
    ]
    text = (
        f"### (c) Indexing throughput ({preset} preset document tower, {n_docs} docs, batch {batch_size})\n\n"
        + table(["encoder", "best docs/s", "docs/s per round", "ratio"], rows)
        + f"\n\nTarget: writer >= {TARGET}x sentence-transformers: **{verdict(ok)}** (ratio {ratio:.3f}).\n"
    )
    return text, ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="base")
    parser.add_argument("--docs", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    text, ok = run(args.preset, args.docs, rounds=args.rounds)
    print(f"Machine: {machine_line()}\n\n{text}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
