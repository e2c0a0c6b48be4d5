"""Sharded indexing through torch.distributed: many processes encode, one writes.

    torchrun --nproc-per-node 8 -m care_retriever.index --model M --corpus C --store S

Encoding the corpus with the LLM document tower is the slow part (hours on GPUs); writing vectors
is not. So rank 0 reads the corpus and runs the ordinary :class:`DocumentStoreWriter` (unchanged
documents skipped by content hash, checkpoints, resume after a kill), and its encoder scatters each
chunk's texts over all ranks: rank ``r`` encodes the disjoint slice ``texts[r::world]`` with the
document tower on its own device, rank 0 gathers the vectors back in order. The result is the index
a single process would build (same ids, same order); killing the job and running the same command
again resumes from rank 0's last checkpoint. NCCL on GPUs, gloo on CPU; across nodes use torchrun's
rendezvous (see docs/scale.md).

``care-retriever index`` is this code with a world of one process: one option set
(:class:`IndexSettings`), one :func:`run_index`, one ``main`` (``python -m care_retriever.index ARGS``
is ``care-retriever index ARGS``).
"""

from __future__ import annotations

import datetime
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from care_retriever.errors import InputError, ModelError

if TYPE_CHECKING:  # numpy too: the CLI reads IndexSettings' defaults when it starts, and imports nothing heavy
    import numpy as np

    from care_retriever.embedder import AsymmetricEmbedder
    from care_retriever.embedder_protocol import DocumentEncoder

logger = logging.getLogger("care_retriever")

BACKENDS = ("auto", "nccl", "gloo")


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
            raise InputError("--backend nccl needs CUDA GPUs; use gloo on CPU")
        torch.cuda.set_device(local_rank)
        device = f"cuda:{local_rank}"
    elif device is None:
        device = f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    dist.init_process_group(backend, timeout=datetime.timedelta(minutes=timeout_minutes))
    return Dist(rank=dist.get_rank(), world=dist.get_world_size(), local_rank=local_rank, backend=backend), device


class ShardedEncoder:
    """Rank 0's encoder: scatter texts over the ranks, encode this rank's slice, gather in order."""

    def __init__(
        self,
        embedder: DocumentEncoder,
        group: Dist,
        batch_size: int | None,
        max_batch_tokens: int | str | None = "auto",
    ) -> None:
        from care_retriever.encoding import auto_batch_limits

        self.embedder = embedder
        self.group = group
        # this rank's limits ("auto": from its own GPU's free memory); halved on out-of-memory, then kept for the run
        self.limits = auto_batch_limits(getattr(embedder, "document_model", None), batch_size, max_batch_tokens)
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


def serve_encoding(
    embedder: DocumentEncoder, group: Dist, batch_size: int | None, max_batch_tokens: int | str | None = "auto"
) -> int:
    """A worker rank: encode the slices rank 0 scatters until it sends None; return the truncated count."""
    import torch.distributed as dist

    encoder = ShardedEncoder(embedder, group, batch_size, max_batch_tokens)
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


def parse_max_batch_tokens(value: str | int | None) -> int | str | None:
    """``--max-batch-tokens``: ``auto``, ``none`` (no budget) or a number of tokens (checked by IndexSettings)."""
    if value is None or isinstance(value, int):
        return value
    text = value.strip().lower()
    if text in ("auto", "none"):
        return None if text == "none" else "auto"
    try:
        return int(text)
    except ValueError:
        raise InputError(f"--max-batch-tokens must be an integer >= 1, auto or none, got {value!r}") from None


@dataclass(frozen=True)
class IndexSettings:
    """The one option set of ``care-retriever index`` and ``torchrun -m care_retriever.index``."""

    model: str
    corpus: Path
    store: str
    collection: str | None = None
    batch_size: int | None = None  # texts per forward pass at most (None: 16 on CPU, 2048 on a GPU)
    # padded tokens per forward pass at most: "auto" sizes it from the GPU's free memory (none on CPU); None: no
    # budget, batch_size alone
    max_batch_tokens: int | str | None = "auto"
    sort_window: int = 65536  # documents sorted by length together (a window at a time, streaming)
    dtype: str = "auto"  # the document tower's precision (care_retriever.embedder.resolve_dtype)
    attn_implementation: str = "auto"  # care_retriever.embedder.resolve_attn_implementation
    chunk_size: int = 1024
    checkpoint_every: int = 8192
    index_type: str = "flat"
    hnsw_m: int = 32
    ef_construction: int = 200
    ef_search: int = 128
    nlist: int = 1024
    nprobe: int = 32
    pq_m: int = 96
    quantize: str | None = None  # None: the store's own (none for a new store)
    oversample: float | None = None  # None: the store's own, or the quantization's default
    on_disk_vectors: bool = False  # Qdrant only (these three): original vectors memory-mapped from disk
    shards: int | None = None  # Qdrant: shard_number
    replicas: int | None = None  # Qdrant: replication_factor
    update: bool = False
    prune: bool = False
    skip_invalid: bool = False
    device: str | None = None
    backend: str = "auto"
    timeout_minutes: float = 120.0
    progress: bool = True
    sparse: bool = True  # also write the BM25 side (care_retriever.sparse; docs/hybrid.md)
    trust_remote_code: bool = False  # a document tower whose model code ships with it (every rank loads it)

    def validate(self) -> None:
        """Every check that needs neither the corpus nor the model: a bad option fails before any work."""
        from care_retriever.embedder import ATTN_IMPLEMENTATIONS, DTYPE_CHOICES, DTYPES
        from care_retriever.stores.base import FAISS_INDEX_TYPES

        batch_size = 1 if self.batch_size is None else self.batch_size  # None: by device
        if min(batch_size, self.chunk_size, self.checkpoint_every) < 1:
            raise InputError("--batch-size, --chunk-size and --checkpoint-every must be >= 1")
        if self.sort_window < 1:
            raise InputError(f"--sort-window must be >= 1, got {self.sort_window}")
        if self.max_batch_tokens != "auto" and self.max_batch_tokens is not None:
            if not isinstance(self.max_batch_tokens, int) or isinstance(self.max_batch_tokens, bool):
                raise InputError(f"--max-batch-tokens must be an integer >= 1 or auto, got {self.max_batch_tokens!r}")
            if self.max_batch_tokens < 1:
                raise InputError(f"--max-batch-tokens must be >= 1, got {self.max_batch_tokens}")
        if self.dtype not in ("auto", *DTYPES):
            raise InputError(f"Unknown --dtype {self.dtype!r}. Available: {list(DTYPE_CHOICES)}")
        if self.attn_implementation not in ATTN_IMPLEMENTATIONS:
            raise InputError(
                f"Unknown --attn-implementation {self.attn_implementation!r}. Available: {list(ATTN_IMPLEMENTATIONS)}"
            )
        if self.index_type not in FAISS_INDEX_TYPES:
            raise InputError(
                f"Unknown --index-type {self.index_type!r}. Available index types: {list(FAISS_INDEX_TYPES)}"
            )
        if min(self.hnsw_m, self.ef_construction, self.ef_search, self.nlist, self.nprobe, self.pq_m) < 1:
            raise InputError("--hnsw-m, --ef-construction, --ef-search, --nlist, --nprobe and --pq-m must be >= 1")
        if self.store.startswith("faiss:") and self.quantize is not None:
            from care_retriever.stores.faiss import QUANTIZE

            if self.quantize not in QUANTIZE:
                raise InputError(f"Unknown --quantize {self.quantize!r} for a FAISS store. Available: {list(QUANTIZE)}")
        if self.oversample is not None and not self.oversample >= 1:
            raise InputError(f"--oversample must be >= 1, got {self.oversample}")
        qdrant_only = [
            flag
            for flag, given in (
                ("--on-disk-vectors", self.on_disk_vectors),
                ("--shards", self.shards is not None),
                ("--replicas", self.replicas is not None),
            )
            if given
        ]
        if qdrant_only and not self.store.startswith("qdrant:"):
            raise InputError(
                f"{', '.join(qdrant_only)} apply to Qdrant stores only (qdrant:PATH | qdrant:http://host:6333); "
                f"got {self.store}"
            )
        if self.store.startswith("qdrant:"):
            from care_retriever.stores.qdrant_store import normalize_options

            normalize_options(self.index_options())  # an unknown quantization or a bad count: one line, no work
        if self.backend not in BACKENDS:
            raise InputError(f"Unknown --backend {self.backend!r}. Available backends: {list(BACKENDS)}")
        if not self.timeout_minutes > 0:
            raise InputError(f"--timeout-minutes must be > 0, got {self.timeout_minutes}")

    def index_options(self) -> dict[str, Any] | None:
        """The store's build and search settings kept in its manifest: FAISS's index, or the Qdrant collection
        settings given (those left out are the existing collection's, or Qdrant's defaults for a new one)."""
        if self.store.startswith("qdrant:"):
            given = {
                "quantize": self.quantize,
                "oversample": self.oversample,
                "on_disk": True if self.on_disk_vectors else None,
                "shards": self.shards,
                "replicas": self.replicas,
            }
            return {k: v for k, v in given.items() if v is not None} or None
        if not self.store.startswith("faiss:"):
            return None
        return {
            "type": self.index_type,
            "m": self.hnsw_m,
            "ef_construction": self.ef_construction,
            "ef_search": self.ef_search,
            "nlist": self.nlist,
            "nprobe": self.nprobe,
            "pq_m": self.pq_m,
            **({"quantize": self.quantize} if self.quantize is not None else {}),
            **({"oversample": self.oversample} if self.oversample is not None else {}),
        }


def run_index(settings: IndexSettings) -> dict[str, Any] | None:
    """Index ``settings.corpus`` into ``settings.store`` with every rank of the job (one without torchrun).

    Rank 0 returns the report; the other ranks return None once rank 0 has released them.
    """
    settings.validate()
    group, device = init_distributed(settings.backend, settings.device, settings.timeout_minutes)
    try:
        if group.rank != 0:
            serve_encoding(load_document_tower(settings, device), group, settings.batch_size, settings.max_batch_tokens)
            return None
        return _write(settings, group, device)
    finally:
        if group.active:
            import torch.distributed as dist

            dist.destroy_process_group()


def load_document_tower(settings: IndexSettings, device: str | None) -> AsymmetricEmbedder:
    from care_retriever.embedder import AsymmetricEmbedder
    from care_retriever.loading import quiet_transformers

    quiet_transformers()
    return AsymmetricEmbedder.from_pretrained(
        settings.model,
        load="document",
        device=device,
        trust_remote_code=settings.trust_remote_code,
        dtype=settings.dtype,
        attn_implementation=settings.attn_implementation,
    )


def _write(settings: IndexSettings, group: Dist, device: str | None) -> dict[str, Any]:
    """Rank 0: validate the corpus and the store, then run the writer (its chunks scattered over the ranks)."""
    from care_retriever.corpus import corpus_file, read_corpus
    from care_retriever.stores import open_store
    from care_retriever.writer import DocumentStoreWriter

    encoder: ShardedEncoder | None = None
    target = None
    counts_all_ranks: dict[str, int] = {}
    try:
        file = corpus_file(settings.corpus)
        # Validate the whole corpus before the first write, so bad input leaves the store untouched.
        total = sum(1 for _ in read_corpus(file, skip_invalid=settings.skip_invalid))
        target = open_store(settings.store, collection=settings.collection)
        if settings.update and target.manifest is None:
            raise InputError(
                f"--update: {target.describe()} holds no index yet (a mistyped path?); drop --update to build a new one"
            )
        embedder = load_document_tower(settings, device)
        encoder = (
            ShardedEncoder(embedder, group, settings.batch_size, settings.max_batch_tokens) if group.active else None
        )
        writer = DocumentStoreWriter(
            embedder,
            target,
            batch_size=settings.batch_size,
            max_batch_tokens=settings.max_batch_tokens,
            chunk_size=settings.chunk_size,
            sort_window=settings.sort_window,
            checkpoint_every=settings.checkpoint_every,
            index_options=settings.index_options(),
            show_progress=settings.progress,
            encoder=encoder,
            sparse=settings.sparse,
        )
        report = writer.write(
            read_corpus(file, skip_invalid=settings.skip_invalid), total=total, prune_ids_not_in=settings.prune
        )
    finally:
        if target is not None:
            target.close()
        if group.active:  # also on error: a worker left waiting in scatter would hang the job
            counts_all_ranks = release_workers(group, encoder.stats if encoder is not None else {})
    if encoder is not None:  # the writer counted nothing itself: every chunk went through the ranks
        report.truncated += counts_all_ranks.get("truncated", 0)
        report.tokens += counts_all_ranks.get("tokens", 0)
        report.padded_tokens += counts_all_ranks.get("padded_tokens", 0)
        if report.truncated:
            logger.warning("%d documents reached the document tower's max length and were truncated", report.truncated)
    limits = encoder.limits if encoder is not None else writer.limits
    return {
        **report.to_dict(),
        "world_size": group.world,
        "backend": group.backend or "single-process",
        "batch_size": limits.texts,  # as run (rank 0's; lowered where a batch ran out of memory)
        "max_batch_tokens": limits.tokens,
        **tower_runtime(embedder),
    }


def tower_runtime(loaded: AsymmetricEmbedder) -> dict[str, Any]:
    """What ``auto`` resolved to: the document tower's precision and attention implementation as loaded."""
    model = loaded.document_model
    config = getattr(getattr(model[0], "auto_model", None), "config", None)
    return {
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "attn_implementation": getattr(config, "_attn_implementation", None),
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m care_retriever.index ...`` (what torchrun starts) is ``care-retriever index ...``."""
    from care_retriever.cli.main import main as cli_main

    return cli_main(["index", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
