"""``care-retriever copy`` / ``copy_store``: a store moved to another kind of store with nothing re-encoded.

Every store here is written and read through the store protocol and the CLI only, so the tests hold for whichever
engine ``qdrant:PATH`` runs. A Qdrant server target is not covered beyond its one-line error when unreachable:
this machine has no Qdrant server (none on PyPI or Debian, no container runtime).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from care_retriever.documents import Document
from care_retriever.errors import StoreError
from care_retriever.stores import open_store
from care_retriever.stores.config import FaissIndexConfig, IndexType, Quantize
from care_retriever.stores.copying import copy_store

REPO = Path(__file__).resolve().parents[2]
DIM = 16
COUNT = 150
TRAINED = 300  # documents of a source copied into a compressed index
FINGERPRINT = "copy-test-space"
TOPICS = ["高血压", "糖尿病", "冠心病", "肺炎", "胃炎", "偏头痛", "哮喘", "贫血", "湿疹", "痛风", "失眠", "肝炎"]
KILLED = 86
QUERIES = ["高血压 治疗", "肺炎 哮喘", "糖尿病 痛风 失眠"]


def _documents(count: int = COUNT) -> list[Document]:
    words = np.random.default_rng(1).integers(0, len(TOPICS), size=(count, 9))
    return [
        Document(
            id=f"d{i:03d}",
            text=" ".join(TOPICS[w] for w in words[i, : 2 + i % 8]) + " 治疗",
            title=f"病例 {TOPICS[i % 12]}" if i % 2 else "",
            metadata={"topic": TOPICS[i % 12], "n": i} if i % 5 else {},
        )
        for i in range(count)
    ]


def _vectors(count: int = COUNT, dim: int = DIM, seed: int = 0) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal((count, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _write_store(
    spec: str, *, dim: int = DIM, fingerprint: str = FINGERPRINT, sparse: bool = True, count: int = COUNT
) -> None:
    store = open_store(spec)
    try:
        store.prepare(dim, fingerprint, "copy-test-model", metric="cosine")
        if sparse:
            store.enable_sparse()
        store.upsert(_documents(count), _vectors(count, dim=dim))
        store.finalize()
    finally:
        store.close()


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> str:
    spec = f"faiss:{tmp_path_factory.mktemp('copy') / 'source'}"
    _write_store(spec)
    return spec


def _contents(spec: str) -> dict[str, tuple[str, str, dict, str, bytes]]:
    """id -> (text, title, metadata, stored content hash, stored vector bytes), read through the protocol."""
    store = open_store(spec)
    try:
        out = {}
        for batch in store.iter_stored(64):
            for doc, vector, digest in zip(batch.documents, batch.vectors, batch.content_hashes, strict=True):
                out[doc.id] = (doc.text, doc.title, doc.metadata, digest, vector.tobytes())
        return out
    finally:
        store.close()


def _results(spec: str) -> tuple[list[list[tuple[str, float]]], list[list[tuple[str, float]]]]:
    """Dense and BM25 hits (ids and scores) of fixed queries."""
    store = open_store(spec)
    try:
        dense = [[(h.id, h.score) for h in row] for row in store.search(_vectors(8, seed=7), 10)]
        sparse = [[(h.id, h.score) for h in row] for row in store.search_sparse(QUERIES, 10)]
        return dense, sparse
    finally:
        store.close()


def _same_results(a: str, b: str, *, bm25_scores: bool = True) -> None:
    """The same dense hits (ids in order, scores to 1e-5). BM25: the same scores by id above each ranking's last
    (ties at the cut fall either way); a Qdrant store's BM25 side fixes its average document length from the first
    batch written, so its scores differ by that ratio: there the top 10 share at least 8 ids."""
    (dense_a, sparse_a), (dense_b, sparse_b) = _results(a), _results(b)
    for row_a, row_b in zip(dense_a, dense_b, strict=True):
        assert [i for i, _ in row_a] == [i for i, _ in row_b]
        np.testing.assert_allclose([s for _, s in row_a], [s for _, s in row_b], atol=1e-5)
    for row_a, row_b in zip(sparse_a, sparse_b, strict=True):
        assert len(row_a) == len(row_b) == 10
        if bm25_scores:
            above = [{i: round(s, 4) for i, s in row if s > row[-1][1] + 1e-4} for row in (row_a, row_b)]
            assert above[0] == above[1] and above[0]
        else:
            assert len({i for i, _ in row_a} & {i for i, _ in row_b}) >= 8


def _manifest(spec: str) -> tuple[int, str, str, str, bool]:
    store = open_store(spec)
    try:
        m = store.require_manifest()
        return m.dim, m.space_fingerprint, m.model_name, m.metric, bool(m.sparse)
    finally:
        store.close()


def _cli_in_subprocess(*calls: list[str]) -> list[dict]:
    """Run ``care-retriever`` calls in one fresh process; each call's exit code and JSON report, and which heavy
    modules that process imported (a model cannot be built without torch)."""
    script = (
        "import io, json, sys, contextlib\n"
        "from care_retriever.cli.main import main\n"
        "out = []\n"
        f"for argv in {calls!r}:\n"
        "    buf = io.StringIO()\n"
        "    with contextlib.redirect_stdout(buf):\n"
        "        code = main(argv)\n"
        "    out.append({'code': code, 'report': json.loads(buf.getvalue() or 'null')})\n"
        "heavy = ('torch', 'transformers', 'sentence_transformers')\n"
        "out.append({'loaded': sorted(m for m in heavy if m in sys.modules)})\n"
        "print(json.dumps(out))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=240, cwd=REPO, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_faiss_to_qdrant_to_faiss_carries_everything_and_encodes_nothing(source: str, tmp_path: Path) -> None:
    qdrant, back = f"qdrant:{tmp_path / 'qdrant'}", f"faiss:{tmp_path / 'back'}"
    there, home, again, loaded = _cli_in_subprocess(
        ["copy", "--from", source, "--to", qdrant, "--batch-size", "64", "--json"],
        ["copy", "--from", qdrant, "--to", back, "--batch-size", "64", "--json"],
        ["copy", "--from", qdrant, "--to", back, "--json"],
    )
    # no model was loaded: the process that copied twice never imported torch, so no tower could be built
    assert loaded == {"loaded": []}
    for leg in (there, home):
        assert leg["code"] == 0
        report = leg["report"]
        assert (report["copied"], report["unchanged"], report["count"], report["verified"]) == (COUNT, 0, COUNT, COUNT)
        assert report["space_fingerprint"] == FINGERPRINT and report["sparse"] == "rebuilt"
    # an unchanged re-run copies nothing
    assert again["code"] == 0 and (again["report"]["copied"], again["report"]["unchanged"]) == (0, COUNT)
    # ids, texts, titles, metadata, content hashes and the exact vector bytes moved; so did the model's space
    original = _contents(source)
    assert _contents(qdrant) == original and _contents(back) == original
    assert (
        _manifest(qdrant)
        == _manifest(back)
        == _manifest(source)
        == (DIM, FINGERPRINT, "copy-test-model", "cosine", True)
    )
    # the same dense hits (ids, scores to 1e-5) and BM25 scores from every copy
    _same_results(source, qdrant, bm25_scores=False)
    _same_results(source, back)


def test_an_unchanged_rerun_writes_nothing_into_a_faiss_target(source: str, tmp_path: Path) -> None:
    target = tmp_path / "target"
    assert copy_store(source, f"faiss:{target}").copied == COUNT
    beside = sorted(os.listdir(tmp_path))
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in target.iterdir()}
    report = copy_store(source, f"faiss:{target}")
    assert (report.copied, report.unchanged, report.verified) == (0, COUNT, COUNT)
    # not even a staging copy of the store: the folder's files are the very same
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in target.iterdir()} == before
    assert sorted(os.listdir(tmp_path)) == beside


def test_copy_into_a_compressed_hnsw_index(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from care_retriever.cli.main import main

    source = f"faiss:{tmp_path / 'source'}"  # sq8 codes train on the first write: 256 vectors at least
    _write_store(source, count=TRAINED)

    target = f"faiss:{tmp_path / 'hnsw-sq8'}"
    assert main(["copy", "--from", source, "--to", target, "--index-type", "hnsw", "--quantize", "sq8", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["index"]["type"] == "hnsw" and report["index"]["quantize"] == "sq8"
    assert report["verified"] == TRAINED
    store = open_store(target)
    try:
        config = FaissIndexConfig.from_manifest(store.require_manifest().index)
        assert (config.index_type, config.quantization) == (IndexType.HNSW, Quantize.SQ8)
        assert store.footprint()["quantize"] == "sq8"
    finally:
        store.close()
    # the full vectors moved beside the codes: every search is rescored with them, so the hits are the exact ones
    assert _contents(target) == _contents(source)
    _same_results(source, target)
    # copied on without index options, a store of one kind keeps its settings
    onward = copy_store(target, f"faiss:{tmp_path / 'onward'}")
    assert (onward.index["type"], onward.index["quantize"], onward.copied) == ("hnsw", "sq8", TRAINED)
    assert _contents(f"faiss:{tmp_path / 'onward'}") == _contents(source)  # the full vectors, not decoded codes


def test_a_source_document_that_no_longer_matches_its_hash_is_refused(tmp_path: Path) -> None:
    import sqlite3

    spec = f"faiss:{tmp_path / 'damaged'}"
    _write_store(spec, sparse=False)
    with sqlite3.connect(tmp_path / "damaged" / "docstore.sqlite") as db:  # its text changed, its hash kept
        db.execute("UPDATE documents SET text = text || '！' WHERE id = 'd100'")
    with pytest.raises(StoreError, match="content hash mismatch for 'd100' in the source") as caught:
        copy_store(spec, f"faiss:{tmp_path / 'target'}")
    assert "\n" not in str(caught.value) and "nothing of it was published" in str(caught.value)
    # stopped before its first checkpoint: nothing to resume, so no staging copy is left pending
    assert not (tmp_path / ".target.staging").exists() and not (tmp_path / "target").exists()


def test_python_copy_with_an_index_config_and_open_stores(source: str, tmp_path: Path) -> None:
    src = open_store(source)
    dst = open_store(f"faiss:{tmp_path / 'flat-to-hnsw'}")
    try:
        report = copy_store(src, dst, index=FaissIndexConfig(index_type=IndexType.HNSW, m=16), sparse=False)
        assert (report.copied, report.sparse, report.index["type"], report.index["m"]) == (COUNT, "none", "hnsw", 16)
        assert dst.count() == COUNT and src.count() == COUNT  # the caller's stores stay open
    finally:
        src.close()
        dst.close()


def _tree(folder: Path) -> dict[str, str]:
    """Every file's hash, except what Qdrant Edge rewrites on its own whenever a shard is opened (its config with
    the defaults filled in, the trackers of its mapped files): what this package writes (the manifest) and what
    the shard holds (:func:`_held`) are compared instead."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "shard" not in p.relative_to(folder).parts
    }


def _held(spec: str) -> list[tuple[str, str, bytes]]:
    """The documents and vectors a store holds, in id order."""
    from care_retriever.stores import open_store

    store = open_store(spec, create=False)
    try:
        documents = sorted(store.iter_documents(), key=lambda d: d.id)
        vectors = store.vectors([d.id for d in documents])
        return [(d.id, d.text, v.tobytes() if v is not None else b"") for d, v in zip(documents, vectors, strict=True)]
    finally:
        store.close()


@pytest.mark.parametrize("kind", ["faiss", "qdrant"])
@pytest.mark.parametrize(
    ("dim", "fingerprint", "said"), [(DIM, "another-space", "space fingerprint"), (8, FINGERPRINT, "dimension")]
)
def test_a_target_of_another_space_or_width_is_refused_in_one_line_and_untouched(
    source: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, dim: int, fingerprint: str, said: str
) -> None:
    from care_retriever.cli.main import main

    folder = tmp_path / "other"
    _write_store(f"{kind}:{folder}", dim=dim, fingerprint=fingerprint, sparse=False)
    before, held, beside = _tree(folder), _held(f"{kind}:{folder}"), sorted(os.listdir(tmp_path))
    assert main(["copy", "--from", source, "--to", f"{kind}:{folder}", "--no-progress"]) == StoreError.exit_code
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and said in err and "nothing was copied" in err
    assert _tree(folder) == before and _held(f"{kind}:{folder}") == held
    assert sorted(os.listdir(tmp_path)) == beside  # no staging folder beside it


_KILLING_WORKER = """
import os, sys
from care_retriever.stores import open_store
from care_retriever.stores.copying import copy_store

# The process dies right after the target's Nth write returns, as a kill -9 would leave it (no cleanup runs).
target = open_store(sys.argv[2])
upsert, calls = type(target).upsert, []
def dying_upsert(self, *args, **kwargs):
    upsert(self, *args, **kwargs)
    calls.append(1)
    if len(calls) == int(sys.argv[3]):
        os._exit(86)
type(target).upsert = dying_upsert
copy_store(sys.argv[1], target, batch=20, checkpoint_every=40)
"""


@pytest.mark.parametrize("kind", ["faiss", "qdrant"])
def test_a_killed_copy_is_finished_by_running_it_again(source: str, tmp_path: Path, kind: str) -> None:
    target = f"{kind}:{tmp_path / 'target'}"
    killed = subprocess.run(
        [sys.executable, "-c", _KILLING_WORKER, source, target, "5"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
        check=False,
    )
    assert killed.returncode == KILLED, killed.stderr[-2000:]
    # five writes of 20 happened, two checkpoints (at 40 and 80) were taken: the re-run copies only what is missing
    report = copy_store(source, target)
    assert report.copied + report.unchanged == COUNT and report.unchanged >= 80 and report.copied > 0
    assert (report.count, report.verified) == (COUNT, COUNT)
    assert _contents(target) == _contents(source)
    _same_results(source, target, bm25_scores=kind == "faiss")


_WRITE_POINT_WORKER = """
import sys
from tests.support import fault_injection
from care_retriever.stores.copying import copy_store

fault_injection.prepare_modules("staged")
with fault_injection.armed(fault_injection.Injector(kill_at=int(sys.argv[3]))) as injector:
    copy_store(sys.argv[1], sys.argv[2], batch=20, checkpoint_every=40, verify=False)
print(injector.count)
"""


@pytest.mark.slow
def test_a_copy_killed_at_a_write_point_of_a_faiss_target_is_finished_by_running_it_again(
    source: str, tmp_path: Path
) -> None:
    """Killed at a sample of the FAISS target's write points (files opened, written, fsynced, renamed; SQLite
    commits: tests/support/fault_injection.py), re-running the copy leaves the whole store, verified."""
    from tests.support import fault_injection

    with fault_injection.armed(fault_injection.Injector()) as counting:
        copy_store(source, f"faiss:{tmp_path / 'clean'}", batch=20, checkpoint_every=40, verify=False)
    points = counting.count
    assert points > 20
    for at in (points // 4, points // 2, points - 2):
        target = f"faiss:{tmp_path / f'killed-{at}'}"
        killed = subprocess.run(
            [sys.executable, "-c", _WRITE_POINT_WORKER, source, target, str(at)],
            capture_output=True,
            text=True,
            timeout=240,
            cwd=REPO,
            check=False,
        )
        assert killed.returncode == fault_injection.KILLED, (at, killed.stderr[-2000:])
        report = copy_store(source, target)
        assert (report.copied + report.unchanged, report.verified) == (COUNT, COUNT), at
        assert _contents(target) == _contents(source)
    assert report.unchanged > 0  # killed near its end, the last run resumed from a checkpoint


def _cli_error(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    from care_retriever.cli.main import main

    code = main(["copy", *args, "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return code, err


def test_cli_errors_are_one_line(source: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = source.removeprefix("faiss:")
    code, err = _cli_error(capsys, "--from", "nope:x", "--to", f"faiss:{tmp_path / 't'}")
    assert code == 2 and "invalid store 'nope:x'" in err
    code, err = _cli_error(capsys, "--from", source, "--to", f"faiss:{path}/../{Path(path).name}")
    assert code == 2 and "same store" in err
    code, err = _cli_error(capsys, "--from", f"faiss:{tmp_path / 'missing'}", "--to", f"faiss:{tmp_path / 't'}")
    assert code == 2 and "does not exist" in err
    code, err = _cli_error(capsys, "--from", f"qdrant:{tmp_path / 'missing-q'}", "--to", f"faiss:{tmp_path / 't'}")
    assert code == 2 and "no store there" in err
    code, err = _cli_error(capsys, "--from", source, "--to", f"faiss:{tmp_path / 't'}", "--shards", "2")
    assert code == 2 and "--shards applies to Qdrant stores only" in err
    # an unreachable Qdrant server: one line, nothing copied
    code, err = _cli_error(capsys, "--from", source, "--to", "qdrant:http://127.0.0.1:9")
    assert code == 2 and "cannot reach Qdrant" in err
    assert sorted(os.listdir(tmp_path)) == []  # nothing created: no target, no source folder made by opening one


@pytest.mark.parametrize(
    ("options", "remedy"),
    [(("--quantize", "sq8"), "leave out --quantize"), (("--index-type", "ivf", "--nlist", "64"), "lower --nlist")],
)
def test_a_source_too_small_to_train_the_target_index_is_refused_with_what_to_do(
    source: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], options: tuple[str, ...], remedy: str
) -> None:
    """A compressed or IVF FAISS target trains on its first vectors: a source with fewer than it needs is one line
    saying so and what the user can do (no chunk size: copy has none), before anything is written; the same copy
    without those options then completes."""
    small = f"faiss:{tmp_path / 'small'}"
    _write_store(small, count=20, sparse=False)
    target = tmp_path / "target"
    code, err = _cli_error(capsys, "--from", small, "--to", f"faiss:{target}", *options)
    assert code == 2 and "chunk size" not in err, err
    assert f"faiss:{tmp_path / 'small'} holds 20 documents" in err and remedy in err, err
    assert not [p.name for p in tmp_path.iterdir() if "target" in p.name]  # nothing created, nothing staged
    report = copy_store(small, f"faiss:{target}")
    assert report.copied == 20 and report.verified == 20


# ------------------------------------------------------------------------------------------ a failed copy's staging
STEPS = ("--batch-size", "20", "--checkpoint-every", "40")  # d100 fails in the 6th batch: 2 checkpoints before it


def _damaged(folder: Path, *, broken: bool = True) -> str:
    """A FAISS store of COUNT documents whose d100 text no longer matches its stored hash (``broken=False``:
    mended); its spec."""
    import sqlite3

    spec = f"faiss:{folder}"
    if not folder.exists():
        _write_store(spec, sparse=False)
    with sqlite3.connect(folder / "docstore.sqlite") as db:
        text = db.execute("SELECT text FROM documents WHERE id = 'd100'").fetchone()[0].rstrip("！")
        db.execute("UPDATE documents SET text = ? WHERE id = 'd100'", (text + "！" if broken else text,))
    return spec


def _failed_hnsw_copy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    """A copy into a new FAISS target as HNSW that stops on a damaged source document after two checkpoints:
    (the damaged source, the target)."""
    damaged, target = _damaged(tmp_path / "damaged"), f"faiss:{tmp_path / 'target'}"
    code, err = _cli_error(capsys, "--from", damaged, "--to", target, "--index-type", "hnsw", *STEPS)
    assert code == StoreError.exit_code and "content hash mismatch for 'd100'" in err, err
    assert "80 documents staged, not published" in err and f"copy --to {target} --discard-pending" in err, err
    assert (tmp_path / ".target.staging").is_dir() and not (tmp_path / "target").exists()
    return damaged, target


def test_a_failed_copy_is_neither_resumed_nor_published_by_another_copy(
    source: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A copy with other index options (then from another source) into the target of a failed HNSW copy is
    refused in one line naming the pending copy; nothing is published."""
    damaged, target = _failed_hnsw_copy(tmp_path, capsys)
    code, err = _cli_error(capsys, "--from", damaged, "--to", target, *STEPS)  # the same source, flat
    assert code == StoreError.exit_code and f"an unfinished `copy` of faiss:{tmp_path / 'damaged'}" in err, err
    assert "80 documents staged" in err and "index.index_type flat (the pending run's: hnsw)" in err, err
    assert f"`care-retriever copy --to {target} --discard-pending`" in err, err
    code, err = _cli_error(capsys, "--from", source, "--to", target, "--index-type", "hnsw")  # another source
    assert code == StoreError.exit_code and "is pending in" in err and f"`copy` of {source}" in err, err
    assert not (tmp_path / "target").exists()  # nothing published
    assert (tmp_path / ".target.staging").is_dir()  # nor the pending copy lost


def test_the_same_copy_run_again_resumes_and_publishes_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from care_retriever.cli.main import main

    damaged, target = _failed_hnsw_copy(tmp_path, capsys)
    _damaged(tmp_path / "damaged", broken=False)  # the source mended, the same copy again
    argv = ["copy", "--from", damaged, "--to", target, "--index-type", "hnsw", *STEPS, "--no-progress", "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["unchanged"], report["copied"], report["verified"]) == (80, COUNT - 80, COUNT)  # resumed
    assert report["index"]["type"] == "hnsw" and not (tmp_path / ".target.staging").exists()
    assert _contents(target) == _contents(damaged)


@pytest.mark.parametrize("command", ["copy", "index"])
def test_discarding_a_failed_copy_lets_another_one_run(
    source: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """``copy --to T --discard-pending`` (or ``index --store T --discard-pending``: the two are one) drops the
    failed copy's staging; a plain copy then writes the target as the source's kind (flat), whole."""
    from care_retriever.cli.main import main

    _, target = _failed_hnsw_copy(tmp_path, capsys)
    where = ["--to", target] if command == "copy" else ["--store", target]
    assert main([command, *where, "--discard-pending"]) == 0
    out = capsys.readouterr().out
    assert "an unfinished `copy` of" in out and "discarded" in out, out
    assert not (tmp_path / ".target.staging").exists()
    report = copy_store(source, target)
    assert (report.copied, report.verified, report.index["type"]) == (COUNT, COUNT, "flat")


def test_a_pending_copy_refuses_a_delete_and_keeps_the_published_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from care_retriever.cli.main import main

    target = f"faiss:{tmp_path / 'target'}"
    _write_store(target, count=20, sparse=False)  # published: d000..d019
    held = _held(target)
    damaged = _damaged(tmp_path / "damaged")
    code, err = _cli_error(capsys, "--from", damaged, "--to", target, *STEPS)
    assert code == StoreError.exit_code and "100 documents staged, not published" in err, err
    assert main(["delete", "d001", "--store", target]) == StoreError.exit_code
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "an unfinished `copy` of" in err and f"copy --to {target} --discard-pending" in err
    assert _held(target) == held  # the published target as it was


def test_a_failed_copy_into_qdrant_says_what_stays_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Qdrant Edge publishes each write as it is made: nothing is pending, and the failed copy's line says how many
    documents it left in the target; the same copy, its source mended, finishes it."""
    damaged, target = _damaged(tmp_path / "damaged"), f"qdrant:{tmp_path / 'target'}"
    code, err = _cli_error(capsys, "--from", damaged, "--to", target, *STEPS)
    assert code == StoreError.exit_code and "the 100 documents written before it stay in qdrant:" in err, err
    _damaged(tmp_path / "damaged", broken=False)
    report = copy_store(damaged, target)
    assert (report.unchanged, report.copied, report.verified) == (100, COUNT - 100, COUNT)
