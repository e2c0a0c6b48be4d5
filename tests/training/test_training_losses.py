"""The Stage I losses against their formulas, and the cached vs recomputed teacher giving the same loss."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F


def test_asym_infonce_is_the_papers_formula() -> None:
    from care_retriever.training.losses import asym_infonce

    torch.manual_seed(0)
    q, d = torch.randn(4, 8), torch.randn(4, 8)
    tau = 0.1
    loss = asym_infonce(q, d, temperature=tau)
    qn, dn = F.normalize(q, dim=-1), F.normalize(d, dim=-1)
    expected = 0.0
    for i in range(4):
        s = [float(qn[i] @ dn[j]) for j in range(4)]
        expected += -math.log(math.exp(s[i] / tau) / sum(math.exp(x / tau) for x in s))
    assert float(loss) == pytest.approx(expected / 4, rel=1e-5)
    # extra hard negatives only add terms to the denominator: the loss can only grow
    assert float(asym_infonce(q, d, tau, hard_negatives=torch.randn(3, 8))) > float(loss)
    # a perfect match with orthogonal negatives gives a loss near 0
    eye = torch.eye(4, 8)
    assert float(asym_infonce(eye, eye, temperature=0.01)) < 1e-6


def test_alignment_mse_is_the_squared_distance_of_unit_vectors() -> None:
    from care_retriever.training.losses import alignment_mse

    torch.manual_seed(1)
    s, t = torch.randn(5, 16), torch.randn(5, 16) * 3
    cos = F.cosine_similarity(s, t, dim=-1)
    assert float(alignment_mse(s, t)) == pytest.approx(float((2 - 2 * cos).mean()), rel=1e-5)
    assert float(alignment_mse(s, s * 7)) == pytest.approx(0.0, abs=1e-6)  # scale does not matter


def test_query_alignment_loss_cached_equals_recomputed(tiny_model_dir) -> None:
    """The same batch through the cached teacher and the recomputed teacher gives the same loss."""
    from sentence_transformers.util import batch_to_device

    from care_retriever.model.embedder import AsymmetricEmbedder
    from care_retriever.training.losses import QueryAlignmentLoss, alignment_mse, asym_infonce

    embedder = AsymmetricEmbedder.from_pretrained(tiny_model_dir)
    model = embedder.to_sentence_transformer()
    model.eval()
    texts = ["高血压怎么办", "感冒多喝水", "糖尿病饮食", "失眠调理"]
    cache = np.asarray(embedder.embed_documents(texts), dtype=np.float32)
    q_features = batch_to_device(model.preprocess(texts, task="query"), model.device)
    d_features = batch_to_device(model.preprocess(texts, task="document"), model.device)
    cached = QueryAlignmentLoss(model, cache, lambda1=1.0, lambda2=0.5, temperature=0.05)
    recomputed = QueryAlignmentLoss(model, None, lambda1=1.0, lambda2=0.5, temperature=0.05)
    with torch.no_grad():
        a = cached([dict(q_features)], torch.tensor([0, 1, 2, 3]))
        b = recomputed([dict(q_features), dict(d_features)], None)
        student = torch.from_numpy(embedder.embed_queries(texts))
    assert float(a) == pytest.approx(float(b), rel=1e-4)
    teacher = torch.from_numpy(cache)
    expected = asym_infonce(student, teacher, 0.05) + 0.5 * alignment_mse(student, teacher)
    assert float(a) == pytest.approx(float(expected), rel=1e-4)
    assert set(cached.last_components) == {"asym_infonce", "mse"}
    # the label column indexes the cache: a permuted batch reads the permuted rows
    with torch.no_grad():
        perm = QueryAlignmentLoss(model, cache[[1, 0, 2, 3]], temperature=0.05)
        c = perm([dict(q_features)], torch.tensor([1, 0, 2, 3]))
        d = QueryAlignmentLoss(model, cache, temperature=0.05)([dict(q_features)], torch.tensor([0, 1, 2, 3]))
    assert float(c) == pytest.approx(float(d), rel=1e-5)


def test_score_distillation_is_kl_plus_infonce() -> None:
    from care_retriever.training.losses import ScoreDistillationLoss, asym_infonce

    class Fixed(torch.nn.Module):
        """Returns the embedding stored in the features: the loss is checked apart from any encoder."""

        def forward(self, features):
            return {"sentence_embedding": features["emb"]}

    torch.manual_seed(2)
    q, pos, neg = torch.randn(3, 6), torch.randn(3, 6), torch.randn(3, 6)
    loss = ScoreDistillationLoss(Fixed(), kl_weight=2.0, temperature=0.1)
    features = [{"emb": q}, {"emb": pos}, {"emb": neg}]
    student = torch.stack([F.cosine_similarity(q, pos), F.cosine_similarity(q, neg)], dim=1)
    infonce = asym_infonce(q, pos, 0.1, hard_negatives=neg)
    # a teacher that scores exactly like the student: the KL term vanishes
    assert float(loss(features, student)) == pytest.approx(float(infonce), rel=1e-5)
    # another teacher: the KL term is the textbook one, weighted
    teacher = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.5, 0.5]])
    kl = F.kl_div(F.log_softmax(student / 0.1, -1), F.softmax(teacher / 0.1, -1), reduction="batchmean")
    assert float(loss(features, teacher)) == pytest.approx(float(2.0 * kl + infonce), rel=1e-4)
