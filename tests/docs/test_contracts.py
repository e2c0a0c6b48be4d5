"""One definition of each contract, used everywhere.

The document tower's input text, the space fingerprint, the query prompt, "is this a local path",
SQL ``IN`` chunking and the ``Embedder`` protocol: each test compares every place that applies a
contract, so a copy that drifts from the definition fails here.
"""

from __future__ import annotations

import ast
import hashlib
import itertools
import json
import shutil
import sqlite3
from pathlib import Path

import pytest
import torch

from care_retriever import documents
from care_retriever.documents import Document, document_text
from care_retriever.errors import ModelError, StoreError
from care_retriever.indexing.corpus import read_corpus

REPO = Path(__file__).resolve().parents[2]
SOURCE_DIRS = [REPO / "care_retriever", REPO / "integrations", REPO / "training"]

# (id, title, text): a title, none, a blank one, an empty text under a title, a null title
ROWS = [
    ("a", "高血压", "高血压患者应低盐饮食。"),
    ("b", "", "普通感冒多由病毒引起。"),
    ("c", "  ", "空白标题的文档。"),
    ("d", "只有标题", ""),
    ("e", None, "标题为 null 的文档。"),
]


def _sources(skip: tuple[str, ...] = ()) -> list[Path]:
    files = [p for d in SOURCE_DIRS for p in d.rglob("*.py")]
    return [p for p in files if not any(part in skip for part in p.relative_to(REPO).parts)]


# ---------------------------------------------------------------------- document text
@pytest.fixture
def beir_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "task"
    (folder / "qrels").mkdir(parents=True)
    with (folder / "corpus.jsonl").open("w", encoding="utf-8") as fh:
        for doc_id, title, text in ROWS:
            fh.write(json.dumps({"_id": doc_id, "title": title, "text": text}, ensure_ascii=False) + "\n")
    (folder / "queries.jsonl").write_text('{"_id": "q1", "text": "血压高怎么办"}\n', encoding="utf-8")
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\ta\t1\n", encoding="utf-8")
    return folder


def test_every_reader_gives_the_document_tower_the_same_text(beir_folder: Path) -> None:
    pytest.importorskip("haystack")
    from haystack import Document as HaystackDocument

    from care_retriever.evaluation.benchmark import read_texts
    from care_retriever.evaluation.tasks import load_task
    from care_retriever.integrations.common import to_core_document
    from care_retriever.integrations.haystack.document_embedder import CareDocumentEmbedder
    from care_retriever.training.quickstart import Sample

    expected = [document_text(title or "", text) for _, title, text in ROWS]
    assert expected[0] == "高血压\n高血压患者应低盐饮食。" and expected[1] == "普通感冒多由病毒引起。"

    readers = {
        "corpus reader (care-retriever index)": [d.embedding_text() for d in read_corpus(beir_folder)],
        "eval task loader": load_task(beir_folder).corpus_texts,
        "bench text reader": read_texts(beir_folder / "corpus.jsonl", len(ROWS)),
        "haystack document embedder": [
            CareDocumentEmbedder(model="unused").text_to_embed(
                HaystackDocument(content=text, meta={} if title is None else {"title": title})
            )
            for _, title, text in ROWS
        ],
        "framework stores (to_core_document)": [
            to_core_document(doc_id, text, {} if title is None else {"title": title}).embedding_text()
            for doc_id, title, text in ROWS
        ],
        "quickstart sample": [Sample([], {}, {}).doc_text({"_id": i, "title": t, "text": x}) for i, t, x in ROWS],
    }
    for name, texts in readers.items():
        assert texts == expected, name


def test_haystack_embedder_and_framework_stores_agree_on_framework_titles() -> None:
    """Titles only frameworks can carry (not a str, empty): the embedder embeds what the store keeps as title."""
    pytest.importorskip("haystack")
    from haystack import Document as HaystackDocument

    from care_retriever.integrations.common import to_core_document
    from care_retriever.integrations.haystack.document_embedder import CareDocumentEmbedder

    embedder = CareDocumentEmbedder(model="unused")
    for meta in ({"title": 5}, {"title": ""}, {"title": None}, {"title": ["a"]}, {"title": "标题", "topic": "x"}):
        core = to_core_document("id", "正文", meta)
        assert embedder.text_to_embed(HaystackDocument(content="正文", meta=meta)) == core.embedding_text(), meta


def test_no_copy_of_the_document_text_rule() -> None:
    """``f"{title}\\n{text}"`` is written once, in documents.py; every other place calls document_text."""
    copies = []
    for path in _sources():
        if path == REPO / "care_retriever" / "documents.py":
            continue
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.JoinedStr):
                parts = node.values
                for first, middle in itertools.pairwise(parts):
                    if (
                        isinstance(first, ast.FormattedValue)
                        and "title" in ast.unparse(first.value)
                        and isinstance(middle, ast.Constant)
                        and middle.value == "\n"
                    ):
                        copies.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not copies, f"copies of the document text rule (use care_retriever.documents.document_text): {copies}"


# ---------------------------------------------------------------------- fingerprint
def _fingerprint_before_one_definition(modules, dim: int, flatten: bool) -> str:
    """The fingerprint as embedder.py (flatten=False) and baselines.py (flatten=True) computed it."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"dim={dim};".encode())
    for module in modules:
        for key, tensor in sorted(module.state_dict().items()):
            digest.update(key.encode())
            t = tensor.detach().to("cpu").contiguous()
            digest.update((t.view(-1) if flatten else t).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _as_saved_before_conventions(model_dir: Path, tmp_path: Path) -> Path:
    """A copy of ``model_dir`` whose config records no tokenizer conventions, as models saved before them."""
    old_dir = tmp_path / "old-model"
    shutil.copytree(model_dir, old_dir)
    config = json.loads((old_dir / "care_config.json").read_text("utf-8"))
    for side in ("query", "document"):
        config[side].pop("appended_tokens", None)
    (old_dir / "care_config.json").write_text(json.dumps(config), encoding="utf-8")
    return old_dir


def test_existing_models_keep_their_fingerprint(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A store written before the fingerprint had one definition still opens with the same model."""
    from care_retriever.integrations.common import model_space
    from care_retriever.model.baselines import OneTowerEmbedder
    from care_retriever.model.embedder import AsymmetricEmbedder

    tiny_model_dir = _as_saved_before_conventions(tiny_model_dir, tmp_path)
    embedder = AsymmetricEmbedder.from_pretrained(tiny_model_dir)
    saved = json.loads((tiny_model_dir / "care_config.json").read_text("utf-8"))["space_fingerprint"]
    old = _fingerprint_before_one_definition(embedder.document_modules, embedder.dim, flatten=False)
    assert embedder.space_fingerprint == saved == old
    assert embedder.document_space(embedder.hash_document_weights()) == old  # hashed again from the weights
    assert model_space(str(tiny_model_dir))[1] == old
    one_tower = OneTowerEmbedder(embedder, "document")
    assert one_tower.space_fingerprint == _fingerprint_before_one_definition(
        [one_tower.model], embedder.dim, flatten=True
    )


def test_the_appended_end_token_and_normalisation_are_part_of_the_space(tiny_model_dir: Path) -> None:
    """Two document towers with the same weights but another end token (or normalisation) embed differently:
    their fingerprints differ, so a store written by one refuses the other."""
    from care_retriever.model.config import CareConfig

    config = CareConfig.load(tiny_model_dir)
    assert config.document.appended_tokens  # the tiny decoder tower appends its EOS, recorded at init
    base = config.document_space()
    config.document.appended_tokens = [config.document.appended_tokens[0] + 1]
    other_token = config.document_space()
    config.document.appended_tokens = []
    nothing = config.document_space()
    assert len({base, other_token, nothing}) == 3
    config = CareConfig.load(tiny_model_dir)
    config.normalize = "before_truncation"
    assert config.document_space() != base


def test_a_document_text_rule_change_changes_every_fingerprint(
    monkeypatch, tiny_model_dir: Path, small_corpus_path: Path, tmp_path: Path
) -> None:
    from care_retriever.indexing.writer import DocumentStoreWriter
    from care_retriever.integrations.common import model_space
    from care_retriever.model.embedder import AsymmetricEmbedder
    from care_retriever.search.retriever import CareRetriever

    embedder = AsymmetricEmbedder.from_pretrained(tiny_model_dir)
    store = f"faiss:{tmp_path / 'store'}"
    DocumentStoreWriter(embedder, store, show_progress=False).write(read_corpus(small_corpus_path))
    before = embedder.space_fingerprint
    CareRetriever(store, embedder).close()  # same rule: the store opens

    monkeypatch.setattr(documents, "document_text", lambda title, text: f"{title}：{text}" if title else text)
    assert Document("x", "正文", "标题").embedding_text() == "标题：正文"  # the writer would now embed this
    after = embedder.space_fingerprint
    assert after != before
    assert model_space(str(tiny_model_dir))[1] == after  # the adapters read the config: same rule applied
    with pytest.raises(StoreError, match="built with another model"):
        CareRetriever(store, embedder)


# ---------------------------------------------------------------------- query prompt
def test_every_embedder_fills_the_one_query_prompt(tiny_model_dir: Path, tmp_path: Path) -> None:
    from care_retriever.model import baselines
    from care_retriever.model import embedder as embedder_module
    from care_retriever.model.baselines import OneTowerEmbedder, SentenceTransformerEmbedder
    from care_retriever.model.embedder import AsymmetricEmbedder
    from care_retriever.model.prompts import QUERY_PROMPT_TEMPLATE, fill_query_prompt

    care = AsymmetricEmbedder.from_pretrained(tiny_model_dir, load="query")
    care.config.query_prompt_template = QUERY_PROMPT_TEMPLATE  # what from_towers gives a decoder query tower
    st_folder = tmp_path / "st"
    st = care.query_model
    st.prompts = {"query": "Instruct: 其他任务\nQuery: ", "document": ""}
    st.save(str(st_folder))
    baseline = SentenceTransformerEmbedder(str(st_folder))

    expected = fill_query_prompt(QUERY_PROMPT_TEMPLATE, "检索医学文档")
    assert expected.startswith("Instruct: 检索医学文档")
    assert care.query_prompt("检索医学文档") == expected
    assert OneTowerEmbedder(care, "query").query_prompt("检索医学文档") == expected
    assert baseline.query_prompt("检索医学文档") == expected
    assert baseline.query_prompt(None) == "Instruct: 其他任务\nQuery: "  # a fixed prompt of the model is kept
    assert embedder_module.QUERY_PROMPT_TEMPLATE is baselines.QUERY_PROMPT_TEMPLATE is QUERY_PROMPT_TEMPLATE


def test_the_query_template_is_written_once() -> None:
    holders = [str(p.relative_to(REPO)) for p in _sources() if "Instruct: {instruction}" in p.read_text("utf-8")]
    assert holders == ["care_retriever/model/prompts.py"]


# ---------------------------------------------------------------------- local paths
@pytest.mark.parametrize("name", ["./no-such-model", "no-such/model/dir", "~/no-such-care-model", "C:\\models\\m"])
def test_every_loader_refuses_a_missing_local_path_alike(name: str) -> None:
    from care_retriever.integrations.common import check_model_location, model_space
    from care_retriever.model.baselines import load_embedder
    from care_retriever.model.embedder import AsymmetricEmbedder

    loaders = {
        "AsymmetricEmbedder.from_pretrained": lambda: AsymmetricEmbedder.from_pretrained(name),
        "baselines.load_embedder (eval, bench)": lambda: load_embedder(name),
        "integrations check_model_location": lambda: check_model_location(name),
        "integrations model_space": lambda: model_space(name),
    }
    for what, load in loaders.items():
        with pytest.raises(ModelError, match=r"^model folder not found") as info:
            load()
        assert name in str(info.value), what


def test_hub_ids_are_not_local_paths() -> None:
    from care_retriever.model.loading import local_model_dir, looks_local

    for hub_id in ("BAAI/bge-small-zh-v1.5", "Qwen/Qwen3-Embedding-0.6B", "bert-base-chinese"):
        assert not looks_local(hub_id) and local_model_dir(hub_id) is None
    with pytest.raises(ModelError):
        local_model_dir("  ")


def test_every_loader_expands_home(monkeypatch, tiny_model_dir: Path, tmp_path: Path) -> None:
    from care_retriever.integrations.common import model_space
    from care_retriever.model.baselines import load_embedder
    from care_retriever.model.embedder import AsymmetricEmbedder

    monkeypatch.setenv("HOME", str(tmp_path))
    shutil.copytree(tiny_model_dir, tmp_path / "models" / "tiny")
    name = "~/models/tiny"
    direct = AsymmetricEmbedder.from_pretrained(name, load="query")
    via_eval = load_embedder(name, load="query")
    assert isinstance(via_eval, AsymmetricEmbedder)
    assert direct.space_fingerprint == via_eval.space_fingerprint == model_space(name)[1]


# ---------------------------------------------------------------------- SQL IN chunking
def test_in_chunks_covers_every_value_within_the_parameter_limit() -> None:
    from care_retriever.sparse.sqlite_bm25 import MAX_IN_PARAMS, in_chunks

    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t (id TEXT PRIMARY KEY)")
    ids = [f"id{i}" for i in range(2 * MAX_IN_PARAMS + 1)]  # a last chunk of one
    db.executemany("INSERT INTO t VALUES (?)", [(i,) for i in ids])
    found, sizes = [], []
    for marks, chunk in in_chunks(ids):
        assert marks.count("?") == len(chunk)
        sizes.append(len(chunk))
        found += [r for (r,) in db.execute(f"SELECT id FROM t WHERE id IN ({marks})", chunk)]
    assert sorted(found) == sorted(ids) and sizes == [MAX_IN_PARAMS, MAX_IN_PARAMS, 1]
    assert list(in_chunks([])) == []
    with pytest.raises(ValueError):
        list(in_chunks(ids, 0))


def test_no_hand_rolled_in_list_outside_the_stores() -> None:
    """Outside care_retriever/stores/ (whose loops are the stores' own), IN lists come from
    care_retriever.sparse.sqlite_bm25."""
    loops = [
        str(p.relative_to(REPO))
        for p in _sources(skip=("stores",))
        if p.name != "sqlite_bm25.py" and '",".join("?"' in p.read_text("utf-8")
    ]
    assert not loops, f"use care_retriever.sparse.sqlite_bm25.in_chunks: {loops}"


# ---------------------------------------------------------------------- Embedder protocol
def test_every_dense_model_is_an_embedder(tiny_model_dir: Path, tmp_path: Path) -> None:
    from care_retriever.evaluation.benchmark import tower_params
    from care_retriever.evaluation.speed import count_parameters
    from care_retriever.indexing.writer import DocumentStoreWriter
    from care_retriever.model.baselines import OneTowerEmbedder, SentenceTransformerEmbedder
    from care_retriever.model.embedder import AsymmetricEmbedder
    from care_retriever.model.protocols import Embedder
    from care_retriever.sparse.bm25 import BM25Model
    from care_retriever.stores import open_store

    care = AsymmetricEmbedder.from_pretrained(tiny_model_dir)
    care.query_model.save(str(tmp_path / "st"))
    st = SentenceTransformerEmbedder(str(tmp_path / "st"))
    one = OneTowerEmbedder(care, "query")
    for model in (care, st, one):
        assert isinstance(model, Embedder), type(model).__name__
    assert not isinstance(BM25Model(), Embedder)

    assert care.document_model_name == "random:tiny" and st.document_model_name == str(tmp_path / "st")
    store = f"faiss:{tmp_path / 'store'}"
    DocumentStoreWriter(st, store, show_progress=False).write([Document("a", "高血压饮食")])
    assert open_store(store).require_manifest().model_name == str(tmp_path / "st")

    q, d = count_parameters(care.query_modules), count_parameters(care.document_modules)
    assert q > 0 and d > 0
    assert tower_params(care) == (q, d)
    assert tower_params(one) == (q, q)


ENCODER_PROTOCOLS = {"Embedder", "QueryEncoder", "DocumentEncoder"}


def test_embedders_are_typed_not_probed() -> None:
    """One definition of the encoder protocols; the modules that take an embedder type it by the side they
    use (a search process a QueryEncoder, the index writer a DocumentEncoder) and call it, never probe it."""
    definitions = [
        f"{p.relative_to(REPO)}"
        for p in _sources()
        for node in ast.walk(ast.parse(p.read_text("utf-8")))
        if isinstance(node, ast.ClassDef) and node.name == "Embedder"
    ]
    assert definitions == ["care_retriever/model/protocols.py"]
    for rel in (
        "care_retriever/indexing/writer.py",
        "care_retriever/search/retriever.py",
        "care_retriever/indexing/distributed.py",
        "care_retriever/evaluation/benchmark.py",
    ):
        tree = ast.parse((REPO / rel).read_text("utf-8"))
        probes = [
            node.lineno
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "hasattr"
        ]
        assert not probes, f"{rel}: hasattr at lines {probes}"
        hints = [
            ast.unparse(arg.annotation)
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            for arg in node.args.args + node.args.kwonlyargs
            if arg.arg == "embedder" and arg.annotation is not None
        ]
        assert hints and all(h in ENCODER_PROTOCOLS for h in hints), f"{rel}: embedder typed as {hints}"
