"""``care-retriever verify``: read a whole store and check it (opening a store checks only sizes and counts)."""

from __future__ import annotations

from typing import Annotated

import typer


def verify(
    store: Annotated[str, typer.Option(help="faiss:DIR | qdrant:PATH | qdrant:http://host:6333")],
    collection: Annotated[str | None, typer.Option(help="Qdrant collection name.")] = None,
    record_checksums: Annotated[
        bool,
        typer.Option(
            "--record-checksums",
            help="Where a FAISS writer stopped before recording its files' checksums, or a Qdrant Edge manifest was "
            "written without one by an earlier release (verify names them), record them for the files as they are, "
            "once every other check has passed.",
        ),
    ] = False,
) -> None:
    """Check every byte of a store: checksums, docstore integrity, ids, content hashes, vector norms."""
    from care_retriever.errors import StoreError
    from care_retriever.stores import open_store
    from care_retriever.stores.capabilities import Verification
    from care_retriever.stores.config import StoreKind, StoreSpec
    from care_retriever.stores.qdrant.common import DEFAULT_COLLECTION
    from care_retriever.stores.qdrant.edge_opening import check_before_open

    spec = StoreSpec.parse(store)
    if spec.kind is StoreKind.QDRANT:  # an Edge shard's files before its engine reads them: a damaged one can crash it
        named = collection if collection is not None else spec.collection
        check_before_open(spec.location, DEFAULT_COLLECTION if named is None else named, record_checksums)
    opened = open_store(spec, collection=collection, create=False)
    try:
        target = Verification.require(opened, "verify")
        if record_checksums and not target.keeps_checksums:
            raise StoreError(
                f"{target.describe()}: --record-checksums is for FAISS and Qdrant Edge stores; this store keeps none"
            )
        count = target.verify(record_checksums=record_checksums)
    finally:
        opened.close()
    typer.echo(f"ok: {target.describe()} holds {count} documents; every check passed")


def register(app: typer.Typer) -> None:
    app.command()(verify)
