"""Sharded indexing through torch.distributed: many processes encode, one writes.

    torchrun --nproc-per-node 8 -m care_retriever.index --model M --corpus C --store S

Encoding the corpus with the LLM document tower is the slow part (hours on GPUs); writing vectors
is not. So rank 0 reads the corpus and runs the ordinary :class:`DocumentStoreWriter` (unchanged
documents skipped by content hash, checkpoints, resume after a kill), and its encoder scatters each
chunk's texts over all ranks: rank ``r`` encodes the disjoint slice ``texts[r::world]`` with the
document tower on its own device, rank 0 gathers the vectors back in order. The result is the index
a single process would build (same ids, same order); killing the job and running the same command
again resumes from rank 0's last checkpoint. NCCL on GPUs, gloo on CPU; across nodes use torchrun's
rendezvous (see docs/scale.md). Without torchrun it is an ordinary single-process run.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from care_retriever.errors import CareError, InputError, ModelError

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
    if backend not in ("nccl", "gloo"):
        raise InputError(f"--backend must be auto, nccl or gloo, got {backend!r}")
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

    def __init__(self, embedder: Any, group: Dist, batch_size: int) -> None:
        self.embedder = embedder
        self.group = group
        self.batch_size = batch_size
        self.truncated = 0

    def _encode_slice(self, texts: list[str]) -> np.ndarray:
        from care_retriever.encoding import encode_texts

        stats: dict[str, int] = {}
        vectors = encode_texts(self.embedder.document_model, texts, batch_size=self.batch_size,
                               desc="Encoding documents", stats=stats)
        self.truncated += stats.get("truncated", 0)
        return vectors

    def __call__(self, texts: list[str]) -> np.ndarray:
        import torch.distributed as dist

        world = self.group.world
        slices = [texts[r::world] for r in range(world)]
        mine: list[Any] = [None]
        dist.scatter_object_list(mine, slices, src=0)
        error: Exception | None = None
        try:
            local: Any = self._encode_slice(mine[0])
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

    def stop(self) -> None:
        """Release the workers (they wait in scatter for the next chunk) and collect their truncation counts."""
        import torch.distributed as dist

        dist.scatter_object_list([None], [None] * self.group.world, src=0)
        counts: list[Any] = [None] * self.group.world
        dist.gather_object(self.truncated, counts, dst=0)
        self.truncated = sum(int(c) for c in counts)


def serve_encoding(embedder: Any, group: Dist, batch_size: int) -> int:
    """A worker rank: encode the slices rank 0 scatters until it sends None; return the truncated count."""
    import torch.distributed as dist

    encoder = ShardedEncoder(embedder, group, batch_size)
    while True:
        mine: list[Any] = [None]
        dist.scatter_object_list(mine, None, src=0)
        if mine[0] is None:
            dist.gather_object(encoder.truncated, None, dst=0)
            return encoder.truncated
        try:
            local: Any = encoder._encode_slice(mine[0])
        except Exception as exc:  # reported to rank 0, which raises it; a bare crash would hang the job
            local = _Failure(group.rank, f"{type(exc).__name__}: {exc}")
        dist.gather_object(local, None, dst=0)


def run_index(
    *,
    model: str,
    corpus: Path,
    store: str,
    collection: str | None = None,
    batch_size: int = 16,
    chunk_size: int = 1024,
    checkpoint_every: int = 8192,
    index_options: dict[str, Any] | None = None,
    prune: bool = False,
    skip_invalid: bool = False,
    device: str | None = None,
    backend: str = "auto",
    timeout_minutes: float = 120.0,
    progress: bool = True,
) -> dict[str, Any] | None:
    """Index ``corpus`` into ``store`` with all ranks of the job; rank 0 returns the report, others None."""
    from care_retriever.embedder import AsymmetricEmbedder

    if batch_size < 1 or chunk_size < 1 or checkpoint_every < 1:
        raise InputError("--batch-size, --chunk-size and --checkpoint-every must be >= 1")
    group, device = init_distributed(backend, device, timeout_minutes)
    try:
        _quiet_transformers()
        embedder = AsymmetricEmbedder.from_pretrained(model, load="document", device=device)
        if group.rank != 0:
            serve_encoding(embedder, group, batch_size)  # returns once rank 0 has released the workers
            return None
        return _write(embedder, group, corpus=corpus, store=store, collection=collection, batch_size=batch_size,
                      chunk_size=chunk_size, checkpoint_every=checkpoint_every, index_options=index_options,
                      prune=prune, skip_invalid=skip_invalid, progress=progress)
    finally:
        if group.active:
            import torch.distributed as dist

            dist.destroy_process_group()


def _write(embedder: Any, group: Dist, *, corpus: Path, store: str, collection: str | None, batch_size: int,
           chunk_size: int, checkpoint_every: int, index_options: dict[str, Any] | None, prune: bool,
           skip_invalid: bool, progress: bool) -> dict[str, Any]:
    from care_retriever.corpus import corpus_file, read_corpus
    from care_retriever.writer import DocumentStoreWriter

    encoder = ShardedEncoder(embedder, group, batch_size) if group.active else None
    try:
        file = corpus_file(corpus)
        # Validate the whole corpus before the first write, so bad input leaves the store untouched.
        total = sum(1 for _ in read_corpus(file, skip_invalid=skip_invalid))
        writer = DocumentStoreWriter(embedder, store, collection=collection, batch_size=batch_size,
                                     chunk_size=chunk_size, checkpoint_every=checkpoint_every,
                                     index_options=index_options, show_progress=progress, encoder=encoder)
        report = writer.write(read_corpus(file, skip_invalid=skip_invalid), total=total, prune_ids_not_in=prune)
        writer.store.close()
    finally:
        if encoder is not None:  # also on error: a worker left waiting in scatter would hang the job
            encoder.stop()
    if encoder is not None:
        report.truncated += encoder.truncated
        if encoder.truncated:
            logger.warning("%d documents reached the document tower's max length and were truncated",
                           encoder.truncated)
    return {**report.to_dict(), "world_size": group.world, "backend": group.backend or "single-process"}


def _quiet_transformers() -> None:
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


@app.command()
def index(
    model: Annotated[str, typer.Option(help="CARE model folder or hub id.")],
    corpus: Annotated[Path, typer.Option(help="JSONL, BEIR folder or text corpus (read by rank 0 only).")],
    store: Annotated[str, typer.Option(help="faiss:DIR | qdrant:PATH | qdrant:http://host:6333")],
    collection: Annotated[str | None, typer.Option(help="Qdrant collection name.")] = None,
    batch_size: Annotated[int, typer.Option(help="Documents per forward pass, per rank.")] = 16,
    chunk_size: Annotated[int, typer.Option(help="Documents per scatter (split over all ranks).")] = 1024,
    checkpoint_every: Annotated[int, typer.Option(help="Checkpoint the store every N encoded documents.")] = 8192,
    index_type: Annotated[str, typer.Option(help="FAISS index: flat | hnsw | ivf.")] = "flat",
    hnsw_m: Annotated[int, typer.Option(help="HNSW neighbours per node.")] = 32,
    nlist: Annotated[int, typer.Option(help="IVF lists.")] = 1024,
    prune: Annotated[bool, typer.Option(help="Also delete stored documents whose id is not in the corpus.")] = False,
    skip_invalid: Annotated[bool, typer.Option(help="Skip invalid rows instead of stopping.")] = False,
    device: Annotated[str | None, typer.Option(help="cpu | cuda (default: cuda:LOCAL_RANK when available).")] = None,
    backend: Annotated[str, typer.Option(help="torch.distributed backend: auto (nccl on GPUs, else gloo).")] = "auto",
    timeout_minutes: Annotated[float, typer.Option(help="Collective timeout (rank 0 validates the corpus "
                                                        "while the others wait).")] = 120.0,
    progress: Annotated[bool, typer.Option(help="Show a progress bar (rank 0).")] = True,
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON (rank 0).")] = False,
) -> None:
    """Encode a corpus over all torchrun ranks and write one FAISS or Qdrant store."""
    options = {"type": index_type, "m": hnsw_m, "nlist": nlist} if store.startswith("faiss:") else None
    report = run_index(model=model, corpus=corpus, store=store, collection=collection, batch_size=batch_size,
                       chunk_size=chunk_size, checkpoint_every=checkpoint_every, index_options=options, prune=prune,
                       skip_invalid=skip_invalid, device=device, backend=backend, timeout_minutes=timeout_minutes,
                       progress=progress)
    if report is None:
        return
    if json_out:
        typer.echo(json.dumps(report, ensure_ascii=False))
    else:
        typer.echo(f"{report['store']}: {report['added']} added, {report['updated']} updated, "
                   f"{report['unchanged']} unchanged, {report['deleted']} deleted; {report['count']} documents "
                   f"({report['docs_per_second']:.1f} docs/s over {report['world_size']} process(es))")


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    try:
        app(args=argv, prog_name="python -m care_retriever.index")
    except CareError as exc:
        if os.environ.get("CARE_DEBUG"):
            raise
        rank = os.environ.get("RANK")
        typer.secho(f"error: {'rank ' + rank + ': ' if rank else ''}{exc}", err=True, fg="red")
        return exc.exit_code
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
