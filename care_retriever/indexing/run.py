"""``care-retriever index``: one process, or every rank of a torchrun job (:mod:`care_retriever.indexing.distributed`),
from one :class:`~care_retriever.indexing.settings.IndexSettings`."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from care_retriever.errors import InputError
from care_retriever.indexing.distributed import Dist, ShardedEncoder, init_distributed, release_workers, serve_encoding
from care_retriever.indexing.settings import IndexSettings

if TYPE_CHECKING:
    from care_retriever.model.embedder import AsymmetricEmbedder

logger = logging.getLogger("care_retriever")


def run_index(settings: IndexSettings) -> dict[str, Any] | None:
    """Index ``settings.corpus`` into ``settings.store`` with every rank of the job (one without torchrun).

    Rank 0 returns the report; the other ranks return None once rank 0 has released them.
    """
    group, device = init_distributed(settings.dist_backend, settings.device, settings.timeout_minutes)
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
    from care_retriever.model.towers.loading import quiet_transformers

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
    from care_retriever.stores.profiles import profile_config
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
        index = settings.index
        assert index is not None  # IndexSettings gives the store kind's defaults
        profile = settings.profile.profile if target.manifest is None else None
        if profile is not None:  # a new store's settings from the corpus's size (the options given win)
            index = profile_config(profile, index, n=total, dim=embedder.dim)
        # a new index that trains on its first vectors gets enough of them, or one line says what to do instead
        require_training_sample(target, embedder.dim, index, total, str(file), profile)
        # the disk holds what the run will write, or one line says so before anything is encoded
        check_store_space(target, total=total, corpus=file, dim=embedder.dim, sparse=settings.sparse, index=index)
        encoder = ShardedEncoder(embedder, group, settings.encode) if group.active else None
        writer = DocumentStoreWriter(
            embedder,
            target,
            encode=settings.encode,  # the typed configs, as the command line built them, whole
            index=index,
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
        "dist_backend": group.backend or "single-process",  # --dist-backend as run
        "batch_size": limits.texts,  # as run (rank 0's; lowered where a batch ran out of memory)
        "max_batch_tokens": limits.tokens,
        **tower_runtime(embedder),
    }


def tower_runtime(loaded: AsymmetricEmbedder) -> dict[str, Any]:
    """What ``auto`` resolved to: the document tower's precision and attention implementation as loaded, and how its
    forward passes ran (:class:`care_retriever.runtime.forward.ForwardState`: ``forward``, ``attention``, ``compile``,
    ``compile_seconds``, ``padded_because``, ``norms``)."""
    from care_retriever.runtime.forward import forward_state

    model = loaded.document_model
    config = getattr(getattr(model[0], "auto_model", None), "config", None)
    state = forward_state(model)  # the forward path (packed / padded), FP8 and compile state, compile seconds
    return {
        "dtype": state.dtype,
        "attn_implementation": getattr(config, "_attn_implementation", None),
        **{k: v for k, v in state.to_dict().items() if k != "dtype"},
    }
