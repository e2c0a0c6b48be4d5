"""The authors' released CARE models (``query_encoder/`` + ``doc_encoder/``) give the authors' vectors here.

The reference is what the authors' own ``inference/asymmetric.py`` gives for the same folders, computed at their
pinned stack by ``tests/fixtures/release/authors_reference.py`` and committed as ``reference.json`` (their code is
not in this repository: it is licensed non-commercial). The fixtures are tiny random towers in the release layout,
rebuilt bit for bit by ``make_release_fixtures.py``: a BERT query tower, and a gte query tower saved in gte's
original ``new`` format with NTK rope, each beside a Qwen3 document tower wider than the 768 dims kept.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from care_retriever.errors import ModelError
from tests.support.cli import run_cli
from tests.support.data import load_script
from tests.support.vectors import cosines

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "release"
REFERENCE = json.loads((FIXTURES / "reference.json").read_text("utf-8"))
make = load_script(FIXTURES / "make_release_fixtures.py", "make_release_fixtures")
KINDS = ("bert", "gte")
# the authors' task names -> this package's task types
TASKS = {"retrieval": "retrieval", "medteb_reranking": "rerank", "medteb_sts_v1": "sts"}


QUERIES: list[str] = REFERENCE["queries"]
DOCUMENTS: list[str] = REFERENCE["documents"]


def reference(kind: str) -> dict:
    return REFERENCE["fixtures"][kind]


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("release")
    return {kind: make.build_release_fixture(kind, root / kind) for kind in KINDS}


@pytest.fixture(scope="module")
def embedders(release: dict[str, Path]) -> dict:
    from care_retriever.model.embedder import AsymmetricEmbedder

    return {kind: AsymmetricEmbedder.from_pretrained(release[kind]) for kind in KINDS}


def one_error_line(err: str) -> bool:
    """The CLI's error is one line (a progress line may come before it), and no traceback."""
    lines = err.strip().splitlines()
    return (
        lines[-1].startswith("error: ")
        and sum(line.startswith("error:") for line in lines) == 1
        and ("Traceback" not in err)
    )


def test_the_fixtures_are_the_ones_the_reference_was_computed_on(release: dict[str, Path]) -> None:
    for kind in KINDS:
        for rel, sha in reference(kind)["sha256"].items():
            assert make.sha256_file(release[kind] / rel) == sha, f"{kind}/{rel} drifted from reference.json"


@pytest.mark.parametrize("kind", KINDS)
def test_document_vectors_equal_the_authors(embedders: dict, kind: str) -> None:
    ref = reference(kind)
    want = np.asarray(ref["document_vectors"], dtype=np.float32)
    got = embedders[kind].embed_documents(DOCUMENTS, batch_size=4)
    assert got.shape == want.shape
    assert cosines(got, want).min() >= 0.9999
    # normalised at full width, then cut: the norms (below 1) are the authors' too
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), np.linalg.norm(want, axis=1), atol=1e-4)
    assert np.linalg.norm(want, axis=1).max() < 0.99


@pytest.mark.parametrize("kind", KINDS)
def test_query_vectors_equal_the_authors_for_each_task(embedders: dict, kind: str) -> None:
    ref = reference(kind)
    embedder = embedders[kind]
    for task, task_type in TASKS.items():
        instruction = embedder.config.task_instruction(task_type)
        assert instruction == REFERENCE["instructions"][task]
        got = embedder.embed_queries(QUERIES, instruction=instruction, batch_size=3)
        want = np.asarray(ref["query_vectors"][task], dtype=np.float32)
        assert cosines(got, want).min() >= 0.9999, task


@pytest.mark.parametrize("kind", KINDS)
def test_scores_and_order_equal_the_authors(embedders: dict, kind: str) -> None:
    ref = reference(kind)
    embedder = embedders[kind]
    scores = embedder.embed_queries(QUERIES) @ embedder.embed_documents(DOCUMENTS).T
    want = np.asarray(ref["scores_retrieval"])
    assert np.abs(scores - want).max() <= 1e-3
    assert (np.argsort(-scores, axis=1) == np.argsort(-want, axis=1)).all()


def test_tokens_are_the_authors(embedders: dict) -> None:
    """The document tokenizer appends nothing (their slow tokenizer ignores add_eos_token); the query text is
    their instruction format."""
    ref = reference("bert")
    embedder = embedders["bert"]
    tokenizer = embedder.document_model.tokenizer
    for index, ids in ref["doc_token_ids"].items():
        assert tokenizer(DOCUMENTS[int(index)], truncation=True, max_length=512)["input_ids"] == ids
    prompt = embedder.query_prompt(embedder.config.task_instruction("retrieval"))
    formatted = [prompt + q for q in QUERIES]
    assert formatted[: len(ref["query_inputs_retrieval"])] == ref["query_inputs_retrieval"]
    query_tokenizer = embedder.query_model.tokenizer
    for index, ids in ref["query_token_ids"].items():
        assert query_tokenizer(formatted[int(index)])["input_ids"] == ids


def test_the_gte_query_tower_runs_natively_with_its_rope_scaling(embedders: dict, release: dict[str, Path]) -> None:
    """No remote code: transformers' GteModel, with the NTK scaling carried over (dropped, the vectors differ)."""
    from transformers import GteModel

    from care_retriever.model.towers.release import gte_config_from_new

    model = embedders["gte"].query_modules[0].auto_model
    assert isinstance(model, GteModel)
    config = json.loads((release["gte"] / "query_encoder" / "config.json").read_text("utf-8"))
    assert model.config.rope_parameters["rope_type"] == "linear"
    converted = gte_config_from_new(config, "fixture")
    assert converted["rope_parameters"]["rope_theta"] == pytest.approx(
        config["rope_theta"] * config["rope_scaling"]["factor"]
    )


@pytest.mark.parametrize("kind", KINDS)
def test_the_release_is_a_model_everywhere_via_the_cli(
    capsys, release: dict[str, Path], tmp_path: Path, kind: str
) -> None:
    """index then search with the release folder as --model: the authors' scores and order."""
    ref = reference(kind)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "".join(json.dumps({"_id": f"d{i}", "text": t}, ensure_ascii=False) + "\n" for i, t in enumerate(DOCUMENTS)),
        encoding="utf-8",
    )
    store = f"faiss:{tmp_path / 'store'}"
    code, _, err = run_cli(
        capsys, "index", "--model", release[kind], "--corpus", corpus, "--store", store, "--no-progress"
    )
    assert code == 0, err
    n = len(DOCUMENTS)
    code, out, err = run_cli(
        capsys, "search", "--model", release[kind], "--store", store, "--top-k", n, "--json", *QUERIES[:3]
    )
    assert code == 0, err
    want = np.asarray(ref["scores_retrieval"])
    for row, line in enumerate(out.strip().splitlines()):
        hits = json.loads(line)["hits"]
        order = [int(h["id"][1:]) for h in hits]
        assert order == list(np.argsort(-want[row])), row
        assert max(abs(h["score"] - want[row][int(h["id"][1:])]) for h in hits) <= 1e-3


def test_qdrant_scores_release_vectors_by_dot_product(embedders: dict, tmp_path: Path) -> None:
    """Qdrant's cosine would renormalise the cut document vectors; the store is created with DOT."""
    from care_retriever.indexing.corpus import Document
    from care_retriever.indexing.writer import DocumentStoreWriter
    from care_retriever.search.retriever import CareRetriever

    ref = reference("bert")
    spec = f"qdrant:{tmp_path / 'qdrant'}"
    docs = [Document(f"d{i}", t) for i, t in enumerate(DOCUMENTS)]
    DocumentStoreWriter(embedders["bert"], spec, show_progress=False).write(docs)
    retriever = CareRetriever(spec, embedders["bert"])
    try:
        hits = retriever.search(QUERIES[0], top_k=len(docs))
    finally:
        retriever.close()
    want = np.asarray(ref["scores_retrieval"][0])
    assert [int(h.id[1:]) for h in hits] == list(np.argsort(-want))
    assert max(abs(h.score - want[int(h.id[1:])]) for h in hits) <= 1e-3


def test_converted_model_keeps_the_conventions(
    capsys, release: dict[str, Path], embedders: dict, tmp_path: Path
) -> None:
    """init --from-release writes this package's format; it and plain sentence-transformers give the same vectors."""
    from sentence_transformers import SentenceTransformer

    from care_retriever.model.embedder import AsymmetricEmbedder

    out = tmp_path / "converted"
    code, _, err = run_cli(capsys, "init", out, "--from-release", release["bert"])
    assert code == 0, err
    config = json.loads((out / "care_config.json").read_text("utf-8"))
    assert config["convention"] == "authors-release" and config["normalize"] == "before_truncation"
    assert config["document"]["appended_tokens"] == [] and config["similarity"] == "dot"
    ref = reference("bert")
    converted = AsymmetricEmbedder.from_pretrained(out)
    want_d = np.asarray(ref["document_vectors"], dtype=np.float32)
    assert cosines(converted.embed_documents(DOCUMENTS), want_d).min() >= 0.9999
    st = SentenceTransformer(str(out))
    np.testing.assert_allclose(st.encode_document(DOCUMENTS), want_d, atol=2e-4)
    want_q = np.asarray(ref["query_vectors"]["retrieval"], dtype=np.float32)
    assert cosines(st.encode_query(QUERIES), want_q).min() >= 0.9999


# ---------------------------------------------------------------------- bad input
def test_one_tower_folder_is_one_line(capsys, release: dict[str, Path], tmp_path: Path) -> None:
    half = tmp_path / "half"
    shutil.copytree(release["bert"] / "query_encoder", half / "query_encoder")
    code, _out, err = run_cli(capsys, "init", tmp_path / "out", "--from-release", half)
    assert code == 2 and "no doc_encoder/" in err and one_error_line(err)
    assert not (tmp_path / "out").exists()


def test_an_adapter_only_document_tower_names_what_to_pass(capsys, release: dict[str, Path], tmp_path: Path) -> None:
    folder = tmp_path / "adapter-release"
    shutil.copytree(release["bert"] / "query_encoder", folder / "query_encoder")
    (folder / "doc_encoder").mkdir()
    (folder / "doc_encoder" / "adapter_config.json").write_text(
        json.dumps({"base_model_name_or_path": "Qwen/Qwen3-4B", "peft_type": "LORA"}), encoding="utf-8"
    )
    (folder / "doc_encoder" / "adapter_model.safetensors").write_bytes(b"")
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"_id": "a", "text": "高血压"}, ensure_ascii=False) + "\n", encoding="utf-8")
    code, _, err = run_cli(capsys, "index", "--model", folder, "--corpus", corpus, "--store", f"faiss:{tmp_path / 's'}")
    assert code == 2 and one_error_line(err)
    assert "--document-model Qwen/Qwen3-4B" in err and "--document-adapter" in err


def test_a_gte_config_the_native_model_cannot_reproduce_is_refused(
    capsys, release: dict[str, Path], tmp_path: Path
) -> None:
    folder = tmp_path / "mixed"
    shutil.copytree(release["gte"], folder)
    config_path = folder / "query_encoder" / "config.json"
    config = json.loads(config_path.read_text("utf-8"))
    config["rope_scaling"]["mixed_b"] = 0.5
    config_path.write_text(json.dumps(config), encoding="utf-8")
    code, _, err = run_cli(capsys, "init", tmp_path / "out", "--from-release", folder)
    assert code == 2 and "cannot be read here" in err and one_error_line(err)
    assert not (tmp_path / "out").exists()


def test_a_store_of_another_convention_refuses_the_release(capsys, release: dict[str, Path], tmp_path: Path) -> None:
    """The same towers read with this package's own convention (EOS appended, renormalised) write another space."""
    from care_retriever.errors import StoreError
    from care_retriever.indexing.corpus import Document
    from care_retriever.indexing.writer import DocumentStoreWriter
    from care_retriever.model.embedder import AsymmetricEmbedder
    from care_retriever.search.retriever import CareRetriever

    own = AsymmetricEmbedder.from_towers(
        str(release["bert"] / "query_encoder"), str(release["bert"] / "doc_encoder"), default_instruction=""
    )
    spec = f"faiss:{tmp_path / 'own'}"
    DocumentStoreWriter(own, spec, show_progress=False).write([Document("a", "高血压患者应低盐饮食。")])
    with pytest.raises(StoreError, match="built with another model"):
        CareRetriever.from_pretrained(str(release["bert"]), spec)


def test_an_instruction_to_a_tower_without_a_slot_is_an_error(release: dict[str, Path]) -> None:
    from care_retriever.model.embedder import AsymmetricEmbedder

    own = AsymmetricEmbedder.from_towers(str(release["bert"] / "query_encoder"), str(release["bert"] / "doc_encoder"))
    assert not own.takes_instruction
    with pytest.raises(ModelError, match="takes no instruction"):
        own.embed_queries(["血压高"], instruction="Given a question")


def test_the_non_commercial_licence_is_said_once(caplog, release: dict[str, Path], tmp_path: Path) -> None:
    from care_retriever.model.embedder import AsymmetricEmbedder

    folder = tmp_path / "licensed"
    shutil.copytree(release["bert"], folder)
    (folder / "README.md").write_text("---\nlicense: cc-by-nc-sa-4.0\n---\n# CARE\n", encoding="utf-8")
    with caplog.at_level("WARNING", logger="care_retriever"):
        AsymmetricEmbedder.from_pretrained(folder, load="query")
        AsymmetricEmbedder.from_pretrained(folder, load="query")
    said = [r for r in caplog.records if "non-commercial" in r.getMessage()]
    assert len(said) == 1 and "cc-by-nc-sa-4.0" in said[0].getMessage()


def test_init_writes_nothing_when_a_tower_cannot_encode(capsys, release: dict[str, Path], tmp_path: Path) -> None:
    """A query tower whose own model code fails at its first forward (as gte's 'new' code does under
    transformers 5) is refused at init, in one line, before anything is written."""
    from tests.support.hub_towers import write_remote_code_encoder

    # a folder name of its own: transformers caches a local folder's model code by the folder's name (and a hash
    # of its configuration), so another test's "remote" tower would import this failing code
    query = write_remote_code_encoder(tmp_path / "failing_gte_like_tower")
    code_file = query / "modeling_remote.py"
    code_file.write_text(
        code_file.read_text("utf-8").replace(
            "        out = super().forward(*args, **kwargs)",
            '        raise IndexError("index out of range in self")',
        ),
        encoding="utf-8",
    )
    out = tmp_path / "model"
    code, _, err = run_cli(
        capsys,
        "init",
        out,
        "--query-model",
        query,
        "--document-model",
        release["bert"] / "doc_encoder",
        "--trust-remote-code",
    )
    assert code == 2 and one_error_line(err) and "query tower cannot encode a text" in err
    assert not out.exists()


def test_eval_reads_the_release_as_a_care_model(capsys, release: dict[str, Path], tmp_path: Path) -> None:
    """`eval --model F`: the release layout is evaluated as the authors read it (not as a sentence-transformers
    folder): with each query's top document by the authors' scores judged relevant, nDCG@10 is 1."""
    ref = reference("bert")
    task = tmp_path / "release-task"
    (task / "qrels").mkdir(parents=True)
    rows = [{"_id": f"d{i}", "title": "", "text": t} for i, t in enumerate(DOCUMENTS)]
    (task / "corpus.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    queries = [{"_id": f"q{i}", "text": q} for i, q in enumerate(QUERIES)]
    (task / "queries.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in queries), "utf-8")
    best = np.asarray(ref["scores_retrieval"]).argmax(axis=1)
    (task / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{b}\t1\n" for i, b in enumerate(best)), "utf-8"
    )
    code, out, err = run_cli(capsys, "eval", "--model", release["bert"], "--task", task, "--json", "--no-progress")
    assert code == 0, err
    assert json.loads(out)["metrics"]["ndcg@10"] == pytest.approx(1.0)


def test_the_release_layout_is_a_care_model_for_every_cli_model_option(release: dict[str, Path]) -> None:
    """bench, eval and the other commands that tell CARE models from sentence-transformers models ask one function."""
    from care_retriever.model.baselines import is_care_model

    assert is_care_model(str(release["bert"]))
    assert not is_care_model(str(release["bert"] / "query_encoder"))  # one tower of it is a plain transformers folder
