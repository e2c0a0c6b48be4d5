"""Worker for tests/training/test_training_distributed.py, run by ``torchrun --nproc-per-node 2``.

``OUT N0 N1``: rank r takes its rows of one global batch of ``N0 + N1`` (rank 0 the first ``N0``,
rank 1 the next ``N1``: unequal when ``N0 != N1``), computes Stage I's ``QueryAlignmentLoss`` with
teacher rows gathered across ranks, and writes ``OUT/rank-<r>.json`` with its loss and rows.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from care_retriever.training.losses import QueryAlignmentLoss

DIM = 16
TEMPERATURE = 0.05


class Rows(nn.Module):
    """The query tower's place in the loss: the batch's student embeddings are its input here."""

    def forward(self, features: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"sentence_embedding": features["embedding"]}


def global_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(n, DIM, generator=generator), torch.randn(n, DIM, generator=generator)


def main() -> None:
    out, counts = Path(sys.argv[1]), [int(sys.argv[2]), int(sys.argv[3])]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    student, teacher = global_batch(sum(counts))
    start = sum(counts[:rank])
    rows = list(range(start, start + counts[rank]))
    loss = QueryAlignmentLoss(Rows(), teacher.numpy(), temperature=TEMPERATURE, gather_across_devices=True)
    value = loss([{"embedding": student[rows]}], torch.tensor(rows))
    (out / f"rank-{rank}.json").write_text(json.dumps({"rows": rows, "loss": float(value)}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
