"""C-MTEB tasks through the ``mteb`` package.

:class:`CareMtebEncoder` presents any of our embedders to ``mteb`` as an encoder: texts that mteb
marks as queries go through ``embed_queries`` with the task type's instruction (paper Table 8),
everything else through ``embed_documents``, so an asymmetric model is scored as it is used. The
tasks' data live on the Hugging Face hub; offline (``HF_HUB_OFFLINE=1``) or without ``mteb``
installed, each task comes back as a skipped result with the reason instead of an error.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from care_retriever.evaluation.runner import TaskResult
from care_retriever.evaluation.tasks import INSTRUCTIONS, instruction_for
from care_retriever.model.towers.loading import offline

logger = logging.getLogger("care_retriever")

_TYPES = {
    "Retrieval": "retrieval",
    "Reranking": "rerank",
    "STS": "sts",
    "InstructionRetrieval": "retrieval",
    "InstructionReranking": "rerank",
}
_REPORTED = (
    "ndcg_at_10",
    "map_at_10",
    "mrr_at_10",
    "recall_at_10",
    "recall_at_100",
    "map_at_1000",
    "pearson",
    "spearman",
    "cosine_pearson",
    "cosine_spearman",
)


def skip_reason() -> str | None:
    """Why C-MTEB tasks cannot run here, or None when they can be tried."""
    try:
        import mteb  # noqa: F401
    except ImportError:
        return "the mteb package is not installed (pip install 'care-retriever[mteb]')"
    if offline():
        return "HF_HUB_OFFLINE=1: C-MTEB datasets are on the Hugging Face hub"
    return None


def _encoder_base():
    from mteb.models.abs_encoder import AbsEncoder

    return AbsEncoder


def make_encoder(embedder: Any, name: str, *, instruction: str | None = None, batch_size: int = 32) -> Any:
    """An ``mteb`` encoder over ``embedder`` (built lazily so importing this module needs no mteb)."""
    from mteb.models import ModelMeta
    from mteb.models.model_meta import ScoringFunction
    from mteb.types import PromptType

    class CareMtebEncoder(_encoder_base()):  # type: ignore[misc]  # mteb's base class, imported on first use
        """Queries -> ``embed_queries(instruction)``, documents and everything else -> ``embed_documents``."""

        def __init__(self) -> None:
            self.model = embedder
            self.mteb_model_meta = ModelMeta.create_empty(
                overwrites={
                    "name": f"care-retriever/{name}",
                    "embed_dim": int(embedder.dim),
                    # the model's own similarity: cosine, or the dot product of the authors' released models
                    "similarity_fn_name": ScoringFunction.DOT_PRODUCT
                    if getattr(embedder, "similarity", "cosine") == "dot"
                    else ScoringFunction.COSINE,
                    "framework": ["PyTorch", "Sentence Transformers"],
                    "languages": ["zho-Hans"],
                    "use_instructions": True,
                    "modalities": ["text"],
                }
            )

        def encode(
            self,
            inputs: Any,
            *,
            task_metadata: Any,
            hf_split: str,
            hf_subset: str,
            prompt_type: Any = None,
            **kwargs: Any,
        ) -> np.ndarray:
            texts = [text for batch in inputs for text in batch["text"]]
            kind = _TYPES.get(task_metadata.type, "retrieval")
            if prompt_type == PromptType.query or kind == "sts":
                return embedder.embed_queries(
                    texts,
                    instruction=instruction_for(embedder, instruction or INSTRUCTIONS[kind]),
                    batch_size=batch_size,
                )
            return embedder.embed_documents(texts, batch_size=max(1, batch_size // 2))

    return CareMtebEncoder()


def run_mteb_tasks(
    embedder: Any,
    task_names: Sequence[str],
    *,
    model_name: str,
    instruction: str | None = None,
    tasks: Sequence[Any] | None = None,
) -> list[TaskResult]:
    """Evaluate ``embedder`` on mteb tasks by name (or on given mteb task objects, e.g. mteb's mocks)."""
    reason = None if tasks is not None else skip_reason()
    if getattr(embedder, "kind", None) == "lexical":
        reason = "BM25 has no mteb encoder; run it on task folders instead"
    if reason:
        return [TaskResult(t, "mteb", None, {}, model_name, 0.0, skipped=reason) for t in task_names]
    import mteb

    if tasks is None:
        try:
            tasks = list(mteb.get_tasks(tasks=list(task_names)))
        except Exception as exc:  # unknown names and hub errors both surface as one line
            return [
                TaskResult(t, "mteb", None, {}, model_name, 0.0, skipped=f"mteb: {str(exc).splitlines()[0]}")
                for t in task_names
            ]
    encoder = make_encoder(embedder, model_name, instruction=instruction)
    results = []
    for task in tasks:
        kind = _TYPES.get(task.metadata.type, task.metadata.type.lower())
        start = time.perf_counter()
        try:
            outcome = mteb.evaluate(encoder, task, cache=None, show_progress_bar=False)
        except Exception as exc:  # the hub unreachable, a dataset gone: report and go on
            logger.warning("mteb task %s failed: %s", task.metadata.name, str(exc).splitlines()[0])
            results.append(
                TaskResult(
                    task.metadata.name,
                    kind,
                    None,
                    {},
                    model_name,
                    time.perf_counter() - start,
                    skipped=f"mteb: {str(exc).splitlines()[0]}",
                )
            )
            continue
        for task_result in outcome.task_results:
            split, scores = next(iter(task_result.scores.items()))
            first = scores[0]
            metrics = {k: float(first[k]) for k in _REPORTED if isinstance(first.get(k), (int, float))}
            results.append(
                TaskResult(
                    f"{task_result.task_name} (mteb, {split})",
                    kind,
                    float(first["main_score"]),
                    metrics,
                    model_name,
                    time.perf_counter() - start,
                )
            )
    return results
