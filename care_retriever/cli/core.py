"""Core commands: ``init``, ``index``, ``info``, ``delete``; ``search`` is in :mod:`care_retriever.cli.searching`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from care_retriever import strict_json
from care_retriever.cli.dataclass_options import with_options
from care_retriever.cli.options import TrustRemoteCode
from care_retriever.cli.panels import COMMON
from care_retriever.errors import CareError, InputError, ModelError
from care_retriever.indexing.settings import index_options_classes
from care_retriever.model.pairing import TowerPairing
from care_retriever.model.towers.loading import quiet_transformers

if TYPE_CHECKING:
    from care_retriever.model.embedder import AsymmetricEmbedder


def init(
    out: Annotated[Path, typer.Argument(help="Folder to create the model in.")],
    preset: Annotated[
        str | None,
        typer.Option(help="From scratch: tiny | mini | base (random weights).", rich_help_panel=COMMON),
    ] = None,
    vocab_from: Annotated[
        list[Path] | None,
        typer.Option(
            "--vocab-from",
            help="JSONL or text file(s) to train the tokenizers on (with --preset).",
            rich_help_panel=COMMON,
        ),
    ] = None,
    query_model: Annotated[
        str | None, typer.Option(help="Pretrained query tower: hub id or folder.", rich_help_panel=COMMON)
    ] = None,
    document_model: Annotated[
        str | None, typer.Option(help="Pretrained document tower: hub id or folder.", rich_help_panel=COMMON)
    ] = None,
    symmetric: Annotated[bool, typer.Option(help="One tower on both sides (baselines).")] = False,
    query_pooling: Annotated[
        str | None,
        typer.Option(
            help="cls | mean | last_token (default: the folder's own pooling, else cls for encoders and "
            "last_token for decoders)."
        ),
    ] = None,
    document_pooling: Annotated[
        str | None,
        typer.Option(help="cls | mean | last_token (default: the folder's own pooling, else last_token)."),
    ] = None,
    document_adapter: Annotated[
        str | None, typer.Option(help="LoRA adapter (peft) to load onto the document tower and merge.")
    ] = None,
    max_length: Annotated[int, typer.Option(help="Max tokens per text.")] = 512,
    seed: Annotated[int, typer.Option(help="Seed for random weights.")] = 0,
    trust_remote_code: TrustRemoteCode = False,
    allow_pickled_weights: Annotated[
        bool,
        typer.Option(
            help="Read a tower stored only as pytorch_model.bin (through torch's weights-only loader); "
            "off by default: safetensors only."
        ),
    ] = False,
    from_release: Annotated[
        str | None,
        typer.Option(
            help="Convert a model in the authors' release layout (query_encoder/ + doc_encoder/; a folder or "
            "hub id such as PhilipGAQ/CARE-0.3B-4B) into this package's format, keeping the authors' conventions.",
            rich_help_panel=COMMON,
        ),
    ] = None,
    convention: Annotated[
        str | None,
        typer.Option(
            help="With --query-model/--document-model: 'authors-release' reads the towers with the conventions "
            "of the authors' released models (e.g. a base model plus the adapter their trainer saved)."
        ),
    ] = None,
    force: Annotated[bool, typer.Option(help="Replace OUT if it exists.", rich_help_panel=COMMON)] = False,
) -> None:
    """Create a CARE model: from two pretrained towers, from scratch with --preset, or from a released model."""
    if out.exists() and any(out.iterdir()) and not force:
        raise InputError(f"{out}: exists and is not empty (use --force to replace it)")
    quiet_transformers()
    if from_release is not None:
        if preset or query_model or document_model or convention:
            raise InputError("--from-release converts a released model as it is; drop the other tower options")
        from care_retriever.model.embedder import AsymmetricEmbedder

        typer.echo(f"Reading {from_release} in the authors' release layout ...", err=True)
        embedder = AsymmetricEmbedder.from_release(
            from_release,
            dtype="saved",  # each tower in its own dtype, whatever the device (a GPU would make both bf16)
            trust_remote_code=trust_remote_code,
            allow_pickled_weights=allow_pickled_weights,
        )
    elif preset is not None:
        if query_model or document_model:
            raise InputError("use either --preset (from scratch) or --query-model/--document-model, not both")
        if not vocab_from:
            raise InputError("--preset needs --vocab-from FILE (a JSONL corpus or plain text) to train tokenizers")
        from care_retriever.model.scratch import init_from_scratch
        from care_retriever.model.towers.presets import get_preset

        try:
            get_preset(preset)
        except ValueError as exc:
            raise InputError(str(exc)) from exc
        typer.echo(f"Training tokenizers and building a random '{preset}' model ...", err=True)
        try:
            embedder = init_from_scratch(preset, vocab_from, seed=seed)
        except ValueError as exc:
            raise InputError(str(exc)) from exc
    else:
        if not query_model:
            raise InputError("give --preset tiny|mini|base (from scratch) or --query-model (pretrained)")
        if symmetric and document_model:
            raise InputError("--symmetric uses the query tower on both sides; drop --document-model")
        if not symmetric and not document_model:
            raise InputError("--document-model is required (or pass --symmetric for a one-tower baseline)")
        from care_retriever.model.embedder import AsymmetricEmbedder

        pairing = TowerPairing(
            query_pooling=query_pooling,
            document_pooling=document_pooling,
            document_adapter=document_adapter,
            max_length=max_length,
            trust_remote_code=trust_remote_code,
            allow_pickled_weights=allow_pickled_weights,
            convention=convention,
        )
        # each tower in its own dtype, whatever the device (a GPU would make both bf16)
        embedder = AsymmetricEmbedder.from_towers(
            query_model, None if symmetric else document_model, pairing, dtype="saved"
        )
    check_encodes(embedder)  # a model that cannot encode is never written
    embedder.save_pretrained(out)
    typer.echo(f"Saved {embedder.mode} model to {out}: dim={embedder.dim}, document tower {embedder.document_dim} dims")


def check_encodes(embedder: AsymmetricEmbedder) -> None:
    """Both towers encode a text, or one line says which cannot (e.g. model code written for another transformers)."""
    for side, encode in (("query", embedder.embed_queries), ("document", embedder.embed_documents)):
        try:
            encode(["高血压患者应低盐饮食 test"])
        except CareError:
            raise
        except Exception as exc:  # whatever the tower's own code raises: said in one line, nothing written
            reason = str(exc).splitlines()[0] if str(exc) else ""
            raise ModelError(
                f"the {side} tower cannot encode a text ({type(exc).__name__}: {reason}); nothing was written"
            ) from exc


@with_options(*index_options_classes())
def index(
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the report as JSON (rank 0).", rich_help_panel=COMMON)
    ] = False,
    sparse_only: Annotated[
        bool,
        typer.Option(
            help="Add (or rebuild) the BM25 side of an existing store from its stored texts; "
            "no model, nothing re-encoded."
        ),
    ] = False,
    discard_pending: Annotated[
        bool,
        typer.Option(
            help="Remove the staged, unpublished copy an unfinished run left beside the store; "
            "the published store is kept. No model, no corpus."
        ),
    ] = False,
    options: dict[str, Any] | None = None,
) -> None:
    """Encode a corpus with the document tower and write it into a FAISS or Qdrant store.

    Under ``torchrun ... -m care_retriever.index`` (same options) every rank encodes a slice of each chunk.
    """
    # The other options are generated from IndexSettings and its configs' fields (care_retriever.cli.dataclass_options).
    from care_retriever.cli.index_settings import settings_from_options
    from care_retriever.indexing.run import run_index

    values = options or {}
    if discard_pending:
        discard_pending_run(values["store"], values["collection"], json_out)
        return
    if sparse_only:
        _add_sparse_side(values["store"], values["collection"], values["progress"], json_out)
        return
    settings = settings_from_options(values)
    report = run_index(settings)
    if report is None:  # a worker rank: rank 0 reports
        return
    if json_out:
        typer.echo(strict_json.dumps(report))
        return
    over = f" over {report['world_size']} processes" if report["world_size"] > 1 else ""
    n = report["skipped_invalid"]
    skipped = f"; {n} invalid row(s) skipped (first: {report['first_skipped']})" if n else ""
    typer.echo(
        f"{report['store']}: {report['added']} added, {report['updated']} updated, {report['unchanged']} unchanged, "
        f"{report['deleted']} deleted; {report['count']} documents ({report['docs_per_second']:.1f} docs/s "
        f"encoded{over}){skipped}"
    )


def discard_pending_run(store: str, collection: str | None, json_out: bool) -> None:
    """``index --discard-pending`` / ``copy --discard-pending``: drop what an unfinished run (of either command)
    staged beside ``store`` (care_retriever.stores.runs)."""
    from care_retriever.stores import open_store
    from care_retriever.stores.capabilities import WriteRuns

    target = open_store(store, collection=collection, create=False)
    try:
        # a store that writes no runs has none pending
        discarded = target.discard_pending() if isinstance(target, WriteRuns) else None
        count = target.count()
    finally:
        target.close()
    if json_out:
        typer.echo(strict_json.dumps({"store": target.describe(), "discarded": discarded, "count": count}))
    elif discarded:
        typer.echo(f"{discarded}: discarded; the published store holds {count} documents")
    else:
        typer.echo(f"{target.describe()}: no unfinished run is pending; the store holds {count} documents")


def _add_sparse_side(store: str, collection: str | None, progress: bool, json_out: bool) -> None:
    """``index --sparse-only``: the BM25 side of an existing store, written in one publish (care_retriever.sparse)."""
    import time

    from care_retriever.stores import open_store
    from care_retriever.stores.capabilities import SparseSearch, WriteRuns
    from care_retriever.stores.runs import RunTag

    opened = open_store(store, collection=collection)
    start = time.perf_counter()
    try:
        target = SparseSearch.require(opened, "index --sparse-only")
        runs = WriteRuns.require(opened, "index --sparse-only")
        manifest = target.require_manifest()
        # a run of its own: it neither resumes nor publishes another run's staged copy
        runs.claim_run(
            RunTag("index --sparse-only", space_fingerprint=manifest.space_fingerprint, model_name=manifest.model_name)
        )
        target.prepare(manifest.dim, manifest.space_fingerprint, manifest.model_name)
        tokenized = target.enable_sparse(show_progress=progress)
        runs.finalize()  # publishes both sides at once; a failure above leaves the published store as it was
        report = {
            "store": target.describe(),
            "tokenized": tokenized,
            "count": target.count(),
            "seconds": round(time.perf_counter() - start, 3),
            "sparse": target.require_manifest().sparse,
        }
    finally:
        opened.close()
    if json_out:
        typer.echo(strict_json.dumps(report))
    elif tokenized:
        typer.echo(f"{report['store']}: BM25 side built over {tokenized} documents in {report['seconds']:.1f}s")
    else:
        typer.echo(
            f"{report['store']}: BM25 side already present (tokenizer {manifest.sparse['tokenizer']['name']} "
            f"v{manifest.sparse['tokenizer']['version']}); nothing to do"
        )


def info(
    store: Annotated[str, typer.Option(help="faiss:DIR | qdrant:PATH | qdrant:http://host:6333")],
    collection: Annotated[str | None, typer.Option(help="Qdrant collection name.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Describe a store: engine, model fingerprint, dim, metric, count, index, versions."""
    from care_retriever.stores import open_store

    target = open_store(store, collection=collection, create=False)
    manifest = target.require_manifest()
    data = {**manifest.to_dict(), "live_count": target.count(), "store": target.describe()}
    # the documents the store holds, as verify counts them (a manifest's count can lag a write that failed half-way)
    data["count"] = data["live_count"]
    footprint = getattr(target, "footprint", None)  # FAISS: quantization, bytes per document in RAM and on disk
    if footprint is not None:
        data["footprint"] = footprint()
    settings = getattr(target, "collection_settings", None)  # Qdrant: the collection's settings as Qdrant reports them
    if settings is not None:
        data["collection"] = settings()
    target.close()
    if json_out:
        typer.echo(strict_json.dumps(data, indent=2))
        return
    labels = {"backend": "engine"}  # the manifest's name for it (--json prints the manifest's names)
    for key in (
        "store",
        "backend",
        "model_name",
        "space_fingerprint",
        "dim",
        "metric",
        "count",
        "index",
        "sparse",
        "versions",
    ):
        typer.echo(f"{labels.get(key, key):>18}: {data[key]}")
    if "collection" in data:
        typer.echo(f"{'collection':>18}: {data['collection']}")
    if "footprint" in data:
        fp = data["footprint"]
        over = f", oversample {fp['oversample']:g}" if fp.get("oversample") else ""
        typer.echo(f"{'quantization':>18}: {fp['quantize']}{over}")
        typer.echo(
            f"{'bytes per doc':>18}: {fp['ram_bytes_per_doc']:,.0f} in RAM (index searched), "
            f"{fp['disk_bytes_per_doc']:,.0f} on disk (all files)"
        )


def delete(
    ids: Annotated[list[str], typer.Argument(help="Document ids to delete.")],
    store: Annotated[str, typer.Option(help="faiss:DIR | qdrant:PATH | qdrant:http://host:6333")],
    collection: Annotated[str | None, typer.Option(help="Qdrant collection name.")] = None,
) -> None:
    """Delete documents by id (no model needed)."""
    from care_retriever.stores import open_store
    from care_retriever.stores.capabilities import WriteRuns

    opened = open_store(store, collection=collection, create=False)
    try:
        target = WriteRuns.require(opened, "delete")
        manifest = target.require_manifest()
        with target.transaction(manifest.dim, manifest.space_fingerprint, manifest.model_name):
            removed = target.delete(ids)
        remaining = target.count()
    finally:
        opened.close()
    typer.echo(f"deleted {removed} of {len(ids)} ids; the store now holds {remaining} documents")


def register(app: typer.Typer) -> None:
    from care_retriever.cli.searching import search

    app.command()(init)
    app.command()(index)
    app.command()(search)
    app.command()(info)
    app.command()(delete)


__all__ = ["ModelError", "register"]
