"""Losses of the asymmetric stages that sentence-transformers has no class for.

Stage 0 and Stage II use sentence-transformers' ``MultipleNegativesRankingLoss`` (InfoNCE; with the
Router's ``router_mapping`` sending anchors to the query tower and candidates to the document tower
it *is* Asym-InfoNCE) and ``MatryoshkaLoss``. Stage I compares the query tower with cached
document-tower vectors, which no stock loss does, so its pieces live here.
"""

from care_retriever.training.losses.alignment_mse import alignment_mse
from care_retriever.training.losses.asym_infonce import asym_infonce
from care_retriever.training.losses.query_alignment import QueryAlignmentLoss
from care_retriever.training.losses.score_distillation import ScoreDistillationLoss

__all__ = ["QueryAlignmentLoss", "ScoreDistillationLoss", "alignment_mse", "asym_infonce"]
