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
    *,
    normalize_documents: bool = True,
) -> Tensor:
    """Mean Asym-InfoNCE over the batch.

    Args:
        query_embeddings: ``(n, d)`` query-tower outputs (normalised here, so cosine similarity).
        document_embeddings: ``(m, d)`` document-tower outputs with ``m >= n``; row ``i`` is the
            positive of query ``i``, all other rows are in-batch negatives (``m > n`` when the
            documents were gathered across devices with the local batch first).
        temperature: tau; the logits are ``cos / tau``.
        hard_negatives: optional ``(k, d)`` extra negatives shared by every query.
        normalize_documents: False takes the document rows as given (a dot-product model whose document
            vectors were normalised at the tower's full width, then cut: the CARE authors' release), so the
            logits are ``q . d / tau`` with ``|d| <= 1``.
    """
    q = F.normalize(query_embeddings, dim=-1)
    d = document_embeddings.to(q.dtype)
    if hard_negatives is not None:
        d = torch.cat([d, hard_negatives.to(q.dtype)], dim=0)
    if normalize_documents:
        d = F.normalize(d, dim=-1)
    logits = q @ d.T / temperature
    labels = torch.arange(q.shape[0], device=q.device)
    return F.cross_entropy(logits, labels)
