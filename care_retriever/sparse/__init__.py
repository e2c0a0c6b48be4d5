"""The sparse (BM25) side of a store, and hybrid search: one tokenizer, the FAISS store's inverted
index, Qdrant's sparse vectors, and fusion of the dense and sparse rankings.

A store has a sparse side when its manifest's ``sparse`` entry is set; it records the tokenizer
(:func:`~care_retriever.sparse.tokenizer.tokenizer_spec`) and the BM25 parameters.
"""

from __future__ import annotations

from typing import Any, Protocol

from care_retriever.errors import StoreError
from care_retriever.sparse.fusion import FUSIONS, MODES, FusionConfig, check_mode, fuse
from care_retriever.sparse.tokenizer import check_spec, tokenizer_spec

__all__ = ["FUSIONS", "MODES", "FusionConfig", "check_mode", "fuse", "require_sparse", "sparse_entry"]

ADD_COMMAND = "care-retriever index --sparse-only --store {spec}"


class NamedStore(Protocol):
    """What the sparse side reads of a store (every store has both): its name and its manifest. A protocol, so
    the BM25 side, below the stores, imports none of them."""

    def describe(self) -> str: ...

    def require_manifest(self) -> Any: ...


def sparse_entry(kind: str, **params: Any) -> dict[str, Any]:
    """The manifest's ``sparse`` entry for a newly built sparse side."""
    from care_retriever.sparse.sqlite_bm25 import K1, B

    return {"kind": kind, "tokenizer": tokenizer_spec(), "k1": K1, "b": B, **params}


def store_spec(store: NamedStore) -> str:
    """``faiss:DIR`` / ``qdrant:PATH`` for messages that name a command to run."""
    described = store.describe()
    spec, _, collection = described.partition(" (collection ")
    collection = collection.rstrip(")")
    return f"{spec} --collection {collection}" if collection and collection != "care" else spec


def require_sparse(store: NamedStore) -> dict[str, Any]:
    """The store's sparse entry; a one-line error naming the command that adds it when there is none."""
    manifest = store.require_manifest()
    entry = manifest.sparse
    if not entry:
        raise StoreError(
            f"{store.describe()} has no sparse (BM25) side; add it with `{ADD_COMMAND.format(spec=store_spec(store))}` "
            "(re-encodes nothing)"
        )
    check_spec(entry.get("tokenizer"), store.describe())
    return entry
