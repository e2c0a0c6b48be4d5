"""``care-retriever migrate`` on local-mode points an earlier release (or a hand-edited store) left odd: each is
converted or refused in one line naming the point, a refused run writes no target, and a re-run after a stopped
one resumes it and says how many documents were already there."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("qdrant_edge")
from qdrant_client import QdrantClient

from care_retriever.cli.main import main
from care_retriever.documents import Document
from care_retriever.stores.qdrant import EdgeStore, QdrantStore, point_id
from care_retriever.stores.qdrant.migrate import migrate_local

DIM = 8
Change = Callable[[dict[str, Any]], dict[str, Any]]  # a point's payload rewritten


def _cli(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _local_mode_store(folder: Path, n: int = 5, change: Change | None = None) -> str:
    """A qdrant-client local-mode store as the earlier release wrote ``qdrant:PATH``; ``change`` rewrites the
    payload of point d2. Returns that point's id."""
    vectors = np.random.default_rng(3).normal(size=(n, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    docs = [Document(id=f"d{i}", text=f"高血压 病例 {i}", title=f"t{i}", metadata={"g": i % 3}) for i in range(n)]
    client = QdrantClient(path=str(folder))
    store = QdrantStore(str(folder), client=client)
    store.prepare(DIM, "old-space", "old-model")
    store.upsert(docs, vectors)
    store.commit()
    if change is not None:
        payload = client.retrieve("care", [point_id("d2")], with_payload=True)[0].payload
        client.overwrite_payload("care", change(dict(payload)), points=[point_id("d2")])
    client.close()
    return point_id("d2")


def _without(key: str) -> Change:
    return lambda payload: {k: v for k, v in payload.items() if k != key}


def _with(key: str, value: Any) -> Change:
    return lambda payload: {**payload, key: value}


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (_without("text"), "('d2') has no text"),
        (_with("text", None), "('d2') has no text"),
        (_with("text", 12), "('d2') has no text"),
        (_with("metadata", ["heart", "lung"]), "('d2') has metadata that is no JSON object (a list)"),
        (_with("metadata", "heart"), "('d2') has metadata that is no JSON object (a str)"),
        (_with("title", 3), "('d2') has a title that is no string"),
        (_without("doc_id"), "has no doc_id"),
        (_with("doc_id", ""), "has no doc_id"),
        (_with("doc_id", "d0"), "both carry doc_id 'd0'"),
    ],
    ids=[
        "no-text",
        "null-text",
        "number-text",
        "list-metadata",
        "string-metadata",
        "number-title",
        "no-id",
        "empty-id",
        "duplicate-id",
    ],
)
def test_a_point_that_is_no_document_is_refused_in_one_line_and_nothing_is_written(
    tmp_path: Path, capsys, change: Change, said: str
) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    point = _local_mode_store(old, change=change)
    code, out, err = _cli(capsys, "migrate", "--from", f"qdrant:{old}", "--to", f"qdrant:{new}")
    lines = err.strip().splitlines()
    assert code == 2 and not out and len(lines) == 1 and "Traceback" not in err, err
    assert point in lines[0] and said in lines[0] and "nothing was converted" in lines[0], lines[0]
    assert not new.exists()


@pytest.mark.parametrize(
    ("change", "doc_id", "expected"),
    [
        (_with("doc_id", 7), "7", Document(id="7", text="高血压 病例 2", title="t2", metadata={"g": 2})),
        (_with("metadata", None), "d2", Document(id="d2", text="高血压 病例 2", title="t2", metadata={})),
        (_without("metadata"), "d2", Document(id="d2", text="高血压 病例 2", title="t2", metadata={})),
        (_with("title", None), "d2", Document(id="d2", text="高血压 病例 2", title="", metadata={"g": 2})),
        (_without("content_hash"), "d2", Document(id="d2", text="高血压 病例 2", title="t2", metadata={"g": 2})),
    ],
    ids=["number-id", "null-metadata", "no-metadata", "null-title", "no-content-hash"],
)
def test_a_point_with_a_convertible_payload_is_converted_and_a_rerun_says_it_is_there(
    tmp_path: Path, capsys, change: Change, doc_id: str, expected: Document
) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    _local_mode_store(old, change=change)
    code, out, err = _cli(capsys, "migrate", "--from", f"qdrant:{old}", "--to", f"qdrant:{new}")
    assert code == 0 and "ok: 5 documents of" in out and "already there" not in out, err
    with EdgeStore(str(new)) as store:
        assert store.get([doc_id]) == [expected] and store.verify() == 5
    code, out, err = _cli(capsys, "migrate", "--from", f"qdrant:{old}", "--to", f"qdrant:{new}")
    assert code == 0 and "ok: 5 documents (5 of them already there from an earlier run)" in out, err


def test_a_rerun_after_a_stopped_migrate_resumes_it_and_says_so(tmp_path: Path, capsys) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    _local_mode_store(old, n=300)  # two batches of 256 points

    def stop(points: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        migrate_local(old, new, progress=stop)
    with EdgeStore(str(new)) as partial:
        assert partial.count() == 256
    code, out, err = _cli(capsys, "migrate", "--from", f"qdrant:{old}", "--to", f"qdrant:{new}")
    assert code == 0 and "ok: 300 documents (256 of them already there from an earlier run)" in out, err
    with EdgeStore(str(new)) as store:
        assert store.verify() == 300


def test_manifests_without_their_checksum_convert(tmp_path: Path, capsys) -> None:
    # the old store's manifest as the first releases wrote it (no checksums, no format version), and a target whose
    # manifest an earlier release wrote without its own checksum
    old, new = tmp_path / "old", tmp_path / "new"
    _local_mode_store(old)
    client = QdrantClient(path=str(old))
    manifest = dict(client.get_collection("care").config.metadata["care_manifest"])
    for key in ("checksums", "block_checksums", "sizes", "sealed", "format_version"):
        manifest.pop(key, None)
    client.update_collection("care", metadata={"care_manifest": manifest})
    client.close()
    assert _cli(capsys, "migrate", "--from", f"qdrant:{old}", "--to", f"qdrant:{new}")[0] == 0
    written = new / "care" / "manifest.json"
    fields = json.loads(written.read_text("utf-8"))
    fields.pop("manifest_sha256")
    written.write_text(json.dumps(fields), encoding="utf-8")
    code, out, err = _cli(capsys, "migrate", "--from", f"qdrant:{old}", "--to", f"qdrant:{new}")
    assert code == 0 and "5 of them already there" in out, err
    with EdgeStore(str(new)) as store:
        assert store.verify() == 5
