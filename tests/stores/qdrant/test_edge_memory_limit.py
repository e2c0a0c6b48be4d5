"""A write into a Qdrant Edge store that would make its next ``optimize()`` pass the memory limit
(``CARE_MEMORY_LIMIT_GIB``, else the machine's memory) is refused in one line with the figure, before anything
is written; segments of a bounded size (``max_segment_size``) let the same store grow further."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from care_retriever.cli.main import main
from care_retriever.documents import Document
from care_retriever.errors import StoreError
from care_retriever.stores.config import QdrantCollectionConfig
from care_retriever.stores.qdrant.edge_memory import GIB, MEMORY_LIMIT_ENV, optimize_peak_bytes
from care_retriever.stores.qdrant.edge_store import EdgeStore

DIM = 32


def _batch(start: int, count: int) -> tuple[list[Document], np.ndarray]:
    vectors = np.random.default_rng(start).standard_normal((count, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return [Document(id=f"d{i}", text=f"高血压 {i}") for i in range(start, start + count)], vectors


def _limit_between(monkeypatch: pytest.MonkeyPatch, fits: int, segment_kb: int | None = None) -> None:
    """A limit that ``fits`` points fit in and one more does not."""
    low, high = optimize_peak_bytes(fits, DIM, segment_kb), optimize_peak_bytes(fits + 1, DIM, segment_kb)
    assert low < high
    monkeypatch.setenv(MEMORY_LIMIT_ENV, repr((low + high) / 2 / GIB))


def test_a_write_past_the_limit_is_refused_with_the_figure_and_nothing_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _limit_between(monkeypatch, 300)
    with EdgeStore(str(tmp_path / "edge")) as store:
        store.prepare(DIM, "fp", "model")
        store.upsert(*_batch(0, 200))
        store.commit()
        with pytest.raises(StoreError) as refused:
            store.upsert(*_batch(200, 101))
        line = str(refused.value)
        assert "\n" not in line and "optimize() of 0.00M points" in line and "needs about" in line, line
        assert f"{MEMORY_LIMIT_ENV} allows" in line and "--max-segment-size" in line and "FAISS" in line, line
        store.upsert(*_batch(200, 100))  # up to the limit: written
        store.finalize()
        assert store.count() == 300 and store.verify() == 300


def test_bounded_segments_let_the_store_grow_past_the_single_segment_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    segment_kb = 4  # 32 points of 32 dims a segment
    _limit_between(monkeypatch, 300)
    assert optimize_peak_bytes(600, DIM, segment_kb) < optimize_peak_bytes(301, DIM)
    with EdgeStore(str(tmp_path / "edge")) as store:
        store.prepare(DIM, "fp", "model", QdrantCollectionConfig(max_segment_size=segment_kb))
        store.upsert(*_batch(0, 600))
        store.finalize()
        assert store.count() == 600


def test_the_index_command_refuses_in_one_line_with_a_non_zero_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path, small_corpus_path: Path, capsys
) -> None:
    monkeypatch.setenv(MEMORY_LIMIT_ENV, "0.0001")
    store = tmp_path / "edge"
    index = ["index", "--model", tiny_model_dir, "--corpus", small_corpus_path, "--store", f"qdrant:{store}"]
    code = main([str(a) for a in index] + ["--no-progress"])
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert code != 0 and len(lines) == 1 and "Traceback" not in err, err
    assert "needs about" in lines[0] and "allows 0.0 GiB" in lines[0], lines[0]
