"""SIGKILL the first small write into a store whose docstore was hashed whole, while the docstore switches to its
write-ahead log (a change of two header bytes the whole-file checksum covered): ``verify`` passes and the next
write goes on, the docstore's checksums now by blocks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from langchain_core.embeddings import DeterministicFakeEmbedding

from care_retriever.integrations.langchain import CareVectorStore
from care_retriever.stores.faiss import DOCSTORE, MANIFEST, FaissStore
from tests.support.faiss_files import as_docstore_hashed_whole

WORKER = Path(__file__).resolve().parents[1] / "support" / "small_write_worker.py"
SEED = 20


def test_a_kill_after_the_docstore_entered_its_log_leaves_a_store_that_verifies(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    store = CareVectorStore(f"faiss:{folder}", DeterministicFakeEmbedding(size=8))
    store.add_texts([f"seed {i}" for i in range(SEED)], ids=[f"s{i}" for i in range(SEED)])
    store.close()
    as_docstore_hashed_whole(folder)
    # "delta": killed once the write's rows are in the docstore's log, before its commit point
    killed = subprocess.run(
        [sys.executable, str(WORKER), "delta", str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "CARE_TEST_SEED": str(SEED)},
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    with open(folder / DOCSTORE, "rb") as fh:
        assert fh.read(19)[18] == 2  # left in WAL mode by the kill: the header byte a whole checksum covered
    with FaissStore(folder) as reopened:
        assert reopened.verify() == SEED
    recorded = json.loads((folder / MANIFEST).read_text("utf-8"))
    assert DOCSTORE not in recorded["checksums"] and recorded["block_checksums"][DOCSTORE]
    store = CareVectorStore(f"faiss:{folder}", DeterministicFakeEmbedding(size=8))
    store.add_texts(["after"], ids=["after"])
    store.close()
    with FaissStore(folder) as reopened:
        assert reopened.verify() == SEED + 1
