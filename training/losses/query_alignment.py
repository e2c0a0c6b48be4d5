"""Stage I loss: lambda1 * Asym-InfoNCE + lambda2 * alignment MSE against the frozen document tower.

CARE (ACL 2026), Stage I: the document tower is frozen and acts as the teacher; the query tower
learns to put any text where the document tower puts it::

    L = lambda1 * AsymInfoNCE(E_Q(x_i), E_D(y_i), in-batch negatives, tau) + lambda2 * MSE(E_Q(x_i), E_D(y_i))

With alignment data ``y_i = x_i`` (each query paired with itself, each document with itself).

Because E_D is frozen, ``E_D(y_i)`` is read from a memory-mapped cache computed once
(:mod:`care_retriever.training.teacher_cache`); the batch's ``label`` column holds row indices into
that cache. With ``cache=None`` the loss recomputes the teacher each step from a second input
column routed to the document tower (kept for the benchmark that measures what the cache saves).
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
    ) -> None:
        super().__init__()
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
        all_teacher = teacher
        if self.gather_across_devices:
            from sentence_transformers.util import all_gather, get_rank

            # Every rank's teacher rows become negatives (the teacher has no gradient to carry);
            # the local rows go first so row i is still the positive of query i.
            teacher_all = all_gather(teacher)
            n, rank = teacher.shape[0], get_rank()
            order = [teacher_all[rank * n : (rank + 1) * n], teacher_all[: rank * n], teacher_all[(rank + 1) * n :]]
            all_teacher = torch.cat(order, dim=0)
        contrastive = asym_infonce(student, all_teacher, self.temperature)
        mse = alignment_mse(student, teacher)
        self.last_components = {"asym_infonce": float(contrastive.detach()), "mse": float(mse.detach())}
        return self.lambda1 * contrastive + self.lambda2 * mse

    def get_config_dict(self) -> dict[str, Any]:
        return {
            "lambda1": self.lambda1,
            "lambda2": self.lambda2,
            "temperature": self.temperature,
            "teacher": "cached" if self.cache is not None else "recompute",
        }
