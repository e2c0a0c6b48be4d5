"""Contract tests of the one adapter to Qdrant Edge (care_retriever/stores/qdrant/edge.py) against the real engine.

Qdrant Edge is beta and its Python API changed at every 0.x release: these tests pin what the store relies on, so
that a new release is met here. They also check the engine's behaviours the store is designed around: updates
survive the death of their process (the log is replayed on load), HNSW and codes only by ``optimize``, one owner
per folder.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("qdrant_edge")

from care_retriever.stores.qdrant import edge

DIM = 16


def _ids(n: int, start: int = 0) -> list[str]:
    return [f"00000000-0000-0000-0000-{i:012d}" for i in range(start, start + n)]


def _points(n: int, start: int = 0, seed: int = 0) -> list[edge.EdgePoint]:
    vectors = np.random.default_rng(seed).normal(size=(n, DIM)).astype(np.float32)
    return [
        edge.EdgePoint(
            pid, v.tolist(), {"doc_id": f"d{start + i}", "group": (start + i) % 3}, ([1, 100 + start + i], [0.5, 1.0])
        )
        for i, (pid, v) in enumerate(zip(_ids(n, start), vectors, strict=True))
    ]


def test_the_adapter_writes_reads_and_queries_the_engine(tmp_path: Path) -> None:
    shard = edge.EdgeShard.create(tmp_path / "s", edge.ShardSettings(dim=DIM, metric="dot", quantize="sq8"))
    points = _points(50)
    shard.upsert(points)
    shard.index_field("group", "integer")
    assert shard.count() == 50 and shard.count([("group", [0])]) == 17 and shard.count([("group", [0, 1])]) == 34
    assert shard.payload_indexes() == {"group": "integer"}
    record = shard.retrieve([points[3].id], ["doc_id"], True)[0]
    assert record.id == points[3].id and record.payload == {"doc_id": "d3"}
    np.testing.assert_allclose(record.vector, points[3].vector, rtol=1e-6)  # dot: stored as given
    assert record.sparse == ([1, 103], [0.5, 1.0])
    seen, offset = [], None
    while True:
        batch, offset = shard.scroll(offset, 16, False, False)
        seen += [r.id for r in batch]
        if offset is None:
            break
    assert sorted(seen) == sorted(p.id for p in points)
    dense = shard.request(shard.dense_query(points[5].vector), 3, payload=["doc_id"])
    sparse = shard.request(shard.sparse_query(([1], [1.0])), 100, payload=False)
    fused = shard.fused_request(
        shard.dense_query(points[5].vector), shard.sparse_query(([105], [1.0])), 3, 10, method="rrf"
    )
    top, by_term, by_both = shard.query_batch([dense, sparse, fused])
    assert top[0].payload["doc_id"] == "d5" and len(by_term) == 50
    assert by_both[0].id == points[5].id  # first in both rankings
    assert by_both[0].score == pytest.approx(2 / 61, rel=1e-5)  # k=60 handed as 61: ours is 1 / (k + rank)
    shard.delete([points[0].id])
    assert shard.count() == 49
    settings = shard.recorded_settings()
    assert (settings["quantize"], settings["distance"], settings["sparse_modifier"]) == ("sq8", "Dot", "idf")
    shard.close()


def test_hnsw_and_codes_are_built_by_optimize_only(tmp_path: Path) -> None:
    settings = edge.ShardSettings(
        dim=DIM, metric="cosine", quantize="sq8", m=8, ef_construct=32, indexing_threshold_kb=1
    )
    shard = edge.EdgeShard.create(tmp_path / "s", settings)
    shard.upsert(_points(400))
    assert {s["index"] for s in shard.built()["segment_indexes"]} == {"plain"}
    assert shard.optimize() is True
    built = shard.built()
    assert {"index": "hnsw", "quantization": "sq8"} in [
        {k: s[k] for k in ("index", "quantization")} for s in built["segment_indexes"]
    ]
    assert built["points"] == 400
    assert shard.optimize() is False  # nothing left to build
    shard.close()


def test_one_owner_per_folder(tmp_path: Path) -> None:
    shard = edge.EdgeShard.create(tmp_path / "s", edge.ShardSettings(dim=DIM, metric="cosine"))
    with pytest.raises(edge.ShardBusy, match="one owner per folder"):
        edge.EdgeShard.load(tmp_path / "s")
    shard.close()
    edge.EdgeShard.load(tmp_path / "s").close()  # released by close


def test_updates_survive_the_death_of_their_process_without_a_flush(tmp_path: Path) -> None:
    """``update`` does no fsync (flush is the commit point against losing the machine), but ``load`` replays the
    log: a process killed (SIGKILL) after its updates loses none of them."""
    points = tmp_path / "points.pickle"  # the child writes the points this module makes
    points.write_bytes(pickle.dumps((_points(30), _points(20, start=30), _points(1)[0].id)))
    script = textwrap.dedent(
        f"""
        import os, pickle, signal
        from pathlib import Path
        from care_retriever.stores.qdrant import edge
        flushed, unflushed, deleted = pickle.loads(Path({str(points)!r}).read_bytes())
        shard = edge.EdgeShard.create(Path({str(tmp_path / "s")!r}), edge.ShardSettings(dim={DIM}, metric="cosine"))
        shard.upsert(flushed)
        shard.flush()
        shard.upsert(unflushed)  # never flushed
        shard.delete([deleted])
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert run.returncode == -9, run.stderr[-2000:]
    shard = edge.EdgeShard.load(tmp_path / "s")
    assert shard.count() == 49 and not shard.retrieve(_ids(1), False, False)
    shard.close()


def test_engine_errors_are_one_line(tmp_path: Path) -> None:
    shard = edge.EdgeShard.create(tmp_path / "s", edge.ShardSettings(dim=DIM, metric="cosine"))
    with pytest.raises(Exception, match="Qdrant Edge: Vector dimension error") as caught:
        shard.upsert([edge.EdgePoint(_ids(1)[0], [0.0] * (DIM - 1), {})])
    assert "\n" not in str(caught.value)
    fault = edge.os_error(Exception("Service internal error: No space left on device (os error 28)"))
    assert fault is not None and fault.errno == 28
    refused = "Service runtime error: Not enough space available for optimization, needed: 16.41 MiB, available: 0 B"
    fault = edge.os_error(Exception(refused))  # the optimizer's own free-space check: a full disk too
    assert fault is not None and fault.errno == 28
    shard.close()


def test_metadata_fields_filters_cannot_name_are_kept_not_indexed(tmp_path) -> None:
    """A metadata field that is no JSON path (``""``, ``"a b"``) is stored and read back; only the fields filters
    can name get a payload index (the engine refuses an index on the others, which failed the whole write)."""
    import numpy as np

    from care_retriever.documents import Document
    from care_retriever.stores import open_store

    store = open_store(f"qdrant:{tmp_path / 's'}")
    store.prepare(8, "fp", "m")
    vector = np.full((1, 8), 8**-0.5, dtype="float32")
    store.upsert([Document(id="x", text="t", metadata={"": "", "a b": 1, "topic": "高血压"})], vector)
    store.commit()
    assert store.get(["x"])[0].metadata == {"": "", "a b": 1, "topic": "高血压"}
    assert [h.id for h in store.search(vector, 3, filters={"topic": "高血压"})[0]] == ["x"]
    store.close()


def test_an_upsert_of_vectors_that_do_not_fit_is_one_line(tmp_path) -> None:
    import numpy as np
    import pytest

    from care_retriever.documents import Document
    from care_retriever.errors import InputError
    from care_retriever.stores import open_store

    store = open_store(f"qdrant:{tmp_path / 's'}")
    store.prepare(8, "fp", "m")
    documents = [Document(id="x", text="t")]
    with pytest.raises(InputError, match=r"vectors have shape \(1, 4\); the store holds 8-dim"):
        store.upsert(documents, np.ones((1, 4), dtype="float32"))
    with pytest.raises(InputError, match="1 documents but 2 vectors"):
        store.upsert(documents, np.ones((2, 8), dtype="float32"))
    assert store.count() == 0
    store.close()


def test_a_query_that_does_not_fit_is_one_line(tmp_path) -> None:
    import numpy as np
    import pytest

    from care_retriever.documents import Document
    from care_retriever.errors import InputError
    from care_retriever.stores import open_store

    store = open_store(f"qdrant:{tmp_path / 's'}")
    store.prepare(8, "fp", "m")
    store.upsert([Document(id="x", text="t")], np.full((1, 8), 8**-0.5, dtype="float32"))
    store.commit()
    with pytest.raises(InputError, match="query vectors have 4 dims; the store holds 8"):
        store.search(np.ones((1, 4), dtype="float32"), 3)
    with pytest.raises(InputError, match="top_k must be >= 1, got 0"):
        store.search(np.ones((1, 8), dtype="float32"), 0)
    store.close()


def test_a_build_killed_mid_optimize_is_removed_by_the_next_load(tmp_path: Path) -> None:
    """``optimize`` builds each segment in ``temp_segments/``; a process killed (SIGKILL) during the build leaves the
    half-built segment there, which the engine itself never removes. The adapter's ``load`` removes it: the shard
    holds every point, and the next optimize builds the graph."""
    import os
    import signal
    import time

    folder = tmp_path / "s"
    points = tmp_path / "points.pickle"  # the child writes the points this module makes
    points.write_bytes(pickle.dumps(_points(6000)))
    script = textwrap.dedent(
        f"""
        import pickle
        from pathlib import Path
        from care_retriever.stores.qdrant import edge
        settings = edge.ShardSettings(dim={DIM}, metric="cosine", indexing_threshold_kb=1)
        shard = edge.EdgeShard.create(Path({str(folder)!r}), settings)
        shard.upsert(pickle.loads(Path({str(points)!r}).read_bytes()))
        shard.flush()
        shard.optimize()
        print("the optimize finished before the kill", flush=True)
        """
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    temp = folder / edge.TEMP_SEGMENTS
    deadline = time.monotonic() + 120
    while child.poll() is None and time.monotonic() < deadline and not (temp.is_dir() and any(temp.iterdir())):
        time.sleep(0.002)
    os.kill(child.pid, signal.SIGKILL)
    out, err = child.communicate(timeout=30)
    assert child.returncode == -signal.SIGKILL, f"{out!r} {err[-2000:]!r}"
    left = [p.name for p in temp.iterdir()]
    assert left and all(name.startswith("segment_builder") for name in left), left  # killed mid-build

    shard = edge.EdgeShard.load(folder)
    assert shard.unfinished_builds() == [] and not any(temp.iterdir())
    assert shard.count() == 6000
    assert shard.optimize() is True
    assert "hnsw" in {s["index"] for s in shard.built()["segment_indexes"]}
    shard.close()
