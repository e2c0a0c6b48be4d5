"""AsymmetricEmbedder: towers, pooling, truncation, prompts, save/load and the sentence-transformers round trip."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from care_retriever.errors import InputError, ModelError
from care_retriever.model.embedder import QUERY_PROMPT_TEMPLATE, AsymmetricEmbedder
from care_retriever.model.towers.scratch import build_random_towers, iter_vocab_texts

QUERIES = ["血压高怎么办", "宝宝发烧三十九度要去医院吗", "失眠"]
DOCS = [
    "高血压患者应低盐饮食，规律服用降压药。",
    "普通感冒多由病毒引起。",
    "拉肚子时注意补充水分和电解质，避免脱水。",
]


@pytest.fixture(scope="module")
def tower_dirs(tmp_path_factory: pytest.TempPathFactory, small_corpus_path: Path) -> tuple[Path, Path]:
    return build_random_towers("tiny", iter_vocab_texts([small_corpus_path]), tmp_path_factory.mktemp("towers"))


def test_outputs_are_unit_float32_of_the_shared_dim(embedder: AsymmetricEmbedder) -> None:
    q, d = embedder.embed_queries(QUERIES), embedder.embed_documents(DOCS)
    assert q.dtype == np.float32 and d.dtype == np.float32
    assert q.shape == (3, embedder.dim) and d.shape == (3, embedder.dim)
    np.testing.assert_allclose(np.linalg.norm(q, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(d, axis=1), 1.0, atol=1e-5)
    assert (embedder.query_dim, embedder.document_dim, embedder.mode) == (32, 48, "asymmetric")
    assert embedder.embed_queries([]).shape == (0, embedder.dim)


def test_batching_and_length_sorting_do_not_change_vectors(embedder: AsymmetricEmbedder) -> None:
    together = embedder.embed_documents(DOCS, batch_size=3)
    alone = np.vstack([embedder.embed_documents([t], batch_size=1) for t in DOCS])
    np.testing.assert_allclose(together, alone, atol=1e-5)


@pytest.mark.parametrize("side", ["left", "right"])
def test_last_token_pooling_reads_eos_under_either_padding(embedder: AsymmetricEmbedder, side: str) -> None:
    tokenizer = embedder.document_model[0].tokenizer
    assert tokenizer("高血压")["input_ids"][-1] == tokenizer.eos_token_id
    old = tokenizer.padding_side
    tokenizer.padding_side = side
    try:
        padded = embedder.embed_documents(["短", DOCS[2]], batch_size=2)[0]
        alone = embedder.embed_documents(["短"], batch_size=1)[0]
    finally:
        tokenizer.padding_side = old
    assert float(padded @ alone) > 0.9999


def test_document_tower_is_matryoshka_truncated_and_renormalised(embedder: AsymmetricEmbedder) -> None:
    transformer, pooling = embedder.document_modules[0], embedder.document_modules[1]
    features = embedder.document_model.preprocess(DOCS[:1])
    with torch.inference_mode():
        full = pooling(transformer(features))["sentence_embedding"][0].numpy()
    expected = full[: embedder.dim] / np.linalg.norm(full[: embedder.dim])
    np.testing.assert_allclose(embedder.embed_documents(DOCS[:1])[0], expected, atol=1e-5)


def test_save_and_load_round_trip(embedder: AsymmetricEmbedder, tmp_path: Path) -> None:
    embedder.save_pretrained(tmp_path / "m")
    loaded = AsymmetricEmbedder.from_pretrained(tmp_path / "m")
    np.testing.assert_allclose(loaded.embed_queries(QUERIES), embedder.embed_queries(QUERIES), atol=1e-6)
    np.testing.assert_allclose(loaded.embed_documents(DOCS), embedder.embed_documents(DOCS), atol=1e-6)
    assert loaded.space_fingerprint == embedder.space_fingerprint


def test_load_query_never_builds_the_document_tower(tiny_model_dir: Path, embedder: AsymmetricEmbedder) -> None:
    query_only = AsymmetricEmbedder.from_pretrained(tiny_model_dir, load="query")
    assert query_only.document_modules is None
    n_params = sum(p.numel() for p in query_only.query_model.parameters())
    assert n_params == sum(p.numel() for p in embedder.query_model.parameters())
    np.testing.assert_allclose(query_only.embed_queries(QUERIES), embedder.embed_queries(QUERIES), atol=1e-6)
    assert query_only.space_fingerprint == embedder.space_fingerprint
    with pytest.raises(ModelError, match="load='query'"):
        query_only.embed_documents(DOCS)


def test_saved_folder_is_a_sentence_transformers_router_model(
    tiny_model_dir: Path, embedder: AsymmetricEmbedder
) -> None:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Router

    st = SentenceTransformer(str(tiny_model_dir))
    assert isinstance(st[0], Router)
    queries, docs = embedder.embed_queries(QUERIES), embedder.embed_documents(DOCS)
    # The fixture model tells these texts apart, so equal vectors mean the same text, same tower, same order.
    assert (queries @ queries.T)[np.triu_indices(len(QUERIES), 1)].max() < 0.95
    assert (docs @ docs.T)[np.triu_indices(len(DOCS), 1)].max() < 0.95
    np.testing.assert_allclose(st.encode_query(QUERIES), queries, atol=1e-5)
    np.testing.assert_allclose(st.encode_document(DOCS), docs, atol=1e-5)
    # each side went through its own tower: the query vectors are not the document tower's
    assert not np.allclose(st.encode_query(QUERIES), embedder.embed_documents(QUERIES), atol=1e-2)


def test_towers_from_folders_prompts_and_symmetric_mode(tower_dirs: tuple[Path, Path]) -> None:
    q_dir, d_dir = tower_dirs
    asym = AsymmetricEmbedder.from_towers(str(q_dir), str(d_dir))
    assert asym.config.query.pooling == "cls" and asym.query_prompt() is None  # BERT query tower: no prompt
    sym = AsymmetricEmbedder.from_towers(str(d_dir))  # a decoder used on both sides
    assert sym.mode == "symmetric" and sym.config.query.pooling == "last_token"
    assert sym.query_prompt("X") == QUERY_PROMPT_TEMPLATE.format(instruction="X")
    plain = AsymmetricEmbedder.from_towers(str(d_dir), query_prompt_template=None)
    np.testing.assert_allclose(plain.embed_queries(DOCS), plain.embed_documents(DOCS), atol=1e-6)
    with_prompt = sym.embed_queries(DOCS)
    assert not np.allclose(with_prompt, sym.embed_documents(DOCS), atol=1e-4)


def test_document_tower_narrower_than_query_tower_is_a_load_error(tower_dirs: tuple[Path, Path]) -> None:
    q_dir, d_dir = tower_dirs  # query tower 32 dims, decoder 48: swapping them asks to widen 32 -> 48
    with pytest.raises(ModelError, match="dimension mismatch"):
        AsymmetricEmbedder.from_towers(str(d_dir), str(q_dir), query_pooling="last_token", document_pooling="cls")


def test_lora_adapter_on_document_tower_loads_and_merges(tower_dirs: tuple[Path, Path], tmp_path: Path) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModel

    q_dir, d_dir = tower_dirs
    base = AutoModel.from_pretrained(d_dir)
    peft_model = get_peft_model(
        base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    peft_model.save_pretrained(tmp_path / "adapter")
    plain = AsymmetricEmbedder.from_towers(str(q_dir), str(d_dir))
    adapted = AsymmetricEmbedder.from_towers(str(q_dir), str(d_dir), document_adapter=str(tmp_path / "adapter"))
    assert not hasattr(adapted.document_modules[0].auto_model, "peft_config")  # merged into the weights
    assert not np.allclose(plain.embed_documents(DOCS), adapted.embed_documents(DOCS), atol=1e-4)
    adapted.save_pretrained(tmp_path / "m")
    reloaded = AsymmetricEmbedder.from_pretrained(tmp_path / "m")
    np.testing.assert_allclose(reloaded.embed_documents(DOCS), adapted.embed_documents(DOCS), atol=1e-5)


def test_truncation_is_reported_once(embedder: AsymmetricEmbedder, caplog: pytest.LogCaptureFixture) -> None:
    long_texts = ["高血压" * 400] * 5
    with caplog.at_level(logging.WARNING, logger="care_retriever"):
        vectors = embedder.embed_documents(long_texts, batch_size=2)
    warnings = [r for r in caplog.records if "truncated" in r.getMessage()]
    assert len(warnings) == 1 and "5 of 5" in warnings[0].getMessage()
    assert np.isfinite(vectors).all()


def test_bad_input_is_a_clear_error(embedder: AsymmetricEmbedder, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="single str"):
        embedder.embed_queries("血压")
    with pytest.raises(InputError, match=r"queries\[1\]"):
        embedder.embed_queries(["血压", None])  # type: ignore[list-item]
    with pytest.raises(ModelError, match="not found"):
        AsymmetricEmbedder.from_pretrained(tmp_path / "missing")
    with pytest.raises(ModelError, match="Unknown load"):
        AsymmetricEmbedder.from_pretrained(tmp_path, load="both-towers")  # type: ignore[arg-type]
