"""The release-layout fixtures and the authors' reference vectors recorded for them.

``tests/fixtures/release/make_release_fixtures.py`` writes tiny CARE models in the layout the paper's authors
release (``query_encoder/`` + ``doc_encoder/``); ``reference.json`` holds what the authors' own inference code
(``authors_reference.py``, run at their pinned stack) computed for them. These tests keep the two honest: the
builder still writes byte-identical files (else a parity failure elsewhere would be "the fixture drifted", not
"parity broke"), and the recorded reference is internally consistent with what the authors' code does
(score = query . document, documents sliced to 768 of 1024 normalised dimensions without renormalising).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.release import make_release_fixtures as fixtures

REFERENCE = Path(fixtures.__file__).with_name("reference.json")
TASKS = ("retrieval", "medteb_reranking", "medteb_sts_v1")


@pytest.fixture(scope="module")
def reference() -> dict:
    return json.loads(REFERENCE.read_text(encoding="utf-8"))


@pytest.mark.parametrize("kind", fixtures.KINDS)
def test_the_builder_writes_the_files_the_reference_was_computed_on(kind: str, reference: dict, tmp_path: Path) -> None:
    recorded = reference["fixtures"][kind]
    out = fixtures.build_release_fixture(kind, tmp_path / kind)
    assert fixtures.expected_tensor_digests(kind) == recorded["tensor_sha256"], "fixture drifted: weights differ"
    written = fixtures.fixture_sha256(out)
    assert sorted(written) == sorted(recorded["sha256"]), "fixture drifted: other files"
    drifted = [name for name, sha in written.items() if sha != recorded["sha256"][name]]
    assert not drifted, f"fixture drifted: {drifted} differ from the files reference.json was computed on"


def test_the_release_layout(tmp_path: Path) -> None:
    out = fixtures.build_release_fixture("gte", tmp_path / "gte")
    query = json.loads((out / "query_encoder" / "config.json").read_text())
    doc = json.loads((out / "doc_encoder" / "config.json").read_text())
    assert query["model_type"] == "new" and query["architectures"] == ["NewModel"]
    assert query["auto_map"]["AutoModel"] == "Alibaba-NLP/new-impl--modeling.NewModel"
    assert query["rope_scaling"] == {"factor": 8.0, "type": "ntk"} and query["hidden_size"] == 768
    assert doc["model_type"] == "qwen3" and doc["architectures"] == ["Qwen3Model"] and doc["hidden_size"] > 768
    for name in ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json", "model.safetensors"):
        assert (out / "doc_encoder" / name).is_file(), name
    with pytest.raises(FileExistsError):
        fixtures.build_release_fixture("gte", out)


def test_the_reference_texts_are_the_builders(reference: dict) -> None:
    assert reference["queries"] == list(fixtures.QUERIES)
    assert reference["documents"] == list(fixtures.DOCUMENTS)
    assert set(reference["instructions"]) == set(TASKS)
    for task, instruction in reference["instructions"].items():
        assert reference["get_instruct"][task]["query"] == f"<instruct>{instruction}\n<query>{{text}}"
        assert reference["get_instruct"][task]["passage"] == "{text}"


@pytest.mark.parametrize("kind", fixtures.KINDS)
def test_the_reference_is_self_consistent(kind: str, reference: dict) -> None:
    entry = reference["fixtures"][kind]
    documents = np.asarray(entry["document_vectors"], dtype=np.float64)
    assert documents.shape == (len(fixtures.DOCUMENTS), 768)
    queries = {task: np.asarray(entry["query_vectors"][task], dtype=np.float64) for task in TASKS}
    for task, vectors in queries.items():
        assert vectors.shape == (len(fixtures.QUERIES), 768), task
        np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5, err_msg=task)
    # the instruction changes the query vector
    assert np.abs(queries["retrieval"] - queries["medteb_sts_v1"]).max() > 1e-2
    assert np.abs(queries["retrieval"] - queries["medteb_reranking"]).max() > 1e-2
    # normalised at 1024 dimensions, then cut to 768 without renormalising
    norms = np.linalg.norm(documents, axis=1)
    assert (norms < 0.99).all() and (norms > 0.5).all(), norms
    np.testing.assert_allclose(norms, entry["document_norms"], atol=1e-6)
    scores = np.asarray(entry["scores_retrieval"], dtype=np.float64)
    np.testing.assert_allclose(scores, queries["retrieval"] @ documents.T, atol=1e-6)
    # different texts get clearly different vectors
    unit = documents / norms[:, None]
    off_diagonal = (unit @ unit.T)[~np.eye(len(unit), dtype=bool)]
    assert off_diagonal.max() < 0.9


@pytest.mark.parametrize("kind", fixtures.KINDS)
def test_the_reference_records_the_authors_tokenisation(kind: str, reference: dict) -> None:
    entry = reference["fixtures"][kind]
    lengths = entry["doc_token_lengths_untruncated"]
    assert max(lengths) > 512 and min(lengths) < 10  # truncation and padding both exercised
    long_index = str(max(range(len(fixtures.DOCUMENTS)), key=lambda i: len(fixtures.DOCUMENTS[i])))
    assert len(entry["doc_token_ids"][long_index]) == 512
    doc_tokenizer = entry["doc_tokenizer"]
    assert doc_tokenizer["class"] == "Qwen2Tokenizer" and not doc_tokenizer["is_fast"]
    assert doc_tokenizer["padding_side"] == "left" and doc_tokenizer["appends_eos"] is False
    assert doc_tokenizer["fast_tokenizer_agrees_on_all_documents"]
    eos = json.loads((Path(fixtures.__file__).parent / "doc" / "tokenizer.json").read_text())["added_tokens"]
    special = {token["id"] for token in eos}
    for ids in entry["doc_token_ids"].values():
        assert ids[-1] not in special  # the last text token is pooled, no eos is appended
    vocab = fixtures._bert_vocab()
    for ids in entry["query_token_ids"].values():
        assert vocab[ids[0]] == "[CLS]" and vocab[ids[-1]] == "[SEP]"
