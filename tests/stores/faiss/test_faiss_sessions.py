"""FaissStore's write modes as session objects: no state of one write reaches the store or the next write.

A staged write (``prepare``) and an in-place write (``begin`` on a published store) each own their state in a
session object; the store keeps the read state. These tests abort writes of each mode and check that the store
reads as before and the next write starts clean, that one store object opens one write at a time, that a store
with no write open refuses writes, and that no operation adds an attribute the constructors did not set.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from care_retriever.errors import StoreError
from care_retriever.indexing.corpus import Document
from care_retriever.stores.config import FaissIndexConfig, IndexType, Quantize
from care_retriever.stores.faiss import DELTA, FaissStore
from care_retriever.stores.faiss.session import InPlaceWrite, StagedWrite

DIM = 8
FINGERPRINT = "sessions-test"


def _docs(prefix: str, n: int, seed: int) -> tuple[list[Document], np.ndarray]:
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((n, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return [Document(f"{prefix}{i}", f"{prefix} text {i}") for i in range(n)], vectors


def _published(folder: Path, index: FaissIndexConfig | None = None) -> tuple[list[Document], np.ndarray]:
    docs, vectors = _docs("a", 6, seed=0)
    store = FaissStore(folder)
    store.prepare(DIM, FINGERPRINT, "m", index)
    store.upsert(docs, vectors)
    store.finalize()
    store.close()
    return docs, vectors


def _snapshot(store: FaissStore, queries: np.ndarray) -> tuple[int, list[list[tuple[str, float]]], list[str]]:
    hits = [[(h.id, round(h.score, 5)) for h in row] for row in store.search(queries, 4)]
    return store.count(), hits, sorted(d.id for d in store.iter_documents())


def _one_line_store_error(call: Callable[[], object], match: str) -> None:
    with pytest.raises(StoreError, match=match) as caught:
        call()
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("index", [None, FaissIndexConfig(index_type=IndexType.HNSW)])
def test_an_aborted_staged_write_leaves_the_store_as_it_was_and_the_next_one_starts_clean(
    tmp_path: Path, index: FaissIndexConfig | None
) -> None:
    folder = tmp_path / "s"
    docs, vectors = _published(folder, index)
    queries = vectors[:3]
    store = FaissStore(folder)
    before = _snapshot(store, queries)
    new, new_vectors = _docs("b", 4, seed=1)
    store.prepare(DIM, FINGERPRINT, "m", index)
    store.upsert(new, new_vectors)
    store.delete(["a0", "a1"])  # HNSW: tombstones of the staged version, never of the published one
    store.commit()
    store.abort()
    assert not store.staging.exists()
    assert _snapshot(store, queries) == before
    store.prepare(DIM, FINGERPRINT, "m", index)  # a fresh copy of the published version
    assert store.count() == len(docs)
    assert store.content_hashes([d.id for d in new]) == {}
    assert _snapshot(store, queries) == before
    store.finalize()
    assert _snapshot(store, queries) == before
    store.close()
    with FaissStore(folder) as reopened:
        assert _snapshot(reopened, queries) == before
        assert reopened.verify() == len(docs)


def test_an_aborted_in_place_write_leaves_nothing_for_the_next_transaction(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    docs, vectors = _published(folder)
    queries = vectors[:3]
    store = FaissStore(folder)
    before = _snapshot(store, queries)
    new, new_vectors = _docs("b", 3, seed=1)
    with pytest.raises(RuntimeError, match="fail inside"), store.transaction() as tx:
        tx.upsert(new, new_vectors)
        tx.delete(["a0"])
        raise RuntimeError("fail inside")
    assert _snapshot(store, queries) == before
    with store.transaction() as tx:  # commits its own change alone: the aborted records are not in the delta
        tx.upsert(new[:1], new_vectors[:1])
    assert (folder / DELTA).stat().st_size > 0
    store.close()
    with FaissStore(folder) as reopened:  # replays the delta from disk
        assert sorted(d.id for d in reopened.iter_documents()) == sorted([d.id for d in docs] + ["b0"])
        assert reopened.verify() == len(docs) + 1
        np.testing.assert_allclose(reopened.vectors(["b0", "a0"]), [new_vectors[0], vectors[0]], atol=1e-6)


def test_one_write_at_a_time(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    _published(folder)
    store = FaissStore(folder)
    store.begin(DIM, FINGERPRINT, "m")
    _one_line_store_error(lambda: store.begin(DIM, FINGERPRINT, "m"), "a write is already open")
    _one_line_store_error(lambda: store.prepare(DIM, FINGERPRINT, "m"), "a write is already open")
    other = FaissStore(folder)  # another object (or process): the writer lock
    _one_line_store_error(lambda: other.prepare(DIM, FINGERPRINT, "m"), "another writer")
    store.abort()
    store.prepare(DIM, FINGERPRINT, "m")
    _one_line_store_error(lambda: store.begin(DIM, FINGERPRINT, "m"), "a write is already open")
    store.abort()
    other.begin(DIM, FINGERPRINT, "m")  # the lock went with the aborted writes
    other.abort()
    store.close()
    other.close()


def test_a_store_with_no_write_open_refuses_writes_in_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    docs, vectors = _published(folder)
    store = FaissStore(folder)
    for write in (
        lambda: store.upsert(docs[:1], vectors[:1]),
        lambda: store.delete(["a0"]),
        store.commit,
        store.finalize,
        store.enable_sparse,
    ):
        _one_line_store_error(write, "call prepare\\(\\) before writing")
    store.begin(DIM, FINGERPRINT, "m")
    store.finalize()
    _one_line_store_error(lambda: store.delete(["a0"]), "call prepare\\(\\) before writing")  # a finished write
    assert store.count() == len(docs)
    store.close()


def test_a_resumed_checkpoint_is_not_read_through_the_published_version_state(tmp_path: Path) -> None:
    """The published version's caches (here the id order vectors() sorts once) are not the staged version's."""
    folder = tmp_path / "s"
    _docs_published, vectors = _published(folder)
    new, new_vectors = _docs("b", 5, seed=1)
    writer = FaissStore(folder)
    writer.prepare(DIM, FINGERPRINT, "m")
    writer.delete(["a0", "a1", "a2", "a3", "a4", "a5"])
    writer.upsert(new, new_vectors)
    writer.commit()
    writer.close()  # a killed run: its checkpoint waits in the staging folder
    store = FaissStore(folder)
    np.testing.assert_allclose(store.vectors(["a0"])[0], vectors[0], atol=1e-6)  # the published version
    store.prepare(DIM, FINGERPRINT, "m")  # resumes the checkpoint
    got = store.vectors([d.id for d in new] + ["a0"])
    assert got[-1] is None
    np.testing.assert_allclose(np.stack([g for g in got[:-1] if g is not None]), new_vectors, atol=1e-6)
    store.abort()
    store.close()


@pytest.mark.parametrize(
    "index", [None, FaissIndexConfig(index_type=IndexType.HNSW), FaissIndexConfig(quantize=Quantize.SQ8)]
)
def test_every_attribute_is_set_by_a_constructor(
    tmp_path: Path, index: FaissIndexConfig | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No operation adds an attribute to the store or to a session: each state has one place where it starts.
    Each session is seen as its class constructs it (the real constructor runs, then the object is recorded with
    the attributes it set), and every one, open or finished, is checked after each operation."""
    store = FaissStore(tmp_path / "s")
    keys = set(vars(store))
    sessions: list[tuple[StagedWrite | InPlaceWrite, set[str]]] = []
    for kind in (StagedWrite, InPlaceWrite):

        def constructed(self, *args, real_init=kind.__init__, **kwargs) -> None:
            real_init(self, *args, **kwargs)
            sessions.append((self, set(vars(self))))

        monkeypatch.setattr(kind, "__init__", constructed)

    def check() -> None:
        assert set(vars(store)) == keys
        for session, attributes in sessions:
            assert set(vars(session)) == attributes, type(session).__name__

    docs, vectors = _docs("a", 300, seed=0)  # sq8 trains on a first batch of at least 256
    new, new_vectors = _docs("b", 3, seed=1)
    store.prepare(DIM, FINGERPRINT, "m", index)
    check()
    store.upsert(docs, vectors)
    store.delete(["a5"])
    store.commit()
    check()
    store.search(vectors[:2], 3)
    store.vectors(["a0"])
    store.count()
    check()
    store.finalize()
    check()
    store.search(vectors[:2], 3)
    store.vectors(["a0", "a1"])
    check()
    for last in ("finalize", "abort"):
        store.begin(DIM, FINGERPRINT, "m", index)
        check()
        store.upsert(new, new_vectors)
        store.delete(["a0"])
        store.search(vectors[:2], 3)
        store.vectors(["b0"])
        store.count()
        check()
        getattr(store, last)()
        check()
    store.prepare(DIM, FINGERPRINT, "m", index)
    store.enable_sparse()
    check()
    store.finalize()
    store.search_sparse(["text"], 2)
    store.search_hybrid(vectors[:1], ["text"], 2)
    check()
    store.prepare(DIM, FINGERPRINT, "m", index)
    store.upsert(docs, vectors)
    check()
    store.abort()
    check()
    store.verify()
    store.footprint()
    store.close()
    check()
    assert {type(session) for session, _ in sessions} == {StagedWrite, InPlaceWrite}
