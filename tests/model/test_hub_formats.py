"""Towers in the formats users download, read exactly as their own libraries read them.

Each folder is written offline by ``tests/support/hub_towers.py`` in the layout of the real repository
(Qwen3-Embedding, Qwen3-4B, bge, gte, a remote-code encoder, peft adapters). The contract: a CARE
tower built from such a folder gives the vectors the format's own library computes from the same
folder (sentence-transformers' ``encode_query`` / ``encode_document``, or transformers plus the model
card's pooling), cosine >= 0.9999, the document side after Matryoshka truncation and renormalisation.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from sentence_transformers import SentenceTransformer

from care_retriever.errors import ModelError
from care_retriever.model.embedder import AsymmetricEmbedder
from care_retriever.model.towers.tokenizer import appended_tokens, ensure_eos_appended
from tests.support.hub_towers import (
    QWEN3_EMBEDDING_QUERY_PROMPT,
    write_bert_sentence_transformer,
    write_gte_sentence_transformer,
    write_lora_adapter,
    write_qwen3_causal_lm,
    write_qwen3_embedding,
    write_remote_code_encoder,
)
from tests.support.vectors import cosines

TEXTS = [
    "高血压患者平时饮食需要注意什么？",
    "感冒了吃什么药好得快",
    "宝宝发烧三十八度五，精神不好，要不要去医院",
    "What should a patient with hypertension eat?",
]
PARITY = 0.9999


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hub")
    write_qwen3_embedding(root / "qwen3-embedding")
    write_qwen3_causal_lm(root / "qwen3-causal")
    write_bert_sentence_transformer(root / "bert")
    write_gte_sentence_transformer(root / "gte")
    return root


def truncated(vectors: np.ndarray, dim: int) -> np.ndarray:
    cut = vectors[:, :dim]
    return cut / np.linalg.norm(cut, axis=1, keepdims=True)


def st_reference(folder: Path, side: str, **kwargs) -> np.ndarray:
    model = SentenceTransformer(str(folder), device="cpu", **kwargs)
    encode = model.encode_query if side == "query" else model.encode_document
    return encode(TEXTS, normalize_embeddings=True)


def causal_lm_reference(folder: Path, dim: int, adapter: Path | None = None) -> np.ndarray:
    """transformers + the paper's pooling: the text's tokens, EOS appended, the EOS position's hidden state."""
    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    if adapter is None:
        model = AutoModel.from_pretrained(folder)
    else:
        from peft import PeftModel

        causal = AutoModelForCausalLM.from_pretrained(folder)
        model = PeftModel.from_pretrained(causal, str(adapter)).merge_and_unload().model
    rows = []
    with torch.no_grad():
        for text in TEXTS:
            ids = tokenizer(text)["input_ids"] + [tokenizer.eos_token_id]
            hidden = model(input_ids=torch.tensor([ids])).last_hidden_state
            rows.append(hidden[0, -1].numpy())
    return truncated(np.stack(rows), dim)


def test_qwen3_embedding_folder_matches_sentence_transformers_on_both_sides(hub: Path) -> None:
    folder = hub / "qwen3-embedding"
    care = AsymmetricEmbedder.from_towers(str(folder), device="cpu")
    assert cosines(care.embed_queries(TEXTS), st_reference(folder, "query")).min() >= PARITY
    assert cosines(care.embed_documents(TEXTS), st_reference(folder, "document")).min() >= PARITY
    # Its own prompt, verbatim: "Query:" with no space after it.
    assert care.query_prompt() == QWEN3_EMBEDDING_QUERY_PROMPT
    tokenizer = care.document_modules[0].tokenizer
    assert tokenizer.convert_ids_to_tokens(appended_tokens(tokenizer)) == ["<|endoftext|>"]


def test_bert_query_tower_with_qwen3_embedding_document_tower_after_matryoshka(hub: Path) -> None:
    care = AsymmetricEmbedder.from_towers(str(hub / "bert"), str(hub / "qwen3-embedding"), device="cpu")
    assert care.dim == 48 and care.document_dim == 64
    assert cosines(care.embed_queries(TEXTS), st_reference(hub / "bert", "query")).min() >= PARITY
    reference = truncated(st_reference(hub / "qwen3-embedding", "document"), care.dim)
    assert cosines(care.embed_documents(TEXTS), reference).min() >= PARITY
    assert care.query_prompt() is None  # a BERT tower that declares no prompt gets none


def test_native_gte_query_tower_and_qwen3_causal_lm_document_tower(hub: Path) -> None:
    care = AsymmetricEmbedder.from_towers(str(hub / "gte"), str(hub / "qwen3-causal"), device="cpu")
    assert type(care.query_modules[0].auto_model).__name__ == "GteModel"
    assert cosines(care.embed_queries(TEXTS), st_reference(hub / "gte", "query")).min() >= PARITY
    assert cosines(care.embed_documents(TEXTS), causal_lm_reference(hub / "qwen3-causal", care.dim)).min() >= PARITY
    assert care.config.document.pooling == "last_token"


def test_saved_model_reloads_to_the_same_vectors_and_reads_in_sentence_transformers(hub: Path, tmp_path: Path) -> None:
    care = AsymmetricEmbedder.from_towers(str(hub / "bert"), str(hub / "qwen3-causal"), device="cpu")
    queries, documents = care.embed_queries(TEXTS), care.embed_documents(TEXTS)
    care.save_pretrained(tmp_path / "care")
    loaded = AsymmetricEmbedder.from_pretrained(tmp_path / "care", device="cpu")
    assert cosines(loaded.embed_queries(TEXTS), queries).min() >= PARITY
    assert cosines(loaded.embed_documents(TEXTS), documents).min() >= PARITY
    assert loaded.space_fingerprint == care.space_fingerprint
    st = SentenceTransformer(str(tmp_path / "care"), device="cpu")
    assert cosines(st.encode_document(TEXTS), documents).min() >= PARITY


def test_eos_is_appended_after_what_the_post_processor_already_adds() -> None:
    """A Llama-style tokenizer that prepends BOS keeps it when EOS is appended for last-token pooling."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<s>": 0, "</s>": 1, "<unk>": 2, **{ch: i + 3 for i, ch in enumerate("测试 test")}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    assert ensure_eos_appended(tokenizer) is True
    tokens = tokenizer.convert_ids_to_tokens(tokenizer("测试")["input_ids"])
    assert tokens[0] == "<s>" and tokens[-1] == "</s>"
    assert tokenizer.pad_token == "</s>"
    assert ensure_eos_appended(tokenizer) is False  # now it appends: nothing more to do


def test_a_last_token_tower_without_eos_or_pad_is_one_line(hub: Path, tmp_path: Path) -> None:
    folder = tmp_path / "no-eos"
    shutil.copytree(hub / "qwen3-causal", folder)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text("utf-8"))
    config["eos_token"] = None
    config["pad_token"] = None
    config_path.write_text(json.dumps(config), "utf-8")
    with pytest.raises(ModelError, match="no eos_token; last-token pooling needs one") as err:
        AsymmetricEmbedder.from_towers(str(hub / "bert"), str(folder), device="cpu")
    assert "\n" not in str(err.value)


# ----------------------------------------------------------------------------- LoRA adapters
def test_causal_lm_lora_adapter_named_for_the_causal_wrapper_applies_and_merges(hub: Path, tmp_path: Path) -> None:
    causal = hub / "qwen3-causal"
    for name, targets in (
        ("module-names", None),
        # Targets named as in the causal-LM wrapper: they exist only under its ``model.`` prefix.
        ("full-names", [f"model.layers.{i}.self_attn.q_proj" for i in range(2)]),
    ):
        adapter = write_lora_adapter(causal, tmp_path / name, task_type="CAUSAL_LM", target_modules=targets)
        care = AsymmetricEmbedder.from_towers(
            str(hub / "bert"), str(causal), document_adapter=str(adapter), device="cpu"
        )
        reference = causal_lm_reference(causal, care.dim, adapter)
        assert cosines(care.embed_documents(TEXTS), reference).min() >= PARITY, name
        plain = causal_lm_reference(causal, care.dim)
        assert cosines(care.embed_documents(TEXTS), plain).min() < 0.99, f"{name}: the adapter changed nothing"


def test_feature_extraction_lora_adapter_on_a_qwen3_encoder(hub: Path, tmp_path: Path) -> None:
    from peft import PeftModel

    folder = hub / "qwen3-embedding"
    adapter = write_lora_adapter(folder, tmp_path / "fe", task_type="FEATURE_EXTRACTION")
    care = AsymmetricEmbedder.from_towers(str(hub / "bert"), str(folder), document_adapter=str(adapter), device="cpu")
    st = SentenceTransformer(str(folder), device="cpu")
    st[0].model = PeftModel.from_pretrained(st[0].auto_model, str(adapter)).merge_and_unload()
    reference = truncated(st.encode_document(TEXTS, normalize_embeddings=True), care.dim)
    assert cosines(care.embed_documents(TEXTS), reference).min() >= PARITY


def test_an_adapter_for_another_base_model_is_one_line_naming_both(hub: Path, tmp_path: Path) -> None:
    other = write_qwen3_causal_lm(tmp_path / "wider", seed=1, hidden_size=96)
    adapter = write_lora_adapter(other, tmp_path / "other-adapter", task_type="CAUSAL_LM")
    with pytest.raises(ModelError) as err:
        AsymmetricEmbedder.from_towers(
            str(hub / "bert"), str(hub / "qwen3-causal"), document_adapter=str(adapter), device="cpu"
        )
    message = str(err.value)
    assert "\n" not in message and str(other) in message and str(hub / "qwen3-causal") in message


# ----------------------------------------------------------------------------- remote code, pickles
@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_remote_code_encoder(tmp_path_factory.mktemp("remote") / "remote-encoder")


def test_remote_code_tower_is_refused_without_the_opt_in_and_matches_with_it(remote: Path, hub: Path) -> None:
    with pytest.raises(ModelError, match="trust-remote-code") as err:
        AsymmetricEmbedder.from_towers(str(remote), str(hub / "qwen3-causal"), device="cpu")
    assert "\n" not in str(err.value)
    care = AsymmetricEmbedder.from_towers(str(remote), str(hub / "qwen3-causal"), device="cpu", trust_remote_code=True)
    reference = st_reference(remote, "query", trust_remote_code=True)
    assert cosines(care.embed_queries(TEXTS), reference).min() >= PARITY
    assert care.config.query.trust_remote_code is True and care.config.document.trust_remote_code is False


def test_remote_code_is_required_again_at_every_load(remote: Path, hub: Path, tmp_path: Path, capsys) -> None:
    from tests.support.cli import run_cli

    model = tmp_path / "care"
    code, _, err = run_cli(
        capsys, "init", model, "--query-model", remote, "--document-model", hub / "qwen3-causal", "--trust-remote-code"
    )
    assert code == 0, err
    assert json.loads((model / "care_config.json").read_text("utf-8"))["query"]["trust_remote_code"] is True
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "".join(json.dumps({"_id": str(i), "text": t}, ensure_ascii=False) + "\n" for i, t in enumerate(TEXTS))
    )
    store = f"faiss:{tmp_path / 'store'}"
    # The document tower runs no remote code: indexing needs no opt-in.
    assert run_cli(capsys, "index", "--model", model, "--corpus", corpus, "--store", store, "--no-progress")[0] == 0
    code, out, err = run_cli(capsys, "search", "--model", model, "--store", store, "--backend", "torch", "感冒")
    assert code == 2 and "--trust-remote-code" in err and len(err.strip().splitlines()) == 1
    code, out, err = run_cli(
        capsys,
        "search",
        "--model",
        model,
        "--store",
        store,
        "--backend",
        "torch",
        "--trust-remote-code",
        "--json",
        "感冒",
    )
    assert code == 0, err
    assert len(json.loads(out)["hits"]) == len(TEXTS)
    with pytest.raises(ModelError, match="trust_remote_code=True"):
        AsymmetricEmbedder.from_pretrained(model, load="query")
    loaded = AsymmetricEmbedder.from_pretrained(model, load="query", trust_remote_code=True)
    reference = st_reference(remote, "query", trust_remote_code=True)
    assert cosines(loaded.embed_queries(TEXTS), reference).min() >= PARITY
    # The saved CARE model reads in plain sentence-transformers too (the code sits beside modules.json).
    saved = SentenceTransformer(str(model), device="cpu", trust_remote_code=True)
    assert cosines(saved.encode_query(TEXTS), loaded.embed_queries(TEXTS)).min() >= PARITY


def test_a_tower_with_only_pickled_weights_needs_the_opt_in(hub: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    folder = tmp_path / "bin-only"
    shutil.copytree(hub / "bert", folder)
    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    with pytest.raises(ModelError, match="allow-pickled-weights") as err:
        AsymmetricEmbedder.from_towers(str(folder), str(hub / "qwen3-causal"), device="cpu")
    assert "\n" not in str(err.value)
    care = AsymmetricEmbedder.from_towers(
        str(folder), str(hub / "qwen3-causal"), device="cpu", allow_pickled_weights=True
    )
    assert cosines(care.embed_queries(TEXTS), st_reference(hub / "bert", "query")).min() >= PARITY


def test_a_declared_document_prompt_is_part_of_indexing_training_and_the_space(hub: Path, tmp_path: Path) -> None:
    """A document tower whose folder declares a document prompt reads it wherever it embeds documents."""
    from care_retriever.training.stage_common import query_prompts
    from care_retriever.training.teacher_cache import build_teacher_cache

    folder = write_qwen3_embedding(tmp_path / "prompted", document_prompt="文档：")
    care = AsymmetricEmbedder.from_towers(str(hub / "bert"), str(folder), device="cpu")
    reference = truncated(st_reference(folder, "document"), care.dim)
    assert cosines(care.embed_documents(TEXTS), reference).min() >= PARITY
    plain = AsymmetricEmbedder.from_towers(str(hub / "bert"), str(hub / "qwen3-embedding"), device="cpu")
    assert cosines(care.embed_documents(TEXTS), plain.embed_documents(TEXTS)).max() < 0.9999
    assert care.space_fingerprint != plain.space_fingerprint
    # Training feeds the document tower the same text: the teacher cache and the document columns.
    cache = build_teacher_cache(care, TEXTS, tmp_path / "cache", show_progress=False)
    assert cosines(np.asarray(cache.vectors), care.embed_documents(TEXTS)).min() >= PARITY
    assert query_prompts(care, [], ("positive",)) == {"positive": "文档："}
    care.save_pretrained(tmp_path / "care")
    loaded = AsymmetricEmbedder.from_pretrained(tmp_path / "care", load="document", device="cpu")
    assert loaded.space_fingerprint == care.space_fingerprint
    assert cosines(loaded.embed_documents(TEXTS), reference).min() >= PARITY


def test_the_index_writer_encodes_documents_with_the_declared_document_prompt(hub: Path, tmp_path: Path) -> None:
    """The writer encodes through the embedder's embed_documents: each stored vector is that document's row."""
    from care_retriever.indexing.corpus import Document
    from care_retriever.indexing.writer import DocumentStoreWriter

    folder = write_qwen3_embedding(tmp_path / "prompted", document_prompt="文档：")
    care = AsymmetricEmbedder.from_towers(str(hub / "bert"), str(folder), device="cpu")
    docs = [Document(id=f"d{i}", text=text) for i, text in enumerate(TEXTS)]
    writer = DocumentStoreWriter(care, f"faiss:{tmp_path / 'store'}", show_progress=False)
    writer.write(docs)
    stored = np.stack([v for v in writer.store.vectors([d.id for d in docs]) if v is not None])
    writer.store.close()
    assert stored.shape == (len(docs), care.dim)
    assert cosines(stored, care.embed_documents([d.embedding_text() for d in docs])).min() >= PARITY
