"""Converters from public raw data to task folders the evaluation harness reads.

- CBLUE KUAKE-QTR (query -> page title, graded 0..3) -> a BEIR retrieval folder (graded qrels,
  relevance level 2 for binary metrics) or MTEB rerank rows (positives: label >= 2);
- CBLUE KUAKE-QQR (query pairs, 0..2) and CHIP-STS (question pairs, 0/1) -> STS rows;
- question/answer JSONL (``{query|question, text|answer}``) -> a BEIR retrieval folder where each
  question's answer is its one relevant document.

CBLUE ships JSON arrays; JSONL copies read as well. Output folders are written to a temporary
folder and renamed into place, so a failed conversion leaves nothing half-written.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from care_retriever.errors import InputError, at
from care_retriever.evaluation.tasks import TASK_META

FORMATS = ("kuake-qtr", "kuake-qqr", "chip-sts", "qa")


def iter_records(path: str | Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(location, record)`` from a JSON array (CBLUE) or JSONL; location names file and line/entry."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"file not found: {path}")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not valid UTF-8 (byte {exc.start})") from exc
    if text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"{at(path, exc.lineno)}: invalid JSON ({exc.msg})") from exc
        for i, row in enumerate(data):
            where = f"{path}: entry {i}"
            if not isinstance(row, dict):
                raise InputError(f"{where}: expected a JSON object")
            yield where, row
        return
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{at(path, lineno)}: invalid JSON ({exc.msg})") from exc
        if not isinstance(row, dict):
            raise InputError(f"{at(path, lineno)}: expected a JSON object")
        yield at(path, lineno), row


def _text(row: dict[str, Any], keys: tuple[str, ...], where: str) -> str:
    for key in keys:
        if isinstance(row.get(key), str):
            return row[key]
    raise InputError(f"{where}: missing text field (one of {', '.join(keys)})")


def _label(row: dict[str, Any], where: str) -> int:
    value = row.get("label")
    if value is None or (isinstance(value, str) and not value.strip()):
        raise InputError(f"{where}: no label (CBLUE test files are unlabelled; convert train or dev files)")
    try:
        return int(value)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{where}: label {value!r} is not an integer") from exc


class _Output:
    """A folder written in a temp location and renamed into place on success."""

    def __init__(self, out: str | Path, force: bool) -> None:
        self.out = Path(out)
        if self.out.exists() and any(self.out.iterdir()) and not force:
            raise InputError(f"{self.out}: exists and is not empty (use --force to replace it)")
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.", dir=self.out.parent))

    def write_jsonl(self, name: str, rows: list[dict[str, Any]]) -> None:
        path = self.tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")

    def write_text(self, name: str, text: str) -> None:
        path = self.tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")

    def __enter__(self) -> _Output:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return
        if self.out.exists():
            shutil.rmtree(self.out)
        self.tmp.rename(self.out)


def _write_beir(
    out: _Output,
    corpus: dict[str, str],
    queries: dict[str, str],
    qrels: list[tuple[str, str, int]],
    meta: dict[str, Any],
) -> None:
    if not qrels:
        raise InputError("no judgements to write (empty input?)")
    out.write_jsonl("corpus.jsonl", [{"_id": i, "title": "", "text": t} for i, t in corpus.items()])
    out.write_jsonl("queries.jsonl", [{"_id": i, "text": t} for i, t in queries.items()])
    out.write_text("qrels/test.tsv", "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{s}\n" for q, d, s in qrels))
    out.write_text(TASK_META, json.dumps(meta, ensure_ascii=False, indent=2) + "\n")


def kuake_qtr(
    src: str | Path, out: str | Path, *, as_: str = "retrieval", positive_min: int = 2, force: bool = False
) -> Path:
    """KUAKE-QTR ``{query_id?, query, title, label}`` -> retrieval folder (graded) or rerank rows."""
    if as_ not in ("retrieval", "rerank"):
        raise InputError(f"--as {as_!r}: expected retrieval or rerank")
    doc_ids: dict[str, str] = {}
    query_ids: dict[str, str] = {}
    judged: dict[tuple[str, str], int] = {}
    for where, row in iter_records(src):
        query, title, label = (
            _text(row, ("query",), where),
            _text(row, ("title", "text"), where),
            _label(row, where),
        )
        if not query.strip():
            raise InputError(f"{where}: empty query")
        qid = query_ids.setdefault(query, str(row.get("query_id") or f"q{len(query_ids)}"))
        did = doc_ids.setdefault(title, f"t{len(doc_ids)}")
        judged[(qid, did)] = max(label, judged.get((qid, did), label))
    name = Path(out).name
    with _Output(out, force) as target:
        if as_ == "retrieval":
            _write_beir(
                target,
                {i: t for t, i in doc_ids.items()},
                {i: q for q, i in query_ids.items()},
                [(q, d, s) for (q, d), s in judged.items()],
                {"name": name, "type": "retrieval", "relevance_level": positive_min},
            )
        else:
            title_of = {i: t for t, i in doc_ids.items()}
            rows: dict[str, dict[str, Any]] = {}
            text_of = {i: q for q, i in query_ids.items()}
            for (qid, did), label in judged.items():
                row = rows.setdefault(qid, {"query": text_of[qid], "positive": [], "negative": []})
                row["positive" if label >= positive_min else "negative"].append(title_of[did])
            kept = [r for r in rows.values() if r["positive"] and r["negative"]]
            if not kept:
                raise InputError(f"{src}: no query has both a positive (label >= {positive_min}) and a negative")
            target.write_jsonl("test.jsonl", kept)
            target.write_text(TASK_META, json.dumps({"name": name, "type": "rerank"}) + "\n")
    return Path(out)


def sts_pairs(src: str | Path, out: str | Path, *, fields: tuple[str, str], force: bool = False) -> Path:
    """Sentence pairs with an integer label -> STS rows ``{sentence1, sentence2, score, category?}``."""
    rows = []
    for where, row in iter_records(src):
        pair = {
            "sentence1": _text(row, (fields[0],), where),
            "sentence2": _text(row, (fields[1],), where),
            "score": _label(row, where),
        }
        if isinstance(row.get("category"), str):
            pair["category"] = row["category"]
        rows.append(pair)
    if not rows:
        raise InputError(f"{src}: no sentence pairs")
    with _Output(out, force) as target:
        target.write_jsonl("test.jsonl", rows)
        target.write_text(TASK_META, json.dumps({"name": Path(out).name, "type": "sts"}) + "\n")
    return Path(out)


def kuake_qqr(src: str | Path, out: str | Path, *, force: bool = False) -> Path:
    """KUAKE-QQR ``{query1, query2, label 0..2}`` -> STS rows."""
    return sts_pairs(src, out, fields=("query1", "query2"), force=force)


def chip_sts(src: str | Path, out: str | Path, *, force: bool = False) -> Path:
    """CHIP-STS ``{text1, text2, label 0/1, category}`` -> STS rows."""
    return sts_pairs(src, out, fields=("text1", "text2"), force=force)


def qa_jsonl(src: str | Path, out: str | Path, *, with_description: bool = False, force: bool = False) -> Path:
    """Question/answer rows -> retrieval folder: answers are documents, each question judged on its own."""
    doc_ids: dict[str, str] = {}
    query_ids: dict[str, str] = {}
    qrels: dict[tuple[str, str], int] = {}
    for where, row in iter_records(src):
        question = _text(row, ("query", "question", "title"), where)
        if with_description and isinstance(row.get("description"), str) and row["description"].strip():
            question = f"{question}\n{row['description']}"
        answer = _text(row, ("text", "answer", "response"), where)
        if not question.strip():
            raise InputError(f"{where}: empty question")
        if not answer.strip():
            raise InputError(f"{where}: empty answer")
        qid = query_ids.setdefault(question, f"q{len(query_ids)}")
        did = doc_ids.setdefault(answer, f"a{len(doc_ids)}")
        qrels[(qid, did)] = 1
    with _Output(out, force) as target:
        _write_beir(
            target,
            {i: t for t, i in doc_ids.items()},
            {i: q for q, i in query_ids.items()},
            [(q, d, s) for (q, d), s in qrels.items()],
            {"name": Path(out).name, "type": "retrieval"},
        )
    return Path(out)


def convert(
    fmt: str,
    src: str | Path,
    out: str | Path,
    *,
    as_: str = "retrieval",
    force: bool = False,
    with_description: bool = False,
) -> Path:
    """Dispatch on ``fmt`` (one of :data:`FORMATS`)."""
    if fmt == "kuake-qtr":
        return kuake_qtr(src, out, as_=as_, force=force)
    if fmt == "kuake-qqr":
        return kuake_qqr(src, out, force=force)
    if fmt == "chip-sts":
        return chip_sts(src, out, force=force)
    if fmt == "qa":
        return qa_jsonl(src, out, with_description=with_description, force=force)
    raise InputError(f"unknown format {fmt!r}; expected one of {list(FORMATS)}")
