"""Sharded indexing through torch.distributed: many processes encode, one writes.

    torchrun --nproc-per-node 8 -m care_retriever.index --model M --corpus C --store S

Encoding the corpus with the LLM document tower is the slow part (hours on GPUs); writing vectors
is not. So rank 0 reads the corpus and runs the ordinary :class:`DocumentStoreWriter` (unchanged
documents skipped by content hash, checkpoints, resume after a kill), and its encoder scatters each
chunk's texts over all ranks: rank ``r`` encodes the disjoint slice ``texts[r::world]`` with the
document tower on its own device, rank 0 gathers the vectors back in order. The result is the index
a single process would build (same ids, same order); killing the job and running the same command
again resumes from rank 0's last checkpoint. NCCL on GPUs, gloo on CPU; across nodes use torchrun's
rendezvous (see benchmarks/results/scale.md).

``care-retriever index`` is a world of one process (:mod:`care_retriever.indexing.run`).
"""

from __future__ import annotations

import datetime
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from care_retriever.errors import InputError, ModelError
from care_retriever.indexing.config import EncodeConfig

if TYPE_CHECKING:  # numpy too: the CLI reads IndexSettings' defaults when it starts, and imports nothing heavy
    import numpy as np

    from care_retriever.model.protocols import DocumentEncoder

logger = logging.getLogger("care_retriever")


@dataclass
class _Failure:
    """What a worker sends back instead of vectors when its encoding failed."""

    rank: int
    message: str


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    backend: str | None = None

    @property
    def active(self) -> bool:
        return self.backend is not None


def init_distributed(backend: str, device: str | None, timeout_minutes: float) -> tuple[Dist, str | None]:
    """Join the torchrun job (if any); return the group and the device this rank encodes on."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist(), device
    import torch
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    wants_gpu = device is None or device.startswith("cuda")
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() and wants_gpu else "gloo"
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise InputError("--dist-backend nccl needs CUDA GPUs; use gloo on CPU")
        torch.cuda.set_device(local_rank)
        device = f"cuda:{local_rank}"
    elif device is None:
        device = f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    # Imported before the group exists: imported while it exists (loading the document tower imports it), torch's
    # compiler keeps a reference to the group past destroy_process_group, so that its gloo threads (pt_gloo_runloop,
    # gloo_tcp_loop) outlived it into the interpreter's exit, where rank 0 aborted now and then ("terminate called
    # without an active exception"). Imported first, the group and its threads end in destroy_process_group.
    import torch._dynamo

    dist.init_process_group(backend, timeout=datetime.timedelta(minutes=timeout_minutes))
    return Dist(rank=dist.get_rank(), world=dist.get_world_size(), local_rank=local_rank, backend=backend), device


class ShardedEncoder:
    """Rank 0's encoder: scatter texts over the ranks, encode this rank's slice, gather in order."""

    def __init__(
        self,
        embedder: DocumentEncoder,
        group: Dist,
        encode: EncodeConfig,
    ) -> None:
        from care_retriever.model.encoding import auto_batch_limits
        from care_retriever.runtime.forward import prepare_encoder_forward

        self.embedder = embedder
        self.group = group
        if embedder.document_model is not None:  # this rank's tower: packed / compiled / fp8 as asked
            prepare_encoder_forward(embedder, encode.forward, encode.compile, encode.dtype, norms=encode.norms)
        # this rank's limits ("auto": from its own GPU's free memory); halved on out-of-memory, then kept for the run
        self.limits = auto_batch_limits(embedder.document_model, encode.batch_size, encode.max_batch_tokens)
        self.stats: dict[str, int] = {}  # truncated, tokens, padded_tokens of the slices this rank encoded

    @property
    def truncated(self) -> int:
        return self.stats.get("truncated", 0)

    def encode_slice(self, texts: list[str]) -> np.ndarray:
        return self.embedder.embed_documents(texts, limits=self.limits, stats=self.stats)

    def __call__(self, texts: list[str]) -> np.ndarray:
        import numpy as np
        import torch.distributed as dist

        world = self.group.world
        slices = [texts[r::world] for r in range(world)]
        mine: list[Any] = [None]
        dist.scatter_object_list(mine, slices, src=0)
        error: Exception | None = None
        try:
            local: Any = self.encode_slice(mine[0])
        except Exception as exc:  # still take part in the gather, or the workers would wait there forever
            error, local = exc, _Failure(0, str(exc))
        gathered: list[Any] = [None] * world
        dist.gather_object(local, gathered, dst=0)
        if error is not None:
            raise error
        failures = [g for g in gathered if isinstance(g, _Failure)]
        if failures:
            raise ModelError(f"rank {failures[0].rank}: {failures[0].message}")
        out = np.empty((len(texts), self.embedder.dim), dtype=np.float32)
        for r, part in enumerate(gathered):
            out[r::world] = part
        return out


def release_workers(group: Dist, own: dict[str, int]) -> dict[str, int]:
    """Rank 0: release the workers (they wait in scatter for the next chunk); return their encoding counts
    (truncated, tokens, padded_tokens) summed over all ranks."""
    import torch.distributed as dist

    dist.scatter_object_list([None], [None] * group.world, src=0)
    counts: list[Any] = [None] * group.world
    dist.gather_object(dict(own), counts, dst=0)
    total: dict[str, int] = {}
    for rank_counts in counts:
        for key, value in (rank_counts or {}).items():
            total[key] = total.get(key, 0) + int(value)
    return total


def serve_encoding(embedder: DocumentEncoder, group: Dist, encode: EncodeConfig) -> int:
    """A worker rank: encode the slices rank 0 scatters until it sends None; return the truncated count."""
    import torch.distributed as dist

    encoder = ShardedEncoder(embedder, group, encode)
    while True:
        mine: list[Any] = [None]
        dist.scatter_object_list(mine, None, src=0)
        if mine[0] is None:
            dist.gather_object(dict(encoder.stats), None, dst=0)
            return encoder.truncated
        try:
            local: Any = encoder.encode_slice(mine[0])
        except Exception as exc:  # reported to rank 0, which raises it; a bare crash would hang the job
            local = _Failure(group.rank, f"{type(exc).__name__}: {exc}")
        dist.gather_object(local, None, dst=0)
