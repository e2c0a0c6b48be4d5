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
(:class:`IndexSettings`), one :func:`run_index`; the entry torchrun starts, ``python -m care_retriever.index ARGS``,
is ``care-retriever index ARGS``.
"""

from __future__ import annotations

import datetime
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from care_retriever.errors import InputError, ModelError
from care_retriever.indexing.config import SPARSE, CorpusConfig, EncodeConfig
from care_retriever.model.loading import TRUST_REMOTE_CODE_HELP
from care_retriever.model.settings import COMMON_PANEL, CORPUS_PANEL, meta
from care_retriever.stores.config import STORE_HELP, FaissIndexConfig, QdrantCollectionConfig, StoreKind, StoreSpec

if TYPE_CHECKING:  # numpy too: the CLI reads IndexSettings' defaults when it starts, and imports nothing heavy
    import numpy as np

    from care_retriever.model.embedder import AsymmetricEmbedder
    from care_retriever.model.protocols import DocumentEncoder

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
        from care_retriever.model.forward import prepare_encoder_forward

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


@dataclass(frozen=True)
class IndexSettings:
    """The one option set of ``care-retriever index`` and ``torchrun -m care_retriever.index``: the store, its index
    or collection settings, the encoding, and the run. Checked once, when it is built; the command's flags are
    generated from these fields and from the configs' (:func:`index_options_classes`), and read back into these
    settings by :func:`care_retriever.cli.index_settings.settings_from_options`."""

    store: StoreSpec = field(metadata=meta(STORE_HELP, panel=COMMON_PANEL))  # a spec string is parsed
    model: str | None = field(default=None, metadata=meta("CARE model folder or hub id.", panel=COMMON_PANEL))
    corpus: Path | None = field(
        default=None,
        metadata=meta(
            "Corpus: JSONL or a JSON array ({_id|id, text, title?, metadata?}), CSV/TSV with a header, Parquet, a "
            "saved Hugging Face dataset folder, a BEIR folder, or .txt (one document per line); see --format.",
            panel=COMMON_PANEL,
        ),
    )
    reader: CorpusConfig = field(default_factory=CorpusConfig)  # how the corpus is read (--format, --id-field ...)
    # the store's settings (None: the defaults of the store's kind); kept in its manifest
    index: FaissIndexConfig | QdrantCollectionConfig | None = field(default=None, metadata=meta(cli=False))
    encode: EncodeConfig = field(default_factory=EncodeConfig)
    update: bool = field(
        default=False,
        metadata=meta(
            "Update an existing store: fail if STORE holds no index yet (a mistyped path). "
            "Unchanged documents are skipped with or without it.",
            panel=COMMON_PANEL,
        ),
    )
    prune: bool = field(default=False, metadata=meta("Also delete stored documents whose id is not in the corpus."))
    yes: bool = field(
        default=False,
        metadata=meta(
            "With --prune: delete even when more stored documents would go than the store keeps (without it such a "
            "run stops before writing anything).",
            flag="--yes",
        ),
    )
    skip_invalid: bool = field(
        default=False, metadata=meta("Skip invalid rows instead of stopping at the first.", panel=CORPUS_PANEL)
    )
    device: str | None = field(
        default=None,
        metadata=meta("cpu | cuda | cuda:N (default: auto; cuda:LOCAL_RANK under torchrun).", panel=COMMON_PANEL),
    )
    backend: str = field(
        default="auto", metadata=meta("Backend under torchrun: auto (nccl on GPUs, else gloo), nccl, gloo.")
    )
    timeout_minutes: float = field(
        default=120.0,
        metadata=meta("Collective timeout under torchrun (the others wait while rank 0 reads the corpus)."),
    )
    progress: bool = field(default=True, metadata=meta("Show a progress bar (rank 0)."))
    sparse: bool = field(
        default=SPARSE, metadata=meta("Also write the BM25 side for --mode sparse|hybrid searches (docs/hybrid.md).")
    )
    # a document tower whose model code ships with it (every rank loads it)
    trust_remote_code: bool = field(default=False, metadata=meta(TRUST_REMOTE_CODE_HELP, flag="--trust-remote-code"))

    def __post_init__(self) -> None:
        """Every check that needs neither the corpus nor the model: a bad option fails before any work."""
        if isinstance(self.store, str):
            object.__setattr__(self, "store", StoreSpec.parse(self.store))
        if self.model is None or self.corpus is None:
            raise InputError("index needs --model and --corpus (or --sparse-only to add the BM25 side of a store)")
        wanted = FaissIndexConfig if self.store.kind is StoreKind.FAISS else QdrantCollectionConfig
        if self.index is None:
            object.__setattr__(self, "index", wanted())
        elif not isinstance(self.index, wanted):
            raise InputError(f"{self.store} takes a {wanted.__name__}, got a {type(self.index).__name__}")
        if self.backend not in BACKENDS:
            raise InputError(f"Unknown --backend {self.backend!r}. Available backends: {list(BACKENDS)}")
        if not self.timeout_minutes > 0:
            raise InputError(f"--timeout-minutes must be > 0, got {self.timeout_minutes}")


def index_options_classes() -> tuple[type, ...]:
    """The classes whose fields are the ``index`` command's options, in the order ``--help`` lists them."""
    return (IndexSettings, StoreSpec, CorpusConfig, EncodeConfig, FaissIndexConfig, QdrantCollectionConfig)


def run_index(settings: IndexSettings) -> dict[str, Any] | None:
    """Index ``settings.corpus`` into ``settings.store`` with every rank of the job (one without torchrun).

    Rank 0 returns the report; the other ranks return None once rank 0 has released them.
    """
    group, device = init_distributed(settings.backend, settings.device, settings.timeout_minutes)
    try:
        if group.rank != 0:
            serve_encoding(load_document_tower(settings, device), group, settings.encode)
            return None
        return _write(settings, group, device)
    finally:
        if group.active:
            import torch.distributed as dist

            dist.destroy_process_group()


def load_document_tower(settings: IndexSettings, device: str | None) -> AsymmetricEmbedder:
    from care_retriever.model.embedder import AsymmetricEmbedder
    from care_retriever.model.loading import quiet_transformers

    quiet_transformers()
    assert settings.model is not None  # IndexSettings refuses a run without one
    return AsymmetricEmbedder.from_pretrained(
        settings.model,
        load="document",
        device=device,
        trust_remote_code=settings.trust_remote_code,
        dtype=settings.encode.dtype,
        attn_implementation=settings.encode.attn_implementation,
    )


def _write(settings: IndexSettings, group: Dist, device: str | None) -> dict[str, Any]:
    """Rank 0: validate the corpus and the store, then run the writer (its chunks scattered over the ranks)."""
    from care_retriever.indexing.checks import check_prune, check_storable
    from care_retriever.indexing.corpus import SkippedRows, corpus_file, read_corpus
    from care_retriever.indexing.space import check_store_space
    from care_retriever.indexing.writer import DocumentStoreWriter
    from care_retriever.stores import open_store
    from care_retriever.stores.training_sample import require_training_sample

    encoder: ShardedEncoder | None = None
    target = None
    counts_all_ranks: dict[str, int] = {}
    try:
        assert settings.corpus is not None  # IndexSettings refuses a run without one
        file = corpus_file(settings.corpus, settings.reader.format)
        # Validate the whole corpus before the first write (each document as the writer will check it), so bad
        # input leaves the store untouched: no checkpoint of a run that cannot finish is left staged.
        total, corpus_ids, skipped = 0, set(), SkippedRows()
        for document in read_corpus(file, settings.reader, skip_invalid=settings.skip_invalid, skipped=skipped):
            try:
                check_storable(document)
            except InputError as exc:
                raise InputError(f"{file}: {exc}; nothing was written") from exc
            total += 1
            if settings.prune:  # the ids --prune keeps
                corpus_ids.add(document.id)
        target = open_store(settings.store)
        if settings.update and target.manifest is None:
            raise InputError(
                f"--update: {target.describe()} holds no index yet (a mistyped path?); drop --update to build a new one"
            )
        if settings.prune:
            check_prune(target, corpus_ids, confirmed=settings.yes)
        embedder = load_document_tower(settings, device)
        # a new index that trains on its first vectors gets enough of them, or one line says what to do instead
        require_training_sample(target, embedder.dim, settings.index, total, str(file))
        # the disk holds what the run will write, or one line says so before anything is encoded
        check_store_space(
            target, total=total, corpus=file, dim=embedder.dim, sparse=settings.sparse, index=settings.index
        )
        encoder = ShardedEncoder(embedder, group, settings.encode) if group.active else None
        writer = DocumentStoreWriter(
            embedder,
            target,
            encode=settings.encode,  # the typed configs, as the command line built them, whole
            index=settings.index,
            show_progress=settings.progress,
            encoder=encoder,
            sparse=settings.sparse,
        )
        report = writer.write(
            read_corpus(file, settings.reader, skip_invalid=settings.skip_invalid),
            total=total,
            prune_ids_not_in=settings.prune,
            source=str(file.resolve()),
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
        "skipped_invalid": skipped.count,  # rows --skip-invalid skipped (the reading above counted them)
        "first_skipped": skipped.first or None,
        "world_size": group.world,
        "backend": group.backend or "single-process",
        "batch_size": limits.texts,  # as run (rank 0's; lowered where a batch ran out of memory)
        "max_batch_tokens": limits.tokens,
        **tower_runtime(embedder),
    }


def tower_runtime(loaded: AsymmetricEmbedder) -> dict[str, Any]:
    """What ``auto`` resolved to: the document tower's precision and attention implementation as loaded, and how its
    forward passes ran (:class:`care_retriever.model.forward.ForwardState`: ``forward``, ``attention``, ``compile``,
    ``compile_seconds``, ``padded_because``, ``norms``)."""
    from care_retriever.model.forward import forward_state

    model = loaded.document_model
    config = getattr(getattr(model[0], "auto_model", None), "config", None)
    state = forward_state(model)  # the forward path (packed / padded), FP8 and compile state, compile seconds
    return {
        "dtype": state.dtype,
        "attn_implementation": getattr(config, "_attn_implementation", None),
        **{k: v for k, v in state.to_dict().items() if k != "dtype"},
    }
