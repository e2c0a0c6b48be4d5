"""``care-retriever copy``: a store into another of any kind (FAISS, Qdrant folder, Qdrant server), re-encoding
nothing (:func:`care_retriever.stores.copying.copy_store`)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from care_retriever import strict_json
from care_retriever.cli.dataclass_options import with_options
from care_retriever.cli.panels import COMMON
from care_retriever.stores.config import STORE_HELP, FaissIndexConfig, QdrantCollectionConfig
from care_retriever.stores.copying import COPY_BATCH, COPY_CHECKPOINT_EVERY
from care_retriever.stores.profiles import ProfileConfig


@with_options(FaissIndexConfig, QdrantCollectionConfig, ProfileConfig)
def copy(
    target: Annotated[str, typer.Option("--to", help=f"The store to write: {STORE_HELP}.", rich_help_panel=COMMON)],
    source: Annotated[
        str | None,
        typer.Option("--from", help=f"The store to copy: {STORE_HELP} (required to copy).", rich_help_panel=COMMON),
    ] = None,
    from_collection: Annotated[
        str | None, typer.Option(help="Qdrant collection of the source.", rich_help_panel=COMMON)
    ] = None,
    to_collection: Annotated[
        str | None, typer.Option(help="Qdrant collection of the target.", rich_help_panel=COMMON)
    ] = None,
    sparse: Annotated[
        bool | None,
        typer.Option(
            "--sparse/--no-sparse", help="Build the target's BM25 side from the copied texts (default: as the source)."
        ),
    ] = None,
    batch_size: Annotated[int, typer.Option(help="Documents read and written at a time.")] = COPY_BATCH,
    checkpoint_every: Annotated[
        int, typer.Option(help="Documents between checkpoints of the target (a killed copy resumes from the last).")
    ] = COPY_CHECKPOINT_EVERY,
    verify: Annotated[
        bool, typer.Option("--verify/--no-verify", help="Read the whole target afterwards.", rich_help_panel=COMMON)
    ] = True,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Show a progress bar.")] = True,
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON.", rich_help_panel=COMMON)] = False,
    discard_pending: Annotated[
        bool,
        typer.Option(
            help="Remove the staged, unpublished copy an unfinished copy (or index run) left beside the target; "
            "the published target is kept. No --from."
        ),
    ] = False,
    options: dict[str, Any] | None = None,
) -> None:
    """Copy a store's vectors, ids, texts and metadata into another store, encoding nothing.

    The target records the source's model fingerprint, width and metric; one of another model is refused.

    The index options (--index-type, --quantize, ...) set a new target's index; without them, a target of the
    source's kind takes the source's. --profile large (or auto, past 2M documents of 768 dims) gives a new target
    vectors on disk and compressed codes in RAM; the options given win over it.

    Re-running finishes a killed or failed copy and writes nothing when the target is up to date. A FAISS target's
    unfinished copy is resumed only by the same copy; any other write there is refused until it is finished or
    discarded (--discard-pending).
    """
    from care_retriever.cli.core import discard_pending_run
    from care_retriever.cli.dataclass_options import values_for
    from care_retriever.cli.index_settings import store_index_config, store_options_given
    from care_retriever.errors import InputError
    from care_retriever.stores.config import StoreSpec
    from care_retriever.stores.copying import copy_store

    if discard_pending:
        discard_pending_run(target, to_collection, json_out)
        return
    if source is None:
        raise InputError("copy: --from is required: the store to copy (or --discard-pending, to drop a pending run)")
    values = options or {}
    target_spec = StoreSpec.parse(target, to_collection)
    index = store_index_config(target_spec, values) if store_options_given(values) else None
    report = copy_store(
        StoreSpec.parse(source, from_collection),
        target_spec,
        index=index,
        sparse=sparse,
        batch=batch_size,
        checkpoint_every=checkpoint_every,
        verify=verify,
        show_progress=progress and not json_out,
        profile=values_for(ProfileConfig, values).profile,
    ).to_dict()
    if json_out:
        typer.echo(strict_json.dumps(report))
        return
    checked = f"; verify: {report['verified']} documents, every check passed" if report["verified"] is not None else ""
    typer.echo(
        f"{report['target']}: {report['copied']} copied, {report['unchanged']} unchanged from {report['source']}; "
        f"{report['count']} documents, BM25 side {report['sparse']} ({report['seconds']:.1f}s, nothing encoded)"
        f"{checked}"
    )


def register(app: typer.Typer) -> None:
    app.command()(copy)
