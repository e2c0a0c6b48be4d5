"""Subprocess for tests/cross/test_reliability_small_writes.py: small LangChain writes into a FAISS store.

``loop DIR``: add two texts per call forever, printing each finished call's number (killed from outside).
``POINT DIR``: add three texts in one call and SIGKILL itself at ``POINT`` inside the store's commit:
``delta`` (delta appended, docstore not committed), ``manifest`` (docstore committed, manifest not
rewritten; the store held CARE_TEST_SEED documents, default 20), ``fold-write`` (a fold writing the new
index), ``fold-rename`` (fold recorded, not renamed).
"""

from __future__ import annotations

import os
import signal
import sys
import types

from langchain_core.embeddings import DeterministicFakeEmbedding

from care_retriever.integrations.langchain import CareVectorStore
from care_retriever.stores.faiss import files, journal
from care_retriever.stores.faiss.files import NEXT_INDEX


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def arm(point: str) -> None:
    if point == "delta":
        set_meta = journal.set_meta

        def killing_set_meta(db, **values: int) -> None:
            if "delta_bytes" in values:
                die()
            set_meta(db, **values)

        journal.set_meta = killing_set_meta
    elif point == "manifest":
        write_manifest = files.write_manifest

        def killing_write_manifest(folder, manifest) -> None:
            if manifest.count == int(os.environ.get("CARE_TEST_SEED", "20")) + 3:
                die()
            write_manifest(folder, manifest)

        files.write_manifest = killing_write_manifest
    elif point in ("fold-write", "fold-rename"):
        journal.FOLD_MIN_BYTES, journal.FOLD_RATIO = 0, 0.0  # fold on this write
        if point == "fold-write":
            write_index_file = files.write_index_file

            def killing_write(index, path) -> None:
                write_index_file(index, path)
                if path.name == NEXT_INDEX:  # written, not yet recorded
                    die()

            files.write_index_file = killing_write
        else:

            def replace(src, dst) -> None:
                if str(src).endswith(NEXT_INDEX):
                    die()
                os.replace(src, dst)

            names = {k: getattr(os, k) for k in dir(os) if not k.startswith("__")}
            journal.os = types.SimpleNamespace(**{**names, "replace": replace})
    else:
        raise SystemExit(f"unknown point {point!r}")


def main() -> None:
    point, folder = sys.argv[1], sys.argv[2]
    store = CareVectorStore(f"faiss:{folder}", DeterministicFakeEmbedding(size=8))
    if point == "loop":
        for i in range(100_000):
            store.add_texts([f"loop {i} a", f"loop {i} b"], ids=[f"w{i}-a", f"w{i}-b"])
            print(i, flush=True)
    arm(point)
    store.add_texts(["p0", "p1", "p2"], ids=["p0", "p1", "p2"])
    print("finished", flush=True)


if __name__ == "__main__":
    main()
