"""``care-retriever migrate``: a Qdrant store of an earlier release (qdrant-client local mode) into Qdrant Edge."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def migrate(
    source: Annotated[str, typer.Option("--from", help="qdrant:OLD_FOLDER, a store of qdrant-client local mode")],
    target: Annotated[str, typer.Option("--to", help="qdrant:NEW_FOLDER, the Qdrant Edge store to write")],
    collection: Annotated[str | None, typer.Option(help="Qdrant collection name.")] = None,
) -> None:
    """Convert a Qdrant store of an earlier release (local mode) to Qdrant Edge, re-encoding nothing.

    Ids, vectors, payloads, the BM25 side and the model's fingerprint are carried over and the counts verified.

    The old folder is kept as it was."""
    from care_retriever.errors import InputError
    from care_retriever.stores.config import StoreKind, StoreSpec
    from care_retriever.stores.qdrant.common import DEFAULT_COLLECTION, is_server
    from care_retriever.stores.qdrant.migrate import migrate_local

    old, new = StoreSpec.parse(source, collection), StoreSpec.parse(target, collection)
    for spec, side in ((old, "--from"), (new, "--to")):
        if spec.kind is not StoreKind.QDRANT or is_server(spec.location) or spec.location == ":memory:":
            raise InputError(f"{side} takes qdrant:FOLDER (a folder on this machine), got {spec}")
    given = old.collection if collection is None else collection
    name = DEFAULT_COLLECTION if given is None else given
    migrated = migrate_local(Path(old.location), Path(new.location), name)
    typer.echo(
        f"ok: {migrated.describe()} of qdrant:{old.location} (collection {name}) are in qdrant:{new.location}; "
        f"the old folder is unchanged (remove it when done)"
    )


def register(app: typer.Typer) -> None:
    app.command()(migrate)
