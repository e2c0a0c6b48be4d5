"""Run a model on a task: encode, search, score.

Dense retrieval embeds the corpus with ``embed_documents`` and the judged queries with
``embed_queries`` (with the task's instruction where the query tower takes one), then searches exactly
with a FAISS ``IndexFlatIP`` (inner product: cosine for unit vectors, the dot product a model that cuts
normalised vectors scores with) in query batches. Rerank scores each query's
candidates; STS takes the cosine of the two sentences. BM25 goes through the same steps with its
own index. Every phase is timed, so the harness reports its own overhead (everything except the
model's forward passes and the search) next to the scores.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from care_retriever.evaluation import metrics as M
from care_retriever.evaluation.tasks import RerankTask, RetrievalTask, STSTask, Task, instruction_for

SEARCH_BATCH = 1024
StsEncode = Literal["query", "document", "cross"]


@dataclass
class TaskResult:
    """One model on one task; ``to_dict`` is the ``--json`` line."""

    task: str
    type: str
    main_score: float | None
    metrics: dict[str, float]
    model: str
    seconds: float
    timing: dict[str, float] = field(default_factory=dict)
    skipped: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["seconds"] = round(self.seconds, 3)
        data["timing"] = {k: round(v, 4) for k, v in self.timing.items()}
        if self.skipped is None:
            data.pop("skipped")
        return data


class Timer:
    """Wall-clock seconds per phase; ``encode`` and ``search`` are the model's and the index's work."""

    def __init__(self, load_seconds: float = 0.0) -> None:
        """``load_seconds``: time already spent reading the task, counted as overhead."""
        self.phases: dict[str, float] = {"load": load_seconds} if load_seconds else {}
        self.start = time.perf_counter() - load_seconds
        self.cpu_start = time.process_time()

    @contextmanager
    def phase(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - t0

    def summary(self) -> dict[str, float]:
        total = time.perf_counter() - self.start
        work = self.phases.get("encode", 0.0) + self.phases.get("search", 0.0)
        overhead = max(total - work, 0.0)
        return {
            **self.phases,
            "total": total,
            # CPU seconds of all of this process's threads: on a shared machine wall time depends on
            # the neighbours, CPU time far less.
            "cpu": time.process_time() - self.cpu_start,
            "overhead": overhead,
            "overhead_fraction": overhead / total if total else 0.0,
        }


def is_lexical(model: Any) -> bool:
    return getattr(model, "kind", None) == "lexical"


def evaluate(
    model: Any,
    task: Task,
    *,
    model_name: str,
    query_batch_size: int = 64,
    doc_batch_size: int = 64,
    top_k: int = 100,
    sts_encode: StsEncode = "query",
    save_run: str | Path | None = None,
    show_progress: bool = False,
    timer: Timer | None = None,
) -> TaskResult:
    """Score ``model`` on ``task``. ``timer`` may be started earlier (to count task loading as overhead)."""
    timer = timer or Timer()
    opts: dict[str, Any] = {  # the encoding settings every task kind takes
        "query_batch_size": query_batch_size,
        "doc_batch_size": doc_batch_size,
        "show_progress": show_progress,
    }
    run: dict[str, dict[str, float]] | None = None
    if isinstance(task, RetrievalTask):
        run = _retrieval_run(model, task, timer, top_k=top_k, **opts)
        with timer.phase("metrics"):
            scores = M.retrieval_metrics(task.qrels, run, relevance_level=task.relevance_level)
        main = M.RETRIEVAL_MAIN
    elif isinstance(task, RerankTask):
        qrels, run = _rerank_run(model, task, timer, **opts)
        with timer.phase("metrics"):
            scores = M.rerank_metrics(qrels, run)
        main = M.RERANK_MAIN
    elif isinstance(task, STSTask):
        if is_lexical(model):
            return TaskResult(
                task.name,
                task.type,
                None,
                {},
                model_name,
                time.perf_counter() - timer.start,
                skipped="BM25 gives no sentence embedding; STS needs a dense model",
            )
        predicted = _sts_cosines(model, task, timer, sts_encode=sts_encode, **opts)
        with timer.phase("metrics"):
            scores = M.sts_metrics(predicted, task.scores)
        main = M.STS_MAIN
    else:  # pragma: no cover - Task is a closed union
        raise TypeError(f"unknown task {task!r}")
    if save_run is not None and run is not None:
        with timer.phase("save_run"):
            write_trec_run(run, save_run, tag=model_name)
    timing = timer.summary()
    return TaskResult(task.name, task.type, scores[main], scores, model_name, timing["total"], timing)


# ---------------------------------------------------------------------- retrieval
def _retrieval_run(
    model: Any,
    task: RetrievalTask,
    timer: Timer,
    *,
    top_k: int,
    query_batch_size: int,
    doc_batch_size: int,
    show_progress: bool,
) -> dict[str, dict[str, float]]:
    qids = task.query_ids
    texts = [task.queries[q] for q in qids]
    if getattr(model, "kind", None) == "hybrid":  # dense + bm25, fused (care_retriever.evaluation.hybrid)
        with timer.phase("encode"):
            sc, idx = model.retrieve(
                task.corpus_texts,
                texts,
                instruction=instruction_for(model, task.instruction),
                top_k=top_k,
                doc_batch_size=doc_batch_size,
                query_batch_size=query_batch_size,
                show_progress=show_progress,
                search=exact_search,
            )
    elif is_lexical(model):
        with timer.phase("encode"):
            model.index(task.corpus_texts, show_progress=show_progress)
        with timer.phase("search"):
            idx, sc = model.search(texts, top_k)
    else:
        with timer.phase("encode"):
            docs = model.embed_documents(task.corpus_texts, batch_size=doc_batch_size, show_progress=show_progress)
            queries = model.embed_queries(
                texts,
                instruction=instruction_for(model, task.instruction),
                batch_size=query_batch_size,
                show_progress=show_progress,
            )
        with timer.phase("search"):
            sc, idx = exact_search(docs, queries, top_k)
    with timer.phase("collect"):
        ids = task.corpus_ids
        return {
            qid: {ids[j]: float(s) for j, s in zip(row_idx.tolist(), row_sc.tolist(), strict=True) if j >= 0}
            for qid, row_idx, row_sc in zip(qids, idx, sc, strict=True)
        }


def exact_search(docs: np.ndarray, queries: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """Inner-product top-``k`` with FAISS ``IndexFlatIP``, queries in batches: ``(scores, indices)``."""
    import faiss

    index = faiss.IndexFlatIP(docs.shape[1])
    index.add(np.ascontiguousarray(docs, dtype=np.float32))
    k = min(top_k, docs.shape[0])
    scores = np.empty((len(queries), k), dtype=np.float32)
    indices = np.empty((len(queries), k), dtype=np.int64)
    for start in range(0, len(queries), SEARCH_BATCH):
        batch = np.ascontiguousarray(queries[start : start + SEARCH_BATCH], dtype=np.float32)
        scores[start : start + len(batch)], indices[start : start + len(batch)] = index.search(batch, k)
    return scores, indices


# ---------------------------------------------------------------------- rerank
def _rerank_ids(task: RerankTask) -> tuple[dict[str, dict[str, int]], list[list[str]]]:
    """Judgements with positives first; zero-padded ids so trec_eval's tie-break (id descending) puts
    negatives above positives on equal scores: ties never flatter a model."""
    qrels: dict[str, dict[str, int]] = {}
    cand_ids: list[list[str]] = []
    for i, row in enumerate(task.rows):
        cands = [*row.positive, *row.negative]
        ids = [f"d{j:05d}" for j in range(len(cands))]
        qrels[f"q{i}"] = {d: int(j < len(row.positive)) for j, d in enumerate(ids)}
        cand_ids.append(ids)
    return qrels, cand_ids


def _rerank_run(
    model: Any,
    task: RerankTask,
    timer: Timer,
    *,
    query_batch_size: int,
    doc_batch_size: int,
    show_progress: bool,
) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, float]]]:
    with timer.phase("collect"):
        qrels, cand_ids = _rerank_ids(task)
        unique: dict[str, int] = {}
        for row in task.rows:
            for text in (*row.positive, *row.negative):
                unique.setdefault(text, len(unique))
        texts = list(unique)
        rows_idx = [[unique[t] for t in (*row.positive, *row.negative)] for row in task.rows]
    run: dict[str, dict[str, float]] = {}
    if is_lexical(model):
        with timer.phase("encode"):
            model.index(texts)
        with timer.phase("search"):
            scores = [model.score(row.query, idx) for row, idx in zip(task.rows, rows_idx, strict=True)]
    else:
        with timer.phase("encode"):
            docs = model.embed_documents(texts, batch_size=doc_batch_size, show_progress=show_progress)
            queries = model.embed_queries(
                [r.query for r in task.rows],
                instruction=instruction_for(model, task.instruction),
                batch_size=query_batch_size,
                show_progress=show_progress,
            )
        with timer.phase("search"):
            scores = [docs[idx] @ q for q, idx in zip(queries, rows_idx, strict=True)]
    with timer.phase("collect"):
        for i, (ids, sc) in enumerate(zip(cand_ids, scores, strict=True)):
            run[f"q{i}"] = dict(zip(ids, map(float, sc), strict=True))
    return qrels, run


# ---------------------------------------------------------------------- STS
def _sts_cosines(
    model: Any,
    task: STSTask,
    timer: Timer,
    *,
    sts_encode: StsEncode,
    query_batch_size: int,
    doc_batch_size: int,
    show_progress: bool,
) -> np.ndarray:
    """Cosine of each pair. ``query``: both sentences through the query side with the STS instruction
    (sentence pairs are queries, as in the paper's synonym task); ``document``: both through the document
    side; ``cross``: sentence1 as a query, sentence2 as a document."""

    def as_query(texts: list[str]) -> np.ndarray:
        return model.embed_queries(
            texts,
            instruction=instruction_for(model, task.instruction),
            batch_size=query_batch_size,
            show_progress=show_progress,
        )

    def as_doc(texts: list[str]) -> np.ndarray:
        return model.embed_documents(texts, batch_size=doc_batch_size, show_progress=show_progress)

    with timer.phase("collect"):
        unique = list(dict.fromkeys([*task.sentence1, *task.sentence2]))
        pos = {t: i for i, t in enumerate(unique)}
        i1 = np.fromiter((pos[t] for t in task.sentence1), dtype=np.int64, count=len(task.sentence1))
        i2 = np.fromiter((pos[t] for t in task.sentence2), dtype=np.int64, count=len(task.sentence2))
    with timer.phase("encode"):
        if sts_encode == "cross":
            a, b = as_query(task.sentence1), as_doc(task.sentence2)
            i1, i2 = np.arange(len(a)), np.arange(len(b))
        else:
            a = b = as_query(unique) if sts_encode == "query" else as_doc(unique)
    with timer.phase("search"):
        return np.einsum("ij,ij->i", a[i1], b[i2])


# ---------------------------------------------------------------------- runs
def write_trec_run(run: dict[str, dict[str, float]], path: str | Path, *, tag: str) -> Path:
    """TREC run format (``qid Q0 docid rank score tag``) in trec_eval's order, so anyone can re-score it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    safe_tag = "".join(c if c.isalnum() or c in "-_.#" else "_" for c in tag) or "run"
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as fh:
            for qid, docs in run.items():
                for rank, (doc, score) in enumerate(M.trec_order(docs), start=1):
                    fh.write(f"{qid} Q0 {doc} {rank} {score:.9g} {safe_tag}\n")
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a run that cannot be written leaves no half file beside its path
        raise
    return path
