"""Task folders: loading and validating retrieval, rerank and STS tasks.

The type of a task is read from its folder, so one ``--task`` flag takes any of them:

- retrieval: a BEIR folder (``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``, graded scores
  allowed);
- rerank: MTEB rows ``{"query", "positive": [...], "negative": [...]}`` in ``<split>.jsonl``;
- STS: rows ``{"sentence1", "sentence2", "score"}`` in ``<split>.jsonl``.

An optional ``task.json`` beside the data overrides the name, the query instruction and the
relevance level of binary metrics. Every malformed input raises :class:`InputError` naming the file
and line, so a user fixes their data instead of reading a traceback.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from care_retriever.documents import document_text, iter_jsonl
from care_retriever.errors import InputError, at
from care_retriever.model.towers.prompts import TASK_INSTRUCTIONS

TaskType = Literal["retrieval", "rerank", "sts"]
TASK_TYPES: tuple[TaskType, ...] = ("retrieval", "rerank", "sts")
TASK_META = "task.json"

# Query instructions of the paper's Table 8, one per task type (the one table: care_retriever/model/towers/prompts.py).
INSTRUCTIONS: dict[str, str] = {kind: TASK_INSTRUCTIONS[kind] for kind in TASK_TYPES}


def instruction_for(model: Any, instruction: str | None) -> str | None:
    """The task's query instruction where ``model``'s query prompt has an instruction slot, else None.

    An instruction given to a query tower without one is an error (it would be silently dropped), so
    evaluation, which always knows the task's instruction, passes it only to towers that take one.
    """
    return instruction if getattr(model, "takes_instruction", True) else None


# Binary metrics (Recall, MRR, MAP) count a graded judgement as relevant from this level on. KUAKE-QTR
# grades 0..3 and its README counts >= 2 as relevant; other tasks use the pytrec_eval default of 1.
KNOWN_RELEVANCE_LEVELS: dict[str, int] = {"kuake-qtr-retrieval": 2}


@dataclass
class RetrievalTask:
    """A BEIR task. ``corpus`` keeps empty documents: evaluation encodes them, it does not drop them."""

    name: str
    path: Path
    corpus_ids: list[str]
    corpus_texts: list[str]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]
    instruction: str
    relevance_level: int = 1
    type: TaskType = "retrieval"

    @property
    def query_ids(self) -> list[str]:
        """Queries that have judgements, in file order (BEIR and MTEB score only those)."""
        return [q for q in self.queries if q in self.qrels]


@dataclass
class RerankRow:
    query: str
    positive: list[str]
    negative: list[str]


@dataclass
class RerankTask:
    name: str
    path: Path
    rows: list[RerankRow]
    instruction: str
    type: TaskType = "rerank"


@dataclass
class STSTask:
    name: str
    path: Path
    sentence1: list[str]
    sentence2: list[str]
    scores: list[float]
    instruction: str
    type: TaskType = "sts"


Task = RetrievalTask | RerankTask | STSTask


@dataclass
class TaskMeta:
    """Optional ``task.json``: what a folder's data cannot say about itself."""

    name: str | None = None
    type: str | None = None
    instruction: str | None = None
    relevance_level: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------- reading helpers
def _str_field(row: dict[str, Any], key: str, path: Path, lineno: int, *, allow_empty: bool = True) -> str:
    if key not in row:
        raise InputError(f'{at(path, lineno)}: missing field "{key}"')
    value = row[key]
    if value is None and allow_empty:
        return ""
    if not isinstance(value, str):
        raise InputError(f'{at(path, lineno)}: "{key}" must be a string, got {type(value).__name__}')
    if not allow_empty and not value.strip():
        raise InputError(f'{at(path, lineno)}: empty "{key}"')
    return value


def _id_field(row: dict[str, Any], path: Path, lineno: int) -> str:
    value = row.get("_id", row.get("id"))
    if value is None or isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip():
        raise InputError(f'{at(path, lineno)}: missing or invalid id ("_id" or "id")')
    return str(value)


def _require(path: Path, what: str) -> Path:
    if not path.is_file():
        raise InputError(f"{path}: missing {what}")
    return path


def read_meta(folder: Path) -> TaskMeta:
    path = folder / TASK_META
    if not path.is_file():
        return TaskMeta()
    try:
        data = json.loads(path.read_text("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: invalid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object")
    known = {"name", "type", "instruction", "relevance_level"}
    meta = TaskMeta(
        **{k: v for k, v in data.items() if k in known},
        extra={k: v for k, v in data.items() if k not in known},
    )
    if meta.type is not None and meta.type not in TASK_TYPES:
        raise InputError(f"{path}: unknown type {meta.type!r}; expected one of {list(TASK_TYPES)}")
    if meta.relevance_level is not None and (not isinstance(meta.relevance_level, int) or meta.relevance_level < 1):
        raise InputError(f"{path}: relevance_level must be an integer >= 1")
    if meta.instruction is not None and not isinstance(meta.instruction, str):
        raise InputError(f"{path}: instruction must be a string")
    return meta


# ---------------------------------------------------------------------- detection
def _rows_file(folder: Path, split: str) -> Path | None:
    for name in (f"{split}.jsonl", "data.jsonl"):
        if (folder / name).is_file():
            return folder / name
    jsonls = sorted(p for p in folder.glob("*.jsonl") if p.name not in {"corpus.jsonl", "queries.jsonl"})
    return jsonls[0] if len(jsonls) == 1 else None


def detect_type(path: Path, split: str = "test") -> tuple[TaskType, Path]:
    """The task type of ``path`` (a folder or a rows file) and the file or folder holding its data."""
    if path.is_dir():
        meta = read_meta(path)
        if (path / "corpus.jsonl").exists() or (path / "queries.jsonl").exists() or (path / "qrels").exists():
            return "retrieval", path
        rows = _rows_file(path, split)
        if rows is None:
            raise InputError(
                f"{path}: not a task folder: expected corpus.jsonl + queries.jsonl + qrels/{split}.tsv "
                f"(retrieval) or {split}.jsonl with rerank or STS rows"
            )
        if meta.type in ("rerank", "sts"):
            return meta.type, rows  # type: ignore[return-value]
        return _type_of_rows(rows), rows
    if path.is_file():
        return _type_of_rows(path), path
    raise InputError(f"task not found: {path}")


def _type_of_rows(path: Path) -> TaskType:
    for lineno, row in iter_jsonl(path):
        if {"query", "positive"} <= row.keys():
            return "rerank"
        if {"sentence1", "sentence2"} <= row.keys():
            return "sts"
        raise InputError(
            f"{at(path, lineno)}: cannot tell the task type: expected rerank rows "
            "{query, positive, negative} or STS rows {sentence1, sentence2, score}"
        )
    raise InputError(f"{path}: empty task file (no rows)")


# ---------------------------------------------------------------------- loaders
def load_task(path: str | Path, *, split: str = "test", instruction: str | None = None) -> Task:
    """Load the task at ``path``; ``instruction`` overrides the per-type default and ``task.json``."""
    path = Path(path)
    kind, data = detect_type(path, split)
    folder = path if path.is_dir() else path.parent
    meta = read_meta(folder) if path.is_dir() else TaskMeta()
    name = meta.name or (path.name if path.is_dir() else path.stem)
    instr = instruction or meta.instruction or INSTRUCTIONS[kind]
    if kind == "retrieval":
        level = meta.relevance_level or KNOWN_RELEVANCE_LEVELS.get(name, 1)
        return load_retrieval(data, name=name, split=split, instruction=instr, relevance_level=level)
    if kind == "rerank":
        return load_rerank(data, name=name, instruction=instr)
    return load_sts(data, name=name, instruction=instr)


def load_retrieval(
    folder: Path,
    *,
    name: str,
    split: str = "test",
    instruction: str = INSTRUCTIONS["retrieval"],
    relevance_level: int = 1,
) -> RetrievalTask:
    corpus_path = _require(folder / "corpus.jsonl", "corpus.jsonl (BEIR retrieval folder)")
    queries_path = _require(folder / "queries.jsonl", "queries.jsonl (BEIR retrieval folder)")
    qrels_path = _require(folder / "qrels" / f"{split}.tsv", f"qrels/{split}.tsv (BEIR retrieval folder)")
    corpus_ids: list[str] = []
    corpus_texts: list[str] = []
    seen: set[str] = set()
    for lineno, row in iter_jsonl(corpus_path):
        doc_id = _id_field(row, corpus_path, lineno)
        if doc_id in seen:
            raise InputError(f"{at(corpus_path, lineno)}: duplicate document id {doc_id!r}")
        seen.add(doc_id)
        text = _str_field(row, "text", corpus_path, lineno)
        title = row.get("title") or ""
        if not isinstance(title, str):
            raise InputError(f'{at(corpus_path, lineno)}: "title" must be a string')
        corpus_ids.append(doc_id)
        corpus_texts.append(document_text(title, text))  # what the index writer embeds
    if not corpus_ids:
        raise InputError(f"{corpus_path}: empty corpus (no documents)")
    queries: dict[str, str] = {}
    for lineno, row in iter_jsonl(queries_path):
        qid = _id_field(row, queries_path, lineno)
        if qid in queries:
            raise InputError(f"{at(queries_path, lineno)}: duplicate query id {qid!r}")
        queries[qid] = _str_field(row, "text", queries_path, lineno, allow_empty=False)
    if not queries:
        raise InputError(f"{queries_path}: empty query set (no queries)")
    qrels = read_qrels(qrels_path, set(queries), seen)
    task = RetrievalTask(name, folder, corpus_ids, corpus_texts, queries, qrels, instruction, relevance_level)
    if not task.query_ids:
        raise InputError(f"{qrels_path}: empty query set (no judged query appears in {queries_path.name})")
    return task


def read_qrels(path: Path, query_ids: set[str], doc_ids: set[str]) -> dict[str, dict[str, int]]:
    """BEIR qrels: ``query-id<TAB>corpus-id<TAB>score`` with an optional header; scores are integers."""
    qrels: dict[str, dict[str, int]] = {}
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as exc:
                raise InputError(f"{at(path, lineno)}: not valid UTF-8 (byte {exc.start})") from exc
            if not line.strip():
                continue
            parts = line.split("\t")
            if len(parts) == 4:  # TREC qrels: qid 0 docid score
                parts = [parts[0], parts[2], parts[3]]
            if len(parts) != 3:
                raise InputError(f"{at(path, lineno)}: expected 3 tab-separated fields (query-id, corpus-id, score)")
            qid, did, score = (p.strip() for p in parts)
            if lineno == 1 and not _is_int(score):
                continue  # header
            if not _is_int(score):
                raise InputError(f"{at(path, lineno)}: score {score!r} is not an integer")
            if qid not in query_ids:
                raise InputError(f"{at(path, lineno)}: unknown query id {qid!r} (not in queries.jsonl)")
            if did not in doc_ids:
                raise InputError(f"{at(path, lineno)}: unknown corpus id {did!r} (not in corpus.jsonl)")
            qrels.setdefault(qid, {})[did] = int(score)
    if not qrels:
        raise InputError(f"{path}: no judgements (empty qrels)")
    return qrels


def _is_int(value: str) -> bool:
    try:
        int(value)
    except ValueError:
        return False
    return True


def _str_list(row: dict[str, Any], key: str, path: Path, lineno: int) -> list[str]:
    value = row.get(key, [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InputError(f'{at(path, lineno)}: "{key}" must be a list of strings')
    return value


def load_rerank(path: Path, *, name: str, instruction: str = INSTRUCTIONS["rerank"]) -> RerankTask:
    rows: list[RerankRow] = []
    for lineno, row in iter_jsonl(path):
        query = _str_field(row, "query", path, lineno, allow_empty=False)
        positive = _str_list(row, "positive", path, lineno)
        negative = _str_list(row, "negative", path, lineno)
        if not positive:
            raise InputError(f'{at(path, lineno)}: no "positive" candidates (a rerank row needs at least one)')
        rows.append(RerankRow(query, positive, negative))
    if not rows:
        raise InputError(f"{path}: empty query set (no rerank rows)")
    return RerankTask(name, path, rows, instruction)


def load_sts(path: Path, *, name: str, instruction: str = INSTRUCTIONS["sts"]) -> STSTask:
    s1: list[str] = []
    s2: list[str] = []
    scores: list[float] = []
    for lineno, row in iter_jsonl(path):
        s1.append(_str_field(row, "sentence1", path, lineno))
        s2.append(_str_field(row, "sentence2", path, lineno))
        if "score" not in row:
            raise InputError(f'{at(path, lineno)}: missing field "score"')
        score = row["score"]
        if isinstance(score, str):
            try:
                score = float(score)
            except ValueError as exc:
                raise InputError(f"{at(path, lineno)}: score {row['score']!r} is not a number") from exc
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
            raise InputError(f"{at(path, lineno)}: score {row['score']!r} is not a number")
        scores.append(float(score))
    if not scores:
        raise InputError(f"{path}: empty STS set (no sentence pairs)")
    if len(set(scores)) < 2:
        raise InputError(f"{path}: all scores are equal; correlations are undefined")
    return STSTask(name, path, s1, s2, scores, instruction)
