"""Vector stores: FAISS (embedded default) and Qdrant (Qdrant Edge embedded, or a server).

``open_store`` opens a store spec (:class:`~care_retriever.stores.config.StoreSpec`): ``faiss:DIR``,
``qdrant:PATH``, ``qdrant::memory:`` or ``qdrant:http(s)://host:port``. Qdrant is imported only when a Qdrant spec
is used.

Every store has the core of :class:`~care_retriever.stores.base.VectorStore`; what it does beyond (sparse and
hybrid search, write runs, verify, iteration for copies, index building) is a capability that callers check
(:mod:`care_retriever.stores.capabilities`).
"""

from __future__ import annotations

from care_retriever.errors import StoreError
from care_retriever.stores.base import Hit, Manifest, VectorStore
from care_retriever.stores.config import StoreKind, StoreSpec

SCHEMES = tuple(kind.value for kind in StoreKind)

__all__ = ["SCHEMES", "Hit", "Manifest", "StoreSpec", "VectorStore", "open_store", "parse_store_spec"]


def parse_store_spec(spec: str) -> tuple[str, str]:
    """``(scheme, location)`` of a spec string (:meth:`StoreSpec.parse`)."""
    parsed = StoreSpec.parse(spec)
    return parsed.kind.value, parsed.location


def open_store(
    spec: str | StoreSpec | VectorStore,
    *,
    collection: str | None = None,
    use_gpu: bool | None = None,
    create: bool = True,
) -> VectorStore:
    """Open (or get ready to create) the store named by ``spec``.

    Usage example:
    ```python
    from care_retriever import open_store

    with open_store("faiss:stores/care", create=False) as store:
        print(store.describe(), store.count())
    ```

    :param spec: ``faiss:DIR``, ``qdrant:PATH``, ``qdrant::memory:`` or ``qdrant:http(s)://host:port``, a
        :class:`~care_retriever.stores.config.StoreSpec`, or a store already open (returned as it is).
    :param collection: the Qdrant collection (None: the spec's, else the default).
    :param use_gpu: search a FAISS index on the GPU (None: where FAISS has one).
    :param create: False for reads and deletes: a store that does not exist is one line and nothing is created.
    :returns: the store, a :class:`~care_retriever.stores.base.VectorStore`.
    :raises StoreError: ``create=False`` and the store does not exist.
    """
    if isinstance(spec, VectorStore):
        return spec
    parsed = StoreSpec.parse(spec) if isinstance(spec, str) else spec
    if parsed.kind is StoreKind.FAISS:
        from care_retriever.stores.faiss import FaissStore

        return FaissStore(parsed.location, use_gpu=use_gpu)  # opening a FAISS folder creates nothing
    from care_retriever.stores.qdrant import DEFAULT_COLLECTION, is_server, open_qdrant

    # an empty --collection is a name given (refused where the collection's folder is made), not the default
    given = parsed.collection if collection is None else collection
    name = DEFAULT_COLLECTION if given is None else given
    store = open_qdrant(parsed.location, name)  # an Edge folder is created by prepare, never by opening
    if not create and store.manifest is None and parsed.location != ":memory:" and not is_server(parsed.location):
        store.close()
        raise StoreError(
            f"qdrant:{parsed.location} (collection {name}): store is empty or does not exist "
            "(run `care-retriever index` first)"
        )
    return store
