"""A Qdrant Edge store checked like a FAISS store: each point's content hash and vector checksum, recorded at write,
are checked by ``verify`` against the stored text and vector, so a byte changed in the engine's payload storage
or vector storage fails ``verify`` in one line, and a re-run of ``index`` rewrites the damaged point."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from care_retriever.cli.main import main
from care_retriever.documents import Document
from care_retriever.stores.qdrant import edge
from care_retriever.stores.qdrant.common import payload_of, point_id
from care_retriever.stores.qdrant.edge_store import EdgeStore
from care_retriever.stores.qdrant.edge_verify import VECTOR_CHECKSUM


def _cli(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _one_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def edge_store(tmp_path: Path, tiny_model_dir: Path, small_corpus_path: Path, capsys) -> tuple[Path, list[str]]:
    """A Qdrant Edge store indexed from the small corpus, and the command that indexed it."""
    store = tmp_path / "edge"
    index = ["index", "--model", tiny_model_dir, "--corpus", small_corpus_path, "--store", f"qdrant:{store}"]
    assert _cli(capsys, *index, "--no-progress")[0] == 0
    return store, [str(a) for a in index] + ["--no-progress"]


def _first_doc(corpus: Path) -> dict[str, str]:
    return json.loads(corpus.read_text("utf-8").splitlines()[0])


def _change_text_byte(store: Path, doc_id: str) -> None:
    """Change one byte of the stored text of ``doc_id`` where the engine keeps it (payload_storage/page_*.dat):
    the lead byte of its first character, to another valid 3-byte UTF-8 lead (another character)."""
    for page in store.rglob("payload_storage/page_*.dat"):
        data = bytearray(page.read_bytes())
        at = data.find(f'"doc_id":"{doc_id}"'.encode())
        if at < 0:
            continue
        text = data.index(b'"text":"', at) + len(b'"text":"')
        assert 0xE4 <= data[text] <= 0xE9, "the text starts with a CJK character"
        data[text] ^= 0x01
        page.write_bytes(bytes(data))
        return
    raise AssertionError(f"{doc_id} not found in the payload storage")


def _swap_vector_components(store: Path, vector: np.ndarray) -> None:
    """Swap the first two components of a stored vector where the engine keeps it (vector_storage/.../chunk_*.mmap):
    its norm is unchanged, its bytes are not."""
    for chunk in store.rglob("vector_storage/**/chunk_*.mmap"):
        data = bytearray(chunk.read_bytes())
        at = data.find(vector.astype("<f4").tobytes())
        if at < 0:
            continue
        data[at : at + 4], data[at + 4 : at + 8] = data[at + 4 : at + 8], data[at : at + 4]
        chunk.write_bytes(bytes(data))
        return
    raise AssertionError("the vector was not found in the vector storage")


def test_a_changed_text_byte_fails_verify_and_index_repairs_it(edge_store, small_corpus_path: Path, capsys) -> None:
    store, index = edge_store
    doc = _first_doc(small_corpus_path)
    _change_text_byte(store, doc["_id"])
    code, _, err = _cli(capsys, "verify", "--store", f"qdrant:{store}")
    line = _one_line(err)
    assert code == 2 and repr(doc["_id"]) in line and "no longer matches its content hash" in line, line
    assert _cli(capsys, *index)[0] == 0
    assert _cli(capsys, "verify", "--store", f"qdrant:{store}")[0] == 0
    with EdgeStore(str(store)) as reader:
        assert reader.get([doc["_id"]])[0].text == doc["text"]


def test_swapped_vector_components_fail_verify_and_index_repairs_them(
    edge_store, small_corpus_path: Path, capsys
) -> None:
    store, index = edge_store
    doc_id = _first_doc(small_corpus_path)["_id"]
    with EdgeStore(str(store)) as reader:
        vector = reader.vectors([doc_id])[0]
    assert vector[0] != vector[1]
    _swap_vector_components(store, vector)
    code, _, err = _cli(capsys, "verify", "--store", f"qdrant:{store}")
    line = _one_line(err)
    assert code == 2 and repr(doc_id) in line and "vector no longer matches its checksum" in line, line
    assert _cli(capsys, *index)[0] == 0
    assert _cli(capsys, "verify", "--store", f"qdrant:{store}")[0] == 0
    with EdgeStore(str(store)) as reader:
        # encoded again (alone, not in the first run's batch: float rounding may differ), components in place
        assert np.allclose(reader.vectors([doc_id])[0], vector, atol=1e-5)


def test_vectors_the_engine_normalizes_record_the_checksum_of_what_it_stored(tmp_path: Path) -> None:
    # a cosine shard stores a vector given with another norm than 1 normalized: other bytes than those given
    vectors = np.random.default_rng(1).standard_normal((50, 768)).astype(np.float32)
    ids = [f"d{i}" for i in range(50)]
    with EdgeStore(str(tmp_path / "edge")) as store:
        store.prepare(768, "fp", "model")
        store.upsert([Document(id=i, text="高血压") for i in ids], vectors)
        store.finalize()
        stored = np.stack(store.vectors(ids))
        assert not np.array_equal(stored, vectors)
        assert store.verify() == 50
        assert len(store.content_hashes(ids)) == 50  # none counts as damaged


def test_points_written_without_a_vector_checksum_verify_and_record_one_on_request(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "edge"
    document = Document(id="a", text="高血压")
    with EdgeStore(str(folder)) as store:
        store.prepare(4, "fp", "model")
        # the point as an earlier release wrote it: its payload without the vector's checksum
        store.require_shard().upsert([edge.EdgePoint(point_id("a"), [0.6, 0.8, 0.0, 0.0], payload_of(document))])
        store.finalize()
    with EdgeStore(str(folder)) as store, caplog.at_level(logging.WARNING, logger="care_retriever"):
        assert store.verify() == 1
        assert "1 points have no vector checksum" in caplog.text
        assert VECTOR_CHECKSUM not in store.require_shard().retrieve([point_id("a")])[0].payload
        assert store.verify(record_checksums=True) == 1
    with EdgeStore(str(folder)) as store:
        assert VECTOR_CHECKSUM in store.require_shard().retrieve([point_id("a")])[0].payload
        assert store.verify() == 1
