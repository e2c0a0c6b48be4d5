"""A metadata key holding a dot is refused by a store's own ``upsert`` too (FAISS, Qdrant Edge, and the Qdrant server
code path through qdrant-client's local engine), in the one line the writer and the framework adapters give, before
anything is written: filters read a dot as a step into a nested object, on every engine."""

from __future__ import annotations

import numpy as np
import pytest

from care_retriever.documents import Document
from care_retriever.errors import InputError
from care_retriever.stores import open_store

DIM = 4


def _open(kind: str, folder):
    if kind == "qdrant-client local":
        from qdrant_client import QdrantClient

        from care_retriever.stores.qdrant import QdrantStore

        return QdrantStore("http://localhost:6333", client=QdrantClient(location=":memory:"))
    return open_store(f"{kind}:{folder}")


@pytest.mark.filterwarnings("ignore:Payload indexes have no effect")
@pytest.mark.parametrize("kind", ["faiss", "qdrant", "qdrant-client local"])
def test_upsert_refuses_a_dotted_metadata_key_and_writes_nothing(tmp_path, kind: str) -> None:
    pytest.importorskip("qdrant_edge" if kind == "qdrant" else "faiss")
    store = _open(kind, tmp_path / "store")
    store.prepare(DIM, "fp", "model")
    good = Document("ok", "正常", metadata={"a_b": 1})
    bad = Document("bad", "点", metadata={"src": {"l": [{"": 1, "kind.x": 2}]}})  # found at any depth
    with pytest.raises(InputError) as raised:
        store.upsert([good, bad], np.eye(2, DIM, dtype=np.float32))
    message = str(raised.value)
    assert message.startswith("document 'bad': metadata key 'kind.x' holds a '.'") and "\n" not in message
    store.upsert([good], np.eye(1, DIM, dtype=np.float32))  # the store still takes writes: nothing half-written
    store.finalize()
    assert store.count() == 1 and store.get(["bad"]) == [None]
    store.close()
