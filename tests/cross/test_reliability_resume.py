"""SIGKILL a real ``care-retriever index`` process at several points; re-running it equals a clean run.

The clean reference is built in-process with the same writer settings. "Equal" means: the same ids,
no duplicates (one vector per live document), the same vector per id, the same search results.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from care_retriever import AsymmetricEmbedder, CareRetriever, DocumentStoreWriter, read_corpus
from care_retriever.indexing.config import EncodeConfig
from care_retriever.indexing.report import WriteReport
from care_retriever.stores import open_store
from care_retriever.stores.faiss import MANIFEST
from care_retriever.stores.qdrant import EdgeStore, QdrantStore, dense_vector, edge
from tests.support.cli import run_cli
from tests.support.faiss_files import published_faiss_state

pytestmark = pytest.mark.slow

QUERIES = ["血压高怎么办", "拉肚子脱水", "宝宝发烧", "失眠", "糖尿病饮食"]
CHARS = (
    "高血压患者应低盐饮食规律服用降压药定期监测普通感冒多由病毒引起休息喝水"
    "一周自愈糖尿病控制运动遵医嘱拉肚子补充电解质失眠作息咖啡手机宝宝发烧精神差及时就医"
)
WRITER = {"batch_size": 16, "chunk_size": 100, "checkpoint_every": 100}


def make_corpus(path: Path, n: int, seed: int, changed: int = 0, added: int = 0) -> Path:
    """``n`` generated documents; ``changed`` of them rewritten and ``added`` new ones (an updated corpus)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n + added):
        text = "".join(rng.choice(CHARS) for _ in range(rng.randint(4, 40)))
        rows.append(
            {"_id": f"doc-{i}", "title": CHARS[i % 17 : i % 17 + 3], "text": text, "metadata": {"group": i % 3}}
        )
    rng2 = random.Random(seed + 1)
    for row in rng2.sample(rows[:n], changed):
        row["text"] += "（修订）"
    if added == 0:
        rows = rows[:n]
    with path.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def index_cmd(model: Path, corpus: Path, store: str, *extra: str) -> list[str]:
    args = [
        "--batch-size",
        WRITER["batch_size"],
        "--chunk-size",
        WRITER["chunk_size"],
        "--checkpoint-every",
        WRITER["checkpoint_every"],
    ]
    return [
        sys.executable,
        "-m",
        "care_retriever.cli.main",
        "index",
        "--model",
        str(model),
        "--corpus",
        str(corpus),
        "--store",
        store,
        "--no-progress",
        "--json",
        *map(str, args),
        *extra,
    ]


def subprocess_env() -> dict[str, str]:
    # One thread per process: two OpenMP pools on a shared 2-core runner make a tiny model 30x slower.
    return {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def run_and_kill(cmd: list[str], when: Callable[[], bool], after: float = 0.0, timeout: float = 120) -> None:
    """Start ``cmd``; SIGKILL it ``after`` seconds once ``when()`` holds. Fails if it ends first."""
    proc = subprocess.Popen(cmd, env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if when():
                time.sleep(after)
                proc.send_signal(signal.SIGKILL)
                assert proc.wait(timeout=30) == -signal.SIGKILL, "the process ended before the kill point"
                return
            time.sleep(0.005)
        stderr = proc.stderr.read().decode() if proc.stderr else ""
        pytest.fail(f"process ended (rc={proc.returncode}) before the kill point: {stderr[-800:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()


def run_to_end(cmd: list[str]) -> dict:
    done = subprocess.run(cmd, env=subprocess_env(), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def staged_count(folder: Path) -> int | None:
    """Documents in the FAISS writer's last checkpoint; None before the staging folder is ready."""
    try:
        return json.loads((folder.with_name(f".{folder.name}.staging") / MANIFEST).read_text())["count"]
    except (OSError, ValueError, KeyError):
        return None


def qdrant_manifest_count(folder: Path) -> int:
    """The count the Qdrant Edge store's last commit recorded."""
    try:
        return json.loads((folder / "care" / "manifest.json").read_text())["count"]
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def qdrant_state(folder: Path) -> dict[str, np.ndarray]:
    store = QdrantStore(str(folder))
    assert isinstance(store, EdgeStore)
    points = [record for batch in store.scroll(["doc_id"], True, 1000) for record in batch]
    ids = [p.payload["doc_id"] for p in points]
    assert len(ids) == len(set(ids)) == store.count()
    assert store.manifest is not None and store.manifest.count == len(ids)
    state = {p.payload["doc_id"]: dense_vector(p.vector) for p in points}
    store.close()
    return state


def assert_same(state: dict, reference: dict, embedder: AsymmetricEmbedder, store: str, ref_store: str) -> None:
    assert sorted(state) == sorted(reference)
    got = np.stack([state[i] for i in sorted(state)])
    want = np.stack([reference[i] for i in sorted(reference)])
    np.testing.assert_allclose(got, want, atol=1e-5)
    a, b = CareRetriever(store, embedder), CareRetriever(ref_store, embedder)
    for hits, ref in zip(a.search(QUERIES, top_k=10), b.search(QUERIES, top_k=10), strict=True):
        assert [h.id for h in hits] == [h.id for h in ref]
        np.testing.assert_allclose([h.score for h in hits], [h.score for h in ref], atol=1e-5)
    a.close()
    b.close()


def reindex(embedder: AsymmetricEmbedder, corpus: Path, store: str) -> WriteReport:
    writer = DocumentStoreWriter(embedder, store, show_progress=False, encode=EncodeConfig(**WRITER))
    report = writer.write(read_corpus(corpus))
    writer.store.close()
    return report


def reference(embedder: AsymmetricEmbedder, corpus: Path, store: str) -> None:
    reindex(embedder, corpus, store)


def test_faiss_killed_at_four_points_then_resumed_equals_clean_run(
    embedder, tiny_model_dir: Path, tmp_path: Path
) -> None:
    corpus = make_corpus(tmp_path / "corpus.jsonl", 2000, seed=0)
    updated = make_corpus(tmp_path / "updated.jsonl", 2000, seed=0, changed=300, added=400)
    folder = tmp_path / "store"
    spec = f"faiss:{folder}"

    # 1. right after the staging folder is ready (nothing checkpointed), 2. just after the first checkpoint
    run_and_kill(index_cmd(tiny_model_dir, corpus, spec), lambda: staged_count(folder) is not None)
    assert not folder.exists()  # nothing published yet
    run_and_kill(index_cmd(tiny_model_dir, corpus, spec), lambda: (staged_count(folder) or 0) > 0)
    first = run_to_end(index_cmd(tiny_model_dir, corpus, spec))
    assert first["count"] == 2000 and first["added"] + first["unchanged"] == 2000 and first["unchanged"] > 0
    reference(embedder, corpus, f"faiss:{tmp_path / 'clean'}")
    assert_same(
        published_faiss_state(folder),
        published_faiss_state(tmp_path / "clean"),
        embedder,
        spec,
        f"faiss:{tmp_path / 'clean'}",
    )

    # Re-indexing the same corpus adds nothing (in-process: the CLI runs this same writer).
    again = reindex(embedder, corpus, spec)
    assert (again.added, again.updated, again.unchanged, again.count) == (0, 0, 2000, 2000)

    # 3. mid-way through an --update (300 changed, 400 new): readers still see the published store ...
    baseline = published_faiss_state(folder)
    run_and_kill(
        index_cmd(tiny_model_dir, updated, spec, "--update"), lambda: (staged_count(folder) or 0) >= 2100, after=0.05
    )
    still = published_faiss_state(folder)
    assert sorted(still) == sorted(baseline)
    # the same vectors too (the update re-encodes 300 changed documents: none may leak into the published store)
    np.testing.assert_array_equal(
        np.stack([still[i] for i in sorted(still)]), np.stack([baseline[i] for i in sorted(baseline)])
    )
    # ... 4. then the resumed update equals a clean build of the updated corpus.
    final = run_to_end(index_cmd(tiny_model_dir, updated, spec, "--update"))
    assert final["count"] == 2400 and final["updated"] + final["added"] < 700  # checkpointed work is kept
    reference(embedder, updated, f"faiss:{tmp_path / 'clean2'}")
    assert_same(
        published_faiss_state(folder),
        published_faiss_state(tmp_path / "clean2"),
        embedder,
        spec,
        f"faiss:{tmp_path / 'clean2'}",
    )


@pytest.mark.parametrize("quantize", ["sq8", "binary"])
def test_faiss_quantized_killed_then_resumed_equals_clean_run(
    embedder, tiny_model_dir: Path, tmp_path: Path, quantize: str
) -> None:
    """Codes in index.faiss, full vectors in vectors.f32: both checkpointed together and resumed."""
    corpus = make_corpus(tmp_path / "corpus.jsonl", 1500, seed=3)
    folder = tmp_path / "store"
    spec = f"faiss:{folder}"
    sizes = {"chunk_size": 256, "checkpoint_every": 256}  # sq8 takes its value ranges from a first chunk of >= 256
    extra = ("--quantize", quantize, "--chunk-size", "256", "--checkpoint-every", "256")
    run_and_kill(index_cmd(tiny_model_dir, corpus, spec, *extra), lambda: (staged_count(folder) or 0) > 0)
    run_and_kill(
        index_cmd(tiny_model_dir, corpus, spec, *extra), lambda: (staged_count(folder) or 0) >= 512, after=0.05
    )
    final = run_to_end(index_cmd(tiny_model_dir, corpus, spec, *extra))
    assert final["count"] == 1500 and final["unchanged"] >= 512
    clean = tmp_path / "clean"
    writer = DocumentStoreWriter(
        embedder,
        f"faiss:{clean}",
        show_progress=False,
        index={"quantize": quantize},
        encode=EncodeConfig(**{**WRITER, **sizes}),
    )
    writer.write(read_corpus(corpus))
    writer.store.close()
    assert json.loads((folder / MANIFEST).read_text())["index"]["quantize"] == quantize
    assert_same(published_faiss_state(folder), published_faiss_state(clean), embedder, spec, f"faiss:{clean}")


def test_qdrant_edge_killed_then_resumed_equals_clean_run(embedder, tiny_model_dir: Path, tmp_path: Path) -> None:
    # kill -9 after a commit (Edge flushed its shard, the manifest counts it) and later mid-write
    corpus = make_corpus(tmp_path / "corpus.jsonl", 300, seed=1)
    folder = tmp_path / "q"
    spec = f"qdrant:{folder}"
    cmd = index_cmd(tiny_model_dir, corpus, spec)
    run_and_kill(cmd, lambda: qdrant_manifest_count(folder) > 0)
    run_and_kill(cmd, lambda: qdrant_manifest_count(folder) >= 200, after=0.05)
    final = run_to_end(cmd)
    assert final["count"] == 300 and final["unchanged"] >= 200
    reference(embedder, corpus, f"qdrant:{tmp_path / 'clean'}")
    assert_same(qdrant_state(folder), qdrant_state(tmp_path / "clean"), embedder, spec, f"qdrant:{tmp_path / 'clean'}")
    again = reindex(embedder, corpus, spec)
    assert (again.added, again.updated, again.unchanged, again.count) == (0, 0, 300, 300)


def unfinished_builds(folder: Path) -> list[str]:
    """The segments a Qdrant Edge optimize() began and did not finish (a killed build's, in temp_segments/)."""
    temp = folder / "care" / "shard" / edge.TEMP_SEGMENTS
    return sorted(p.name for p in temp.iterdir()) if temp.is_dir() else []


def test_qdrant_edge_killed_during_a_commit_time_optimize_keeps_old_or_new(
    embedder, tiny_model_dir: Path, tmp_path: Path, capsys
) -> None:
    """``index --max-segment-size`` optimizes at a commit once that many KB were written since the last optimize,
    mid-write. kill -9 while such an optimize builds a segment's graph (its half-built segment in temp_segments/:
    caught there, not by a time): every document is old or new, ``info`` counts what ``verify`` checks, the
    half-built segment is gone once the store is opened, and the same command run again completes with every
    document, as a clean run writes them. The collection builds its graphs as it writes (indexing threshold 1 KB,
    an integration's setting: ``index`` has no flag for it, and the default 10 MB is past this corpus)."""
    old = make_corpus(tmp_path / "old.jsonl", 300, seed=4)
    updated = make_corpus(tmp_path / "updated.jsonl", 300, seed=4, changed=100, added=1700)
    folder = tmp_path / "q"
    spec = f"qdrant:{folder}"
    options = {"indexing_threshold": 1, "max_segment_size": 100}  # KB: 800 of the tiny model's 32-d vectors
    writer = DocumentStoreWriter(embedder, spec, show_progress=False, index=options, encode=EncodeConfig(**WRITER))
    writer.write(read_corpus(old))
    writer.store.close()
    before = {d.id: d.text for d in read_corpus(old)}
    after = {d.id: d.text for d in read_corpus(updated)}

    cmd = index_cmd(tiny_model_dir, updated, spec, "--update", "--max-segment-size", "100")
    run_and_kill(cmd, lambda: bool(unfinished_builds(folder)))
    assert unfinished_builds(folder), "the kill did not land during a build"
    assert qdrant_manifest_count(folder) < len(after), "the kill landed in finalize's optimize, not a commit's"

    code, out, err = run_cli(capsys, "verify", "--store", spec)
    assert code == 0, err
    verified = int(out.split(" holds ")[1].split()[0])
    code, out, err = run_cli(capsys, "info", "--store", spec, "--json")
    assert code == 0 and json.loads(out)["count"] == verified, err
    assert unfinished_builds(folder) == []  # removed by the first open
    with open_store(spec) as store:
        held = {d.id: d.text for d in store.iter_documents()}
    assert len(held) == verified and set(before) <= set(held) <= set(after)
    assert all(text in (before.get(i), after[i]) for i, text in held.items())

    final = run_to_end(cmd)
    assert final["count"] == len(after) and final["unchanged"] > 0  # what the killed run wrote is kept
    clean = tmp_path / "clean"
    writer = DocumentStoreWriter(
        embedder, f"qdrant:{clean}", show_progress=False, index=options, encode=EncodeConfig(**WRITER)
    )
    writer.write(read_corpus(updated))
    writer.store.close()
    state, reference_state = qdrant_state(folder), qdrant_state(clean)
    assert sorted(state) == sorted(reference_state)
    np.testing.assert_allclose(
        np.stack([state[i] for i in sorted(state)]), np.stack([reference_state[i] for i in sorted(state)]), atol=1e-5
    )
    with open_store(spec) as store:
        assert {d.id: d.text for d in store.iter_documents()} == after
        assert "hnsw" in {s["index"] for s in store.collection_settings()["segment_indexes"]}
    assert unfinished_builds(folder) == []


def test_delete_then_reindex_restores_only_the_deleted(embedder, tmp_path: Path) -> None:
    """``delete`` by id, then the same corpus again: exactly the deleted ids are re-encoded."""
    corpus = make_corpus(tmp_path / "corpus.jsonl", 300, seed=2)
    spec = f"faiss:{tmp_path / 's'}"
    reference(embedder, corpus, spec)
    writer = DocumentStoreWriter(embedder, spec, show_progress=False, encode=EncodeConfig(**WRITER))
    assert writer.delete(["doc-1", "doc-7", "missing"]) == 2
    report = writer.write(read_corpus(corpus))
    assert (report.added, report.updated, report.unchanged, report.count) == (2, 0, 298, 300)
    assert open_store(spec).count() == 300
