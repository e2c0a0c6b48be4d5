"""Small training files in the CARE authors' data layout (``stage1/``, ``stage2/``) for the ``authors`` recipe."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.data import REPO, SAMPLE_DIR, write_jsonl

AUTHORS = REPO / "training" / "recipes" / "authors.yaml"
SAMPLE_CORPUS = SAMPLE_DIR / "corpus.jsonl"
RETRIEVAL = "Given a Chinese medical question, retrieve medical documents that answer the question."
STS = "Retrieve semantically similar text."


def authors_data(root: Path) -> Path:
    """Rows shaped like the authors' four sample files (short texts: the test is about the wiring)."""
    texts = [json.loads(line)["text"][:24] for line in SAMPLE_CORPUS.read_text("utf-8").splitlines()]
    texts = list(dict.fromkeys(texts))
    queries, documents = texts[:16], texts[16:48]
    write_jsonl(root / "stage1" / "stage1-query-align-q.jsonl", [{"query": q, "pos": [q], "neg": []} for q in queries])
    write_jsonl(
        root / "stage1" / "stage1-query-align-doc.jsonl", [{"query": d, "pos": [d], "neg": []} for d in documents]
    )
    write_jsonl(
        root / "stage2" / "stage2-medteb-retrieval.jsonl",
        [
            {"query": q, "pos": [documents[i]], "neg": documents[i + 1 : i + 16], "pos_id": i, "prompt": RETRIEVAL}
            for i, q in enumerate(queries)
        ],
    )
    write_jsonl(
        root / "stage2" / "stage2-medteb-sts.jsonl",
        [
            {"query": q, "pos": [queries[(i + 1) % 16]], "neg": [queries[(i + k) % 16] for k in range(2, 9)]}
            | {"prompt": STS, "type": "symmetric_sts"}
            for i, q in enumerate(queries)
        ],
    )
    return root
