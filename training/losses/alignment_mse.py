"""Alignment MSE: squared distance between the two towers' normalised embeddings of one text.

CARE (ACL 2026), Stage I query alignment::

    L_MSE = || E_Q(x) / |E_Q(x)|  -  E_D(x) / |E_D(x)| ||^2      (averaged over the batch)

The squared norm is summed over dimensions (not averaged as ``torch.nn.MSELoss`` and
sentence-transformers' ``MSELoss`` do), so the term stays on the scale of the contrastive loss
whatever the width: for unit vectors it equals ``2 - 2 cos``, in [0, 4]. With the paper's
lambda2 = 1 a per-element mean would make the term ~1/dim of that and effectively switch it off.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def alignment_mse(student: Tensor, teacher: Tensor, *, normalise_teacher: bool = True) -> Tensor:
    """Mean over rows of the squared L2 distance between unit-normalised ``student`` and ``teacher``.

    ``normalise_teacher=False`` takes the teacher rows as given: the CARE authors' target, the document
    embedding normalised at the tower's full width and then sliced to the query width. Its norm r is below 1,
    so the term cannot go under ``(1 - r)^2`` for that row (a unit student pointing along it)."""
    s = F.normalize(student, dim=-1)
    t = teacher.to(s.dtype)
    if normalise_teacher:
        t = F.normalize(t, dim=-1)
    return (s - t).pow(2).sum(dim=-1).mean()
