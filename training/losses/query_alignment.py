"""Stage I loss: lambda1 * Asym-InfoNCE + lambda2 * alignment MSE against the frozen document tower.

CARE (ACL 2026), Stage I: the document tower is frozen and acts as the teacher; the query tower
learns to put any text where the document tower puts it::

    L = lambda1 * AsymInfoNCE(E_Q(x_i), E_D(y_i), in-batch negatives, tau) + lambda2 * MSE(E_Q(x_i), E_D(y_i))

With alignment data ``y_i = x_i`` (each query paired with itself, each document with itself).

Because E_D is frozen, ``E_D(y_i)`` is read from a memory-mapped cache computed once
(:mod:`care_retriever.training.teacher_cache`); the batch's ``label`` column holds row indices into
that cache. With ``cache=None`` the loss recomputes the teacher each step from a second input
column routed to the document tower (kept for the benchmark that measures what the cache saves).

With ``gather_across_devices`` (several processes, torchrun) every rank's teacher rows are
negatives for every rank's queries: each rank computes the mean loss of its own queries against
the whole global batch, so the mean over ranks (what DDP's averaged gradients optimise) is the
one-process loss of the global batch when the ranks hold equally many rows. Ranks may hold
different numbers of rows (a last partial batch): the gather exchanges the sizes first.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from care_retriever.training.losses.alignment_mse import alignment_mse
from care_retriever.training.losses.asym_infonce import asym_infonce


class QueryAlignmentLoss(nn.Module):
    def __init__(
        self,
        model: nn.Module,
        cache: np.ndarray | None = None,
        lambda1: float = 1.0,
        lambda2: float = 1.0,
        temperature: float = 0.05,
        gather_across_devices: bool = False,
        mse_target: str = "renormalised",
        similarity: str = "cosine",
    ) -> None:
        super().__init__()
        # "dot": the model scores by dot product (documents normalised before the Matryoshka cut): the
        # contrastive term takes the teacher rows as they are, as the authors' trainer does
        self.similarity = similarity
        self.mse_target = mse_target  # "sliced": the cache's rows are full-width normalised, then sliced
        self.model = model
        self.cache = cache
        self.lambda1 = lambda1
        self.lambda2 = lambda2
        self.temperature = temperature
        self.gather_across_devices = gather_across_devices
        self.last_components: dict[str, float] = {}

    def teacher(self, sentence_features: list[dict[str, Any]], labels: Tensor | None, device: torch.device) -> Tensor:
        if self.cache is not None:
            if labels is None:
                raise ValueError("QueryAlignmentLoss with a teacher cache needs row indices in the 'label' column")
            rows = labels.detach().cpu().numpy().astype(np.int64)
            return torch.from_numpy(np.asarray(self.cache[rows], dtype=np.float32)).to(device)
        if len(sentence_features) < 2:
            raise ValueError("QueryAlignmentLoss without a cache needs a second column routed to the document tower")
        with torch.no_grad():
            return self.model(sentence_features[1])["sentence_embedding"].detach()

    def forward(self, sentence_features: Iterable[dict[str, Any]], labels: Tensor | None) -> Tensor:
        features = list(sentence_features)
        student = self.model(features[0])["sentence_embedding"]
        teacher = self.teacher(features, labels, student.device)
        all_teacher = gather_rows(teacher) if self.gather_across_devices else teacher
        contrastive = asym_infonce(student, all_teacher, self.temperature, normalize_documents=self.similarity != "dot")
        mse = alignment_mse(student, teacher, normalise_teacher=self.mse_target != "sliced")
        self.last_components = {"asym_infonce": float(contrastive.detach()), "mse": float(mse.detach())}
        return self.lambda1 * contrastive + self.lambda2 * mse

    def get_config_dict(self) -> dict[str, Any]:
        return {
            "lambda1": self.lambda1,
            "lambda2": self.lambda2,
            "temperature": self.temperature,
            "teacher": "cached" if self.cache is not None else "recompute",
            "mse_target": self.mse_target,
            "similarity": self.similarity,
        }


def gather_rows(rows: Tensor) -> Tensor:
    """Every rank's ``rows``, the local ones first (row i stays the positive of query i), then the
    other ranks' in rank order. Ranks may hold different numbers of rows: sizes are gathered first,
    each rank pads to the largest and the padding is cut off. No gradient crosses ranks (the teacher
    has none). Without an initialised process group: ``rows`` itself."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return rows
    world, rank = dist.get_world_size(), dist.get_rank()
    size = torch.tensor([rows.shape[0]], dtype=torch.long, device=rows.device)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size)
    counts = [int(s.item()) for s in sizes]
    padded = rows.new_zeros((max(counts), *rows.shape[1:]))
    padded[: rows.shape[0]] = rows.detach()
    gathered = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(gathered, padded)
    parts = [rows] + [gathered[r][: counts[r]] for r in range(world) if r != rank]
    return torch.cat(parts, dim=0)
