"""Do the authors' released models give the authors' vectors here? The parity table of docs/models.md.

On the release-layout fixtures (``tests/fixtures/release``: a BERT or a gte ``new`` query tower beside a Qwen3
document tower, random weights) it compares, against ``reference.json`` (the authors' ``inference/asymmetric.py``
at their pinned stack), two ways of reading the same folder:

- ``release``: ``AsymmetricEmbedder.from_pretrained(folder)`` (the authors' conventions, this package today);
- ``paired``: the two towers paired with this package's own conventions (``init --query-model F/query_encoder
  --document-model F/doc_encoder``: EOS appended to documents, no query template, renormalised after the cut),
  which is what a user got before the release layout was a model.

    python -m benchmarks.release_parity            # writes the table into docs/models.md
    python -m benchmarks.release_parity --no-write # prints it
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.marked_sections import write_marked

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "release"
DOC = REPO / "docs" / "models.md"
TASKS = {"retrieval": "retrieval", "medteb_reranking": "rerank", "medteb_sts_v1": "sts"}


def _fixture_builder() -> Any:
    spec = importlib.util.spec_from_file_location("make_release_fixtures", FIXTURES / "make_release_fixtures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def compare(embedder: Any, reference: dict[str, Any], fixture: dict[str, Any], *, instructed: bool) -> dict[str, Any]:
    """Parity figures of ``embedder`` against the authors' vectors for one fixture."""
    docs = embedder.embed_documents(reference["documents"])
    want_docs = np.asarray(fixture["document_vectors"], dtype=np.float32)
    query_cos = {}
    for task, task_type in TASKS.items():
        instruction = embedder.config.task_instruction(task_type) if instructed else None
        got = embedder.embed_queries(reference["queries"], instruction=instruction)
        query_cos[task] = float(_cos(got, np.asarray(fixture["query_vectors"][task], dtype=np.float32)).min())
    scores = embedder.embed_queries(reference["queries"]) @ docs.T
    want = np.asarray(fixture["scores_retrieval"])
    return {
        "document_cos_min": float(_cos(docs, want_docs).min()),
        "document_norm_max_diff": float(np.abs(np.linalg.norm(docs, axis=1) - np.linalg.norm(want_docs, axis=1)).max()),
        "query_cos_min": query_cos,
        "score_max_abs_diff": float(np.abs(scores - want).max()),
        "top1_agree": int((scores.argmax(axis=1) == want.argmax(axis=1)).sum()),
        "order_agree": int((np.argsort(-scores, axis=1) == np.argsort(-want, axis=1)).all(axis=1).sum()),
        "queries": len(reference["queries"]),
    }


def measure() -> dict[str, Any]:
    from care_retriever.model.embedder import AsymmetricEmbedder

    reference = json.loads((FIXTURES / "reference.json").read_text("utf-8"))
    make = _fixture_builder()
    out: dict[str, Any] = {"stack": reference["stack"], "rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("bert", "gte"):
            folder = make.build_release_fixture(kind, Path(tmp) / kind)
            fixture = reference["fixtures"][kind]
            release = AsymmetricEmbedder.from_pretrained(folder)
            out["rows"].append(
                {"fixture": kind, "read": "release", **compare(release, reference, fixture, instructed=True)}
            )
            paired = AsymmetricEmbedder.from_towers(str(folder / "query_encoder"), str(folder / "doc_encoder"))
            out["rows"].append(
                {"fixture": kind, "read": "paired", **compare(paired, reference, fixture, instructed=False)}
            )
    return out


def table(result: dict[str, Any]) -> str:
    stack = result["stack"]
    lines = [
        f"Reference: the authors' `inference/asymmetric.py` (torch {stack['torch']}, transformers "
        f"{stack['transformers']}, FlagEmbedding {stack['FlagEmbedding']}, CPU fp32), `tests/fixtures/release/"
        "reference.json`. Here: this checkout, CPU fp32. Written by `python -m benchmarks.release_parity`.",
        "",
        "| fixture | read as | doc cos (min) | doc norm diff (max) | query cos retrieval / rerank / sts (min) "
        "| score diff (max) | top-1 same | full order same |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        q = row["query_cos_min"]
        read = "release layout (`--model F`)" if row["read"] == "release" else "towers paired by `init` (before)"
        lines.append(
            f"| {row['fixture']} | {read} | {row['document_cos_min']:.5f} | {row['document_norm_max_diff']:.1e} | "
            f"{q['retrieval']:.5f} / {q['medteb_reranking']:.5f} / {q['medteb_sts_v1']:.5f} | "
            f"{row['score_max_abs_diff']:.1e} | {row['top1_agree']}/{row['queries']} | "
            f"{row['order_agree']}/{row['queries']} |"
        )
    return "\n".join(lines)


def write(doc: Path, text: str) -> None:
    write_marked(doc, "release-parity", text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-write", action="store_true", help="print the table, leave docs/models.md as it is")
    parser.add_argument("--doc", type=Path, default=DOC)
    args = parser.parse_args(argv)
    result = measure()
    text = table(result)
    print(text)
    if not args.no_write:
        write(args.doc, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
