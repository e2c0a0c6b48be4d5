"""Asym-InfoNCE: contrastive loss between query-tower and document-tower embeddings.

CARE (Benchmarking and Enabling Efficient Chinese Medical Retrieval via Asymmetric Encoders,
ACL 2026), Stage I and Stage II::

    L = -log  exp(s(q, d+) / tau) / ( exp(s(q, d+) / tau) + sum_i exp(s(q, d_i-) / tau) )
    s(q, d) = cos(E_Q(q), E_D(d))

E_Q is the query tower, E_D the document tower; the negatives d_i- are the other rows' documents
in the batch plus optional hard negatives. It is InfoNCE (van den Oord et al., 2018) with the two
sides encoded by different networks. In Stage I the document side comes from the frozen teacher
cache, so it is a plain tensor here rather than a second forward pass.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def asym_infonce(
    query_embeddings: Tensor,
    document_embeddings: Tensor,
    temperature: float = 0.05,
    hard_negatives: Tensor | None = None,
) -> Tensor:
    """Mean Asym-InfoNCE over the batch.

    Args:
        query_embeddings: ``(n, d)`` query-tower outputs (normalised here, so cosine similarity).
        document_embeddings: ``(m, d)`` document-tower outputs with ``m >= n``; row ``i`` is the
            positive of query ``i``, all other rows are in-batch negatives (``m > n`` when the
            documents were gathered across devices with the local batch first).
        temperature: tau; the logits are ``cos / tau``.
        hard_negatives: optional ``(k, d)`` extra negatives shared by every query.
    """
    q = F.normalize(query_embeddings, dim=-1)
    d = F.normalize(document_embeddings.to(q.dtype), dim=-1)
    if hard_negatives is not None:
        d = torch.cat([d, F.normalize(hard_negatives.to(q.dtype), dim=-1)], dim=0)
    logits = q @ d.T / temperature
    labels = torch.arange(q.shape[0], device=q.device)
    return F.cross_entropy(logits, labels)
