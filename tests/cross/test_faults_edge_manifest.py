"""A Qdrant Edge store's manifest edited by hand: ``verify`` names it in one line and a non-zero exit, as it does
for a FAISS store's (tests/cross/test_hostile_integrity.py). The shard keeps no copy of the model's fingerprint, the
metric or the backend, so without the manifest's own checksum an edit of those passed every check."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from care_retriever.documents import Document
from care_retriever.stores import open_store
from care_retriever.stores.qdrant.edge_manifest import MANIFEST_FILE
from tests.support.cli import run_cli

DIM = 8
VECS = np.random.default_rng(3).standard_normal((5, DIM)).astype(np.float32)
VECS /= np.linalg.norm(VECS, axis=1, keepdims=True)
DOCS = [Document(f"d{i}", f"文档 {i} 高血压", metadata={"n": i}) for i in range(5)]


def _edge_store(folder: Path) -> Path:
    store = open_store(f"qdrant:{folder}")
    store.prepare(DIM, "fp-of-the-model", "model")
    store.upsert(DOCS, VECS)
    store.finalize()
    store.close()
    return folder / "care" / MANIFEST_FILE


def test_an_untouched_edge_store_verifies(tmp_path: Path, capsys) -> None:
    _edge_store(tmp_path / "q")
    code, out, err = run_cli(capsys, "verify", "--store", f"qdrant:{tmp_path / 'q'}")
    assert code == 0 and out.startswith("ok:") and not err


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("space_fingerprint", "fp-of-another-model"),  # a search with another model would be let through
        ("model_name", "another"),
        ("metric", "dot"),  # the shard's distance stays cosine
        ("backend", "faiss"),
        ("count", 6),
    ],
)
def test_a_hand_edited_edge_manifest_is_caught_by_verify(tmp_path: Path, capsys, field: str, value: object) -> None:
    manifest = _edge_store(tmp_path / "q")
    data = json.loads(manifest.read_text("utf-8"))
    manifest.write_text(json.dumps({**data, field: value}, ensure_ascii=False, indent=1), encoding="utf-8")
    code, out, err = run_cli(capsys, "verify", "--store", f"qdrant:{tmp_path / 'q'}")
    line = err.strip()
    assert code == 2 and not out, out
    assert len(line.splitlines()) == 1 and "Traceback" not in line
    assert "manifest.json" in line and "checksum mismatch" in line, line


def test_later_writes_keep_the_edge_manifest_checksum_true(tmp_path: Path, capsys) -> None:
    _edge_store(tmp_path / "q")
    with open_store(f"qdrant:{tmp_path / 'q'}") as store, store.transaction() as tx:
        assert tx.delete(["d1"]) == 1
    code, out, _ = run_cli(capsys, "delete", "d2", "--store", f"qdrant:{tmp_path / 'q'}")
    assert code == 0
    code, out, err = run_cli(capsys, "verify", "--store", f"qdrant:{tmp_path / 'q'}")
    assert code == 0 and "holds 3 documents" in out, err


def test_a_manifest_without_a_checksum_is_named_until_one_is_recorded(tmp_path: Path, capsys) -> None:
    """An earlier release wrote the manifest without its own checksum: `verify` does not say "every check passed"
    for what it could not check; `--record-checksums` records one for it as it is, and edits are caught after."""
    from care_retriever.stores.manifest import MANIFEST_DIGEST

    manifest = _edge_store(tmp_path / "q")
    data = json.loads(manifest.read_text("utf-8"))
    del data[MANIFEST_DIGEST]
    manifest.write_text(json.dumps(data, ensure_ascii=False, indent=1), encoding="utf-8")
    spec = f"qdrant:{tmp_path / 'q'}"
    code, out, err = run_cli(capsys, "verify", "--store", spec)
    line = err.strip()
    assert code == 2 and not out and len(line.splitlines()) == 1, err
    assert "manifest has no checksum" in line and "verify --record-checksums" in line, line
    code, out, err = run_cli(capsys, "verify", "--store", spec, "--record-checksums")
    assert code == 0 and "holds 5 documents" in out, err
    assert json.loads(manifest.read_text("utf-8")) == {
        **data,
        MANIFEST_DIGEST: json.loads(manifest.read_text())[MANIFEST_DIGEST],
    }
    assert run_cli(capsys, "verify", "--store", spec)[0] == 0
    manifest.write_text(manifest.read_text("utf-8").replace("fp-of-the-model", "fp-of-another"), encoding="utf-8")
    code, _, err = run_cli(capsys, "verify", "--store", spec)
    assert code == 2 and "checksum mismatch" in err, err
