"""The offline quickstart: a miniature CARE trained from scratch on the shipped sample, indexed, searched, scored.

Steps (each prints what it does):

1. Split the sample queries (``care_retriever/data/sample``) into a training part and a held-out
   part (every third query, by id order); only the training part's judgements are used to train.
2. Write the training pairs: training query -> its passages (score >= 2), and each passage's title
   -> its text (the unsupervised title/content pairs the paper also uses).
3. Train the bundled ``quickstart`` recipe (Stage 0, Stage I, Stage II on a ``mini`` model).
4. Index the 300 passages into FAISS (dense vectors and the BM25 side) with ``DocumentStoreWriter`` and
   show the hybrid (dense + BM25) top hits of a few held-out queries.
5. Score nDCG@10 on the held-out queries: the trained model (dense), BM25, and hybrid search through
   the index (``CareRetriever.search(mode="hybrid")``, the defaults of docs/hybrid.md).

Everything stays in ``OUT``: the model in ``OUT/model``, the index in ``OUT/index``, the training
run (checkpoints, logs) in ``OUT/run``.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from care_retriever.documents import document_text, iter_jsonl
from care_retriever.errors import InputError

SAMPLE_DIR = Path(__file__).resolve().parents[1] / "care_retriever" / "data" / "sample"
HELD_OUT_EVERY = 3  # every third query (by id order) is held out for the score
DEMO_QUERIES = 3


@dataclass
class Sample:
    corpus: list[dict]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]

    def doc_text(self, doc: dict) -> str:
        return document_text(doc.get("title") or "", doc["text"])


@dataclass
class QuickstartResult:
    out: Path
    model: Path
    store: str
    care_ndcg: float
    bm25_ndcg: float
    hybrid_ndcg: float
    held_out: int
    seconds: float


def sample_dir() -> Path:
    """The shipped sample, inside the installed package (falls back to the source tree)."""
    try:
        from importlib.resources import files

        path = Path(str(files("care_retriever") / "data" / "sample"))
        if (path / "corpus.jsonl").is_file():
            return path
    except (ModuleNotFoundError, TypeError):
        pass
    return SAMPLE_DIR


def load_sample(folder: Path) -> Sample:
    for name in ("corpus.jsonl", "queries.jsonl", "qrels.tsv"):
        if not (folder / name).is_file():
            raise InputError(f"sample data missing: {folder / name}")
    corpus = [row for _, row in iter_jsonl(folder / "corpus.jsonl")]
    queries = {row["_id"]: row["text"] for _, row in iter_jsonl(folder / "queries.jsonl")}
    qrels: dict[str, dict[str, int]] = {}
    for line in (folder / "qrels.tsv").read_text("utf-8").splitlines()[1:]:
        if line.strip():
            qid, did, score = line.split("\t")
            qrels.setdefault(qid, {})[did] = int(score)
    return Sample(corpus, queries, qrels)


def split_queries(sample: Sample) -> tuple[list[str], list[str]]:
    """(training ids, held-out ids): every ``HELD_OUT_EVERY``-th judged query is held out."""
    ids = sorted(q for q in sample.queries if q in sample.qrels)
    held = [q for i, q in enumerate(ids) if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1]
    held_set = set(held)
    return [q for q in ids if q not in held_set], held


def write_training_data(sample: Sample, train_ids: list[str], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    by_id = {d["_id"]: d for d in sample.corpus}
    with (folder / "query_pairs.jsonl").open("w", encoding="utf-8") as fh:
        for qid in train_ids:
            for did, score in sample.qrels[qid].items():
                if score >= 2 and did in by_id:
                    row = {"query": sample.queries[qid], "text": sample.doc_text(by_id[did])}
                    fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    with (folder / "title_pairs.jsonl").open("w", encoding="utf-8") as fh:
        for doc in sample.corpus:
            if doc.get("title"):
                fh.write(json.dumps({"query": doc["title"], "text": doc["text"]}, ensure_ascii=False) + "\n")
    with (folder / "corpus.jsonl").open("w", encoding="utf-8") as fh:
        for doc in sample.corpus:
            fh.write(json.dumps({"_id": doc["_id"], "text": sample.doc_text(doc)}, ensure_ascii=False) + "\n")
        for qid in train_ids:
            fh.write(json.dumps({"_id": qid, "text": sample.queries[qid]}, ensure_ascii=False) + "\n")


def run_quickstart(
    out: str | Path = "care-quickstart",
    *,
    force: bool = False,
    recipe: str | Path = "quickstart",
    echo: Callable[[str], None] = print,
    show_progress: bool = True,
) -> QuickstartResult:
    from care_retriever.indexing.corpus import read_corpus
    from care_retriever.indexing.writer import DocumentStoreWriter
    from care_retriever.model.embedder import AsymmetricEmbedder
    from care_retriever.search.retriever import CareRetriever
    from care_retriever.stores import open_store
    from care_retriever.training.quiet import quiet_logger
    from care_retriever.training.recipe import load_recipe
    from care_retriever.training.runner import run_recipe
    from care_retriever.training.scoring import bm25_run, dense_run, ndcg_at_10

    start = time.perf_counter()
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        if not force:
            raise InputError(f"{out}: exists and is not empty (use --force to rebuild it, or --out another folder)")
        shutil.rmtree(out)
    folder = sample_dir()
    sample = load_sample(folder)
    train_ids, held_ids = split_queries(sample)
    echo(
        f"[1/5] Sample: {len(sample.corpus)} passages, {len(sample.queries)} queries; "
        f"training on {len(train_ids)} queries, {len(held_ids)} held out for the score (every {HELD_OUT_EVERY}rd)"
    )
    data = out / "data"
    write_training_data(sample, train_ids, data)
    spec = load_recipe(recipe)
    echo(f"[2/5] Training a '{spec.model.preset}' CARE model from scratch: " + ", ".join(s.name for s in spec.stages))
    with quiet_logger("care_retriever"):  # the stage table below says what the INFO lines would
        result = run_recipe(spec, out / "run", data, show_progress=show_progress)
    for report in result.reports:
        echo(
            f"      {report['name']:>16}: {report['steps']:>4} steps {report['seconds']:6.1f}s  "
            f"loss {report['first_loss']:.3f} -> {report['last_loss']:.3f}"
        )
    model_dir = out / "model"
    assert result.final is not None, "the quickstart trains every stage of its recipe, so the final one too"
    shutil.copytree(result.final, model_dir)
    store_spec = f"faiss:{out / 'index'}"
    echo(f"[3/5] Indexing {len(sample.corpus)} passages into {store_spec}")
    embedder = AsymmetricEmbedder.from_pretrained(model_dir)
    writer = DocumentStoreWriter(embedder, store_spec, show_progress=show_progress, sparse=True)
    writer.write(read_corpus(folder / "corpus.jsonl"), total=len(sample.corpus))
    writer.store.close()

    echo("[4/5] Hybrid (dense + BM25) top hits for held-out queries (* = judged relevant):")
    retriever = CareRetriever(open_store(store_spec), embedder)
    for qid in held_ids[:DEMO_QUERIES]:
        query = sample.queries[qid]
        echo(f"  {query}")
        for rank, hit in enumerate(retriever.search(query, top_k=3, mode="hybrid"), 1):
            mark = "*" if sample.qrels[qid].get(hit.id, 0) >= 2 else " "
            echo(f"   {mark}{rank}. {hit.score:.3f} [{hit.id}] {(hit.title or hit.text)[:40]}")

    held_qrels = {q: sample.qrels[q] for q in held_ids}
    doc_ids = [d["_id"] for d in sample.corpus]
    doc_texts = [sample.doc_text(d) for d in sample.corpus]
    query_texts = [sample.queries[q] for q in held_ids]
    care = ndcg_at_10(
        dense_run(embedder.embed_queries(query_texts), embedder.embed_documents(doc_texts), held_ids, doc_ids),
        held_qrels,
    )
    bm25 = ndcg_at_10(bm25_run(doc_texts, doc_ids, query_texts, held_ids), held_qrels)
    fused = retriever.search(query_texts, top_k=100, mode="hybrid")
    hybrid = ndcg_at_10({q: {h.id: h.score for h in hits} for q, hits in zip(held_ids, fused, strict=True)}, held_qrels)
    retriever.close()
    echo(f"[5/5] nDCG@10 on the {len(held_ids)} held-out sample queries (not used in training):")
    echo(f"      dense: CARE (this quickstart) {care:.3f}   |   BM25 (jieba + bm25s) {bm25:.3f}")
    echo(f"      hybrid: dense + BM25 through the index, fused {hybrid:.3f}")
    seconds = time.perf_counter() - start
    echo(f"Done in {seconds / 60:.1f} min. Search the index with:")
    echo(f'  care-retriever search --model {model_dir} --store {store_spec} --mode hybrid "血压高怎么办"')
    return QuickstartResult(out, model_dir, store_spec, care, bm25, hybrid, len(held_ids), seconds)
