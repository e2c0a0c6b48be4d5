"""Training data: JSONL files -> (query, positive, negatives) examples, validated row by row.

Formats (``format:`` of a recipe data set):

- ``pairs``: ``{query, text | positive (str or list), negative (str or list)?, label?}``. With a label,
  rows with ``label >= min_label`` are positives and rows with ``label <= max_negative_label`` are
  hard negatives of their query (other rows are ignored).
- ``qtr``: ``pairs`` with KUAKE-QTR defaults (positives ``label >= 2``, negatives ``label == 0``).
- ``sts``: ``{sentence1, sentence2, score}``; ``score >= min_score`` gives a query-query positive
  pair (KUAKE-QQR, CHIP-STS).
- ``qa``: ``{query, description?, text}``: the patient's question (optionally with its description)
  and the doctor's answer (IM-QA).
- ``alignment``: ``{text, side: query|document}`` (``care-retriever data alignment`` writes it).
- ``text``: plain text (one per line) or JSONL with text fields: language-model pretraining, and
  Stage I alignment texts on the side (``queries`` or ``documents``) the stage lists the set under.
- ``flag``: FlagEmbedding's fine-tuning JSONL, ``{query, pos: [str], neg: [str], prompt?, type?,
  pos_scores?, neg_scores?}`` (the CARE authors' released data is in it): one example per positive, the row's
  ``neg`` list its hard negatives (shuffled once per row, seeded by the line number: a stage that uses k of them
  takes a random k, as FlagEmbedding samples ``train_group_size - 1`` of them). ``prompt`` is the row's query
  instruction, put into the model's query prompt template in place of its default instruction
  (:func:`~care_retriever.training.row_prompts.with_row_prompts`); ``type``: see :data:`FLAG_TYPES`. Scores are
  checked and not used (FlagEmbedding uses them only with ``knowledge_distillation``); other keys (``pos_id``) are
  ignored, as FlagEmbedding does.

Why validate here: a training run that dies after an hour because of one empty text wastes the
hour; every problem is reported before the first step as ``file:line: what is wrong``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, overload

from care_retriever.documents import iter_jsonl as read_jsonl
from care_retriever.errors import InputError, at


@dataclass
class Example:
    query: str
    positive: str
    negatives: list[str] = field(default_factory=list)
    # ``flag`` rows: the row's query instruction (its ``prompt``), ``file:line`` of the row, and whether the
    # instruction also goes before the positive and negatives (FlagEmbedding's symmetric_sts/clustering rows).
    instruction: str | None = None
    where: str | None = None
    instruct_candidates: bool = False


@dataclass
class PairSet:
    """The examples of one data set; ``symmetric`` when positives are queries too (QQR, STS)."""

    name: str
    examples: list[Example]
    symmetric: bool = False
    # Alignment files carry texts without pairs: each is later paired with itself.
    extra_queries: list[str] = field(default_factory=list)
    extra_documents: list[str] = field(default_factory=list)

    def queries(self) -> list[str]:
        texts = [e.query for e in self.examples]
        if self.symmetric:
            texts += [e.positive for e in self.examples]
        return unique(texts + self.extra_queries)

    def documents(self) -> list[str]:
        texts = [] if self.symmetric else [t for e in self.examples for t in (e.positive, *e.negatives)]
        return unique(texts + self.extra_documents)


def unique(texts: list[str]) -> list[str]:
    return list(dict.fromkeys(texts))


def iter_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Rows of a training JSONL file with their line numbers; a missing or empty file is an error."""
    if not path.is_file():
        raise InputError(f"training file not found: {path}")
    seen = False
    for lineno, row in read_jsonl(path):
        seen = True
        yield lineno, row
    if not seen:
        raise InputError(f"{path}: empty file (no rows)")


@overload
def _text(row: dict[str, Any], key: str, path: Path, lineno: int, *, required: Literal[True] = True) -> str: ...
@overload
def _text(row: dict[str, Any], key: str, path: Path, lineno: int, *, required: bool) -> str | None: ...
def _text(row: dict[str, Any], key: str, path: Path, lineno: int, *, required: bool = True) -> str | None:
    value = row.get(key)
    if value is None:
        if required:
            raise InputError(f"{at(path, lineno)}: missing field {key!r}")
        return None
    if not isinstance(value, str):
        raise InputError(f"{at(path, lineno)}: {key!r} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise InputError(f"{at(path, lineno)}: empty {key!r}")
    return value


def _texts(row: dict[str, Any], key: str, path: Path, lineno: int) -> list[str]:
    value = row.get(key)
    if value is None:
        return []
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        raise InputError(f"{at(path, lineno)}: {key!r} must be a string or a list of strings")
    for item in items:
        if not isinstance(item, str):
            raise InputError(f"{at(path, lineno)}: {key!r} holds a {type(item).__name__}, expected strings")
        if not item.strip():
            raise InputError(f"{at(path, lineno)}: empty text in {key!r}")
    return items


def _number(row: dict[str, Any], key: str, path: Path, lineno: int) -> float | None:
    value = row.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{at(path, lineno)}: {key!r} must be a number")
    return float(value)


def read_pairs(
    path: Path,
    *,
    min_label: float | None = None,
    max_negative_label: float | None = None,
) -> list[Example]:
    """``pairs`` / ``qtr`` rows grouped by query: one example per positive, the query's negatives attached."""
    positives: dict[str, list[str]] = {}
    negatives: dict[str, list[str]] = {}
    for lineno, row in iter_jsonl(path):
        query = _text(row, "query", path, lineno)
        pos = _texts(row, "positive", path, lineno)
        text = _text(row, "text", path, lineno, required=False)
        neg = _texts(row, "negative", path, lineno)
        label = _number(row, "label", path, lineno)
        if text is None and not pos:
            raise InputError(f"{at(path, lineno)}: row has no positive (expected 'text' or 'positive')")
        texts = ([text] if text is not None else []) + pos
        if label is not None and min_label is not None and label < min_label:
            if max_negative_label is not None and label <= max_negative_label:
                negatives.setdefault(query, []).extend(texts)
            continue
        positives.setdefault(query, []).extend(texts)
        negatives.setdefault(query, []).extend(neg)
    examples: list[Example] = []
    for query, docs in positives.items():
        pos_set = set(docs)
        negs = [n for n in unique(negatives.get(query, [])) if n not in pos_set]
        examples.extend(Example(query, doc, negs) for doc in unique(docs))
    if not examples:
        rule = f" with label >= {min_label}" if min_label is not None else ""
        raise InputError(f"{path}: no positive pairs{rule}")
    return examples


def read_sts(path: Path, *, min_score: float = 1.0) -> list[Example]:
    examples: list[Example] = []
    for lineno, row in iter_jsonl(path):
        s1 = _text(row, "sentence1", path, lineno)
        s2 = _text(row, "sentence2", path, lineno)
        score = _number(row, "score", path, lineno)
        if score is None:
            raise InputError(f"{at(path, lineno)}: missing field 'score'")
        if score >= min_score and s1 != s2:
            examples.append(Example(s1, s2))
    if not examples:
        raise InputError(f"{path}: no positive pairs with score >= {min_score}")
    return examples


def read_qa(path: Path, *, with_description: bool = False) -> list[Example]:
    examples: list[Example] = []
    for lineno, row in iter_jsonl(path):
        query = _text(row, "query", path, lineno)
        if row.get("text") is None:
            raise InputError(f"{at(path, lineno)}: row has no positive (expected 'text')")
        answer = _text(row, "text", path, lineno)
        description = row.get("description")
        if with_description and isinstance(description, str) and description.strip():
            query = f"{query}\n{description}"
        examples.append(Example(query, answer))
    return examples


# FlagEmbedding's ``type`` values (FlagEmbedding 1.3.3, ``AbsEmbedderSameDatasetTrainDataset``) and what a
# ``flag`` row of that type is here. Row-level meaning is kept; FlagEmbedding's batch-level effects are not
# (it halves the batch of a file whose type contains "symmetric" and draws each batch from one file; a stage
# here mixes its data sets in every batch). Types that give rows fewer negatives than the others are refused:
# every row of a stage gets the same number of negatives (``hard_negatives.num``).
FLAG_TYPES: dict[str | None, str] = {
    None: "asymmetric pairs",
    "normal": "asymmetric pairs",
    "symmetric_sts": "positives are query-side texts; the row's prompt also goes before the positive and negatives",
    "symmetric_clustering": "positives are query-side texts; the row's prompt also goes before the positive "
    "and negatives",
}
FLAG_REFUSED_TYPES = {
    "only_1neg": "FlagEmbedding trains its rows with one negative (train_group_size 2)",
    "symmetric_class": "FlagEmbedding trains its rows with only their own negatives (no repeats)",
}


def _scores(row: dict[str, Any], key: str, texts: list[str], path: Path, lineno: int) -> None:
    value = row.get(key)
    if value is None:
        return
    if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in value):
        raise InputError(f"{at(path, lineno)}: {key!r} must be a list of numbers")
    if len(value) != len(texts):
        side = key.split("_")[0]
        raise InputError(f"{at(path, lineno)}: {key!r} has {len(value)} scores for {len(texts)} texts in {side!r}")


def read_flag(path: Path, *, use_prompt: bool = True) -> tuple[list[Example], bool]:
    """FlagEmbedding JSONL rows -> examples (one per positive) and whether the file is symmetric (its ``type``)."""
    import random

    examples: list[Example] = []
    kind: str | None = None
    for lineno, row in iter_jsonl(path):
        where = at(path, lineno)
        query = _text(row, "query", path, lineno)
        for key in ("pos", "neg"):
            if key in row and not isinstance(row[key], list):
                raise InputError(f"{where}: {key!r} must be a list of strings, got {type(row[key]).__name__}")
        pos = _texts(row, "pos", path, lineno)
        if not pos:
            raise InputError(f"{where}: row has no positive (expected a non-empty 'pos' list)")
        neg = _texts(row, "neg", path, lineno)
        _scores(row, "pos_scores", pos, path, lineno)
        _scores(row, "neg_scores", neg, path, lineno)
        if "batch_size" in row:
            raise InputError(
                f"{where}: 'batch_size' (FlagEmbedding's batch size of the file) is not read here; "
                "set per_device_train_batch_size in the stage's args"
            )
        prompt = _text(row, "prompt", path, lineno, required=False)
        row_type = row.get("type")
        if row_type is not None and not isinstance(row_type, str):
            raise InputError(f"{where}: 'type' must be a string, got {type(row_type).__name__}")
        if row_type in FLAG_REFUSED_TYPES:
            raise InputError(
                f"{where}: type {row_type!r} is not supported: {FLAG_REFUSED_TYPES[row_type]}, and a stage here "
                "gives every row the same number of negatives (hard_negatives.num); keep the negatives wanted in "
                "'neg' and drop 'type'"
            )
        if row_type not in FLAG_TYPES:
            known = ", ".join(repr(t) for t in FLAG_TYPES if t)
            raise InputError(f"{where}: type {row_type!r} unknown; known: {known} (or none)")
        if not examples:
            kind = row_type
        elif row_type != kind:
            raise InputError(
                f"{where}: type {row_type!r} differs from the file's first row ({kind!r}); "
                "one type per file (FlagEmbedding requires one type per batch)"
            )
        pos_set = set(pos)
        negs = [n for n in unique(neg) if n not in pos_set]
        random.Random(lineno).shuffle(negs)  # a random k of them wherever a stage takes the first k
        instruction = prompt if use_prompt else None
        candidates = instruction is not None and row_type in ("symmetric_sts", "symmetric_clustering")
        examples.extend(
            Example(query, p, list(negs), instruction=instruction, where=where, instruct_candidates=candidates)
            for p in unique(pos)
        )
    return examples, bool(kind and "symmetric" in kind)


def read_alignment(path: Path) -> tuple[list[str], list[str]]:
    """``{text, side}`` rows -> (query-side texts, document-side texts)."""
    queries: list[str] = []
    documents: list[str] = []
    for lineno, row in iter_jsonl(path):
        text = _text(row, "text", path, lineno)
        side = row.get("side", "document")
        if side not in ("query", "document"):
            raise InputError(f"{at(path, lineno)}: side must be 'query' or 'document', got {side!r}")
        (queries if side == "query" else documents).append(text)
    return unique(queries), unique(documents)


def read_texts(path: Path) -> list[str]:
    """Raw texts for MLM: JSONL text-like fields, or plain lines."""
    from care_retriever.model.scratch import iter_vocab_texts

    if not path.is_file():
        raise InputError(f"training file not found: {path}")
    texts = unique([t for t in iter_vocab_texts([path]) if t.strip()])
    if not texts:
        raise InputError(f"{path}: empty file (no text)")
    return texts


def load_pairset(spec: Any, data_dir: Path) -> PairSet:
    """Read one recipe data set (a :class:`~care_retriever.training.recipe_spec.DatasetSpec`)."""
    path = resolve_data_path(spec.path, data_dir)
    if spec.format in ("pairs", "qtr"):
        defaults = (2.0, 0.0) if spec.format == "qtr" else (None, None)
        min_label = spec.min_label if spec.min_label is not None else defaults[0]
        max_neg = spec.max_negative_label if spec.max_negative_label is not None else defaults[1]
        examples = read_pairs(path, min_label=min_label, max_negative_label=max_neg)
        symmetric = False
    elif spec.format == "sts":
        examples = read_sts(path, min_score=1.0 if spec.min_score is None else spec.min_score)
        symmetric = True
    elif spec.format == "qa":
        examples = read_qa(path, with_description=spec.with_description)
        symmetric = False
    elif spec.format == "flag":
        examples, symmetric = read_flag(path, use_prompt=spec.use_prompt)
    elif spec.format == "alignment":
        queries, documents = read_alignment(path)
        return PairSet(
            spec.name, [], extra_queries=head(queries, spec.max_rows), extra_documents=head(documents, spec.max_rows)
        )
    elif spec.format == "text":
        # Unlabelled texts align on either side: the stage's alignment lists say which.
        texts = head(read_texts(path), spec.max_rows)
        return PairSet(spec.name, [], extra_queries=texts, extra_documents=texts)
    else:
        raise InputError(f"data set {spec.name!r}: format {spec.format!r} has no (query, positive) pairs")
    return PairSet(spec.name, head(examples, spec.max_rows), symmetric=symmetric)


def head(rows: list, max_rows: int | None) -> list:
    """A data set's ``max_rows`` cap: its first rows, all of them without a cap."""
    return rows[:max_rows] if max_rows else rows


# Where each evaluation task format keeps its query-side texts (BEIR/MTEB-style folders, as
# care_retriever.evaluation.tasks reads them): retrieval queries, rerank queries, both STS sentences.
_TASK_QUERY_FIELDS = {"queries.jsonl": ("text",), "test.jsonl": ("query", "sentence1", "sentence2")}


def squash(text: str) -> str:
    """A text with every whitespace removed: how training and evaluation texts are compared."""
    return "".join(text.split())


def task_queries(tasks: Path) -> set[str]:
    """The query-side texts (squashed) of every evaluation task folder under ``tasks``."""
    if not tasks.is_dir():
        raise InputError(f"exclude_task_queries: no folder of evaluation tasks at {tasks}")
    found: set[str] = set()
    for task in sorted(p for p in tasks.iterdir() if p.is_dir()):
        for name, fields in _TASK_QUERY_FIELDS.items():
            if (task / name).is_file():
                found.update(squash(row[f]) for _, row in iter_jsonl(task / name) for f in fields if row.get(f))
    return found


def without_queries(pairs: PairSet, excluded: set[str]) -> tuple[PairSet, int]:
    """``pairs`` less the examples whose query (or, for a symmetric set, either side) is in ``excluded``
    (squashed texts); the count dropped. Documents stay: a retrieval corpus holds its training documents too
    (every KUAKE-QTR training title is in the task's corpus), as in BEIR and MS MARCO."""

    def excluded_text(text: str) -> bool:
        return squash(text) in excluded

    kept = [
        e for e in pairs.examples if not excluded_text(e.query) and not (pairs.symmetric and excluded_text(e.positive))
    ]
    extra = [q for q in pairs.extra_queries if not excluded_text(q)]
    dropped = len(pairs.examples) - len(kept) + len(pairs.extra_queries) - len(extra)
    return replace(pairs, examples=kept, extra_queries=extra), dropped


def resolve_data_path(path: str, data_dir: Path) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else data_dir / p
