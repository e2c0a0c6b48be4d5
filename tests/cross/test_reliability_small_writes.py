"""SIGKILL a small framework write (LangChain add_texts into a FAISS store) anywhere: all of it or none survives.

Small writes go in place (docstore rows + an appended vector delta, committed by one SQLite commit);
these tests kill a real process at each step of that commit and at random moments of a write loop,
then check the store opens, passes a full verify, answers, and takes the next write.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from langchain_core.embeddings import DeterministicFakeEmbedding

from care_retriever.cli.main import main
from care_retriever.errors import StoreError
from care_retriever.integrations.langchain import CareVectorStore
from care_retriever.stores.faiss import DELTA, FaissStore

WORKER = Path(__file__).resolve().parents[1] / "support" / "small_write_worker.py"


def _seed(folder: Path, n: int = 20, quantize: str = "none") -> None:
    options = {"quantize": quantize} if quantize != "none" else None
    store = CareVectorStore(f"faiss:{folder}", DeterministicFakeEmbedding(size=8), index_options=options)
    store.add_texts([f"seed {i}" for i in range(n)], ids=[f"s{i}" for i in range(n)])  # creates the store
    store.add_texts(["seed extra"], ids=["s0"])  # and one in-place write, so a delta exists
    store.close()


def _worker(*args: str, seed: int = 20) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(WORKER), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "CARE_TEST_SEED": str(seed)},
    )


def _verified(store: FaissStore, *, stopped_after_commit: bool | None = None) -> int:
    """What verify counts. A writer killed between its commit and its manifest leaves checksums that describe the
    version before: verify names the files it could not check (never passes), and records them on request.
    ``stopped_after_commit``: whether that is expected (None: either)."""
    try:
        verified = store.verify()
    except StoreError as exc:
        assert stopped_after_commit is not False and "not checked:" in str(exc), exc
        return store.verify(record_checksums=True)
    assert not stopped_after_commit, "verify passed with checksums of the version before the last write"
    return verified


def _check(folder: Path, expected: int, *, stopped_after_commit: bool | None = None) -> None:
    with FaissStore(folder) as store:
        assert store.count() == expected
        assert _verified(store, stopped_after_commit=stopped_after_commit) == expected
        ids = {d.id for d in store.iter_documents()}
    assert len(ids) == expected
    store = CareVectorStore(f"faiss:{folder}", DeterministicFakeEmbedding(size=8))
    store.add_texts(["after"], ids=["after"])  # the next writer cuts any uncommitted tail and goes on
    assert store.similarity_search("after", k=1)[0].id == "after"
    store.close()
    want = np.asarray(DeterministicFakeEmbedding(size=8).embed_documents(["after"])[0], dtype=np.float32)
    with FaissStore(folder) as reopened:  # read back from disk: the delta holds the vector just written
        np.testing.assert_allclose(reopened.vectors(["after"])[0], want / np.linalg.norm(want), atol=1e-6)
        assert reopened.count() == expected + 1
    assert main(["verify", "--store", f"faiss:{folder}"]) == 0


# Quantized stores (codes + vectors.f32, fsynced before the commit point) too; sq8 trains on >= 256 rows.
@pytest.mark.parametrize(("quantize", "seed"), [("none", 20), ("binary", 20), ("sq8", 300)])
@pytest.mark.parametrize(("point", "added"), [("delta", 0), ("manifest", 3), ("fold-write", 3), ("fold-rename", 3)])
def test_a_kill_inside_the_commit_keeps_all_or_nothing(
    tmp_path: Path, point: str, added: int, quantize: str, seed: int
) -> None:
    folder = tmp_path / "store"
    _seed(folder, seed, quantize)
    survivors = seed + added
    proc = _worker(point, str(folder), seed=seed)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, f"the worker was not killed at {point}: {out} {err}"
    assert "finished" not in out
    _check(folder, survivors, stopped_after_commit=added == 3)  # the points after the commit point add three
    with FaissStore(folder) as store:
        assert (store.get(["p0"])[0] is not None) == (added == 3)
        assert store.require_manifest().index.get("quantize", "none") == quantize


@pytest.mark.slow
def test_kills_at_random_moments_of_a_write_loop(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    _seed(folder)
    for delay in [0.0, 0.004, 0.011, 0.023, 0.05, 0.08]:
        proc = _worker("loop", str(folder))
        first = proc.stdout.readline()  # writing has started
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGKILL and first.strip() == "0"
        done = 1 + len(out.split())
        with FaissStore(folder) as store:
            count = store.count()
            assert _verified(store) == count
            loops = {d.id.split("-")[0] for d in store.iter_documents() if d.id.startswith("w")}
            ids = {d.id for d in store.iter_documents()}
        # Every reported call survived; the one in flight did wholly or not at all, never half of it.
        assert count == 20 + 2 * len(loops)
        assert all((f"{w}-a" in ids) == (f"{w}-b" in ids) for w in loops)
        assert all(f"w{i}-a" in ids for i in range(done))
    assert (folder / DELTA).exists()
    _check(folder, len(ids))
