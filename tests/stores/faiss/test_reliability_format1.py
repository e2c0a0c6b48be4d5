"""A store written by care-retriever 285535d (format 1: no delta, no meta table) opens and answers identically.

The fixture in tests/fixtures/format1/ was written by that version's code (make_format1_stores.py says how).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from care_retriever.cli.main import main
from care_retriever.indexing.corpus import Document
from care_retriever.stores.faiss import FaissStore

FIXTURE = Path(__file__).parents[2] / "fixtures" / "format1"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text("utf-8"))
QUERIES = np.asarray(EXPECTED["queries"], dtype=np.float32)


@pytest.fixture(params=["flat", "hnsw"])
def old_store(request, tmp_path: Path) -> tuple[str, Path]:
    folder = tmp_path / request.param
    shutil.copytree(FIXTURE / request.param, folder)  # opening in place may add SQLite side files
    return request.param, folder


def _answers(store: FaissStore) -> list[list[list]]:
    return [[[h.id, h.score, h.text, h.title, h.metadata] for h in row] for row in store.search(QUERIES, 5)]


def _same(got: list, want: list) -> None:
    assert [[h[0] for h in row] for row in got] == [[h[0] for h in row] for row in want]
    assert [[h[2:] for h in row] for row in got] == [[h[2:] for h in row] for row in want]
    np.testing.assert_allclose([[h[1] for h in row] for row in got], [[h[1] for h in row] for row in want], atol=1e-6)


def test_old_store_opens_and_answers_identically(old_store: tuple[str, Path]) -> None:
    kind, folder = old_store
    want = EXPECTED["stores"][kind]
    with FaissStore(folder) as store:
        assert store.require_manifest().format_version == 1 and store.count() == want["count"] == 39
        _same(_answers(store), want["hits"])
        filtered = store.search(QUERIES, 5, {"topic": "heart"})
        assert [[[h.id, pytest.approx(h.score, abs=1e-6)] for h in row] for row in filtered] == want["filtered"]
        assert store.get(["d5", "d3"])[0].text == "updated" and store.get(["d3"]) == [None]
        assert store.verify() == 39  # its checksums still describe its files


def test_old_store_takes_a_small_write_and_keeps_its_answers(old_store: tuple[str, Path], capsys) -> None:
    kind, folder = old_store
    before = (folder / "index.faiss").read_bytes()
    far = np.zeros((1, 8), dtype=np.float32)
    far[0, 0] = 1.0
    with FaissStore(folder) as store, store.transaction() as tx:
        tx.upsert([Document(id="new", text="新文档")], far)
    assert (folder / "index.faiss").read_bytes() == before  # the write went to the delta, not a rewrite
    with FaissStore(folder) as store:
        assert store.count() == 40 and store.get(["new"])[0].text == "新文档"
        assert store.search(far, 1)[0][0].id == "new"
        hits = [[h for h in row if h[0] != "new"] for row in _answers(store)]
        want = [[h for h in row if h[0] != "new"] for row in EXPECTED["stores"][kind]["hits"]]
        for got_row, want_row in zip(hits, want, strict=True):
            n = min(len(got_row), len(want_row))
            _same([got_row[:n]], [want_row[:n]])
    assert main(["verify", "--store", f"faiss:{folder}"]) == 0
    assert "holds 40 documents" in capsys.readouterr().out
