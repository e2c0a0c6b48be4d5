"""Score distillation baseline: KL to the document tower's scores + InfoNCE, into a symmetric student.

CARE (ACL 2026), Table 7, "score distillation into a symmetric base": the small tower is trained
alone (on both sides) to reproduce the large tower's relevance scores over each query's candidates
(its positive and hard negatives), plus the usual contrastive term::

    L = kl_weight * KL( softmax(s_T(q, c) / tau) || softmax(s_S(q, c) / tau) )
        + InfoNCE(q, d+, in-batch + hard negatives)
    s_T = cos(E_D(q), E_D(c))   (teacher: the document tower on both sides, scores precomputed once)
    s_S = cos(E_Q(q), E_Q(c))   (student: the query tower on both sides)

The teacher scores arrive as the batch's ``label`` column (shape ``(n, 1 + k)``: positive first).
sentence-transformers' ``DistillKLDivLoss`` covers the KL term alone; the sum of both is written here
so one forward pass serves the two terms.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from care_retriever.training.losses.asym_infonce import asym_infonce


class ScoreDistillationLoss(nn.Module):
    def __init__(self, model: nn.Module, kl_weight: float = 1.0, temperature: float = 0.05) -> None:
        super().__init__()
        self.model = model
        self.kl_weight = kl_weight
        self.temperature = temperature

    def forward(self, sentence_features: Iterable[dict[str, Any]], labels: Tensor) -> Tensor:
        embeddings = [self.model(f)["sentence_embedding"] for f in sentence_features]
        anchor = F.normalize(embeddings[0], dim=-1)
        candidates = F.normalize(torch.stack(embeddings[1:], dim=1), dim=-1)  # (n, 1 + k, d)
        student = torch.einsum("nd,nkd->nk", anchor, candidates) / self.temperature
        teacher = labels.to(student.dtype) / self.temperature
        kl = F.kl_div(
            F.log_softmax(student, dim=-1), F.log_softmax(teacher, dim=-1), log_target=True, reduction="batchmean"
        )
        negatives = candidates[:, 1:].reshape(-1, candidates.shape[-1]) if candidates.shape[1] > 1 else None
        contrastive = asym_infonce(anchor, candidates[:, 0], self.temperature, hard_negatives=negatives)
        return self.kl_weight * kl + contrastive

    def get_config_dict(self) -> dict[str, Any]:
        return {"kl_weight": self.kl_weight, "temperature": self.temperature}
