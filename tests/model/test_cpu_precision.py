"""A CPU runs an LLM tower pretrained in bf16 (Qwen3's config says ``bfloat16``) in bf16 where it multiplies bf16
in hardware (Intel AMX), as transformers and sentence-transformers load such a tower by default: there a 4B
tower's forward passes ran 3.9x faster than in fp32, at half the memory (docs/gpu.md). Elsewhere, and for
encoders (query towers), ``auto`` stays fp32."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from sentence_transformers import SentenceTransformer

from care_retriever.model import runtime
from care_retriever.model.embedder import AsymmetricEmbedder
from care_retriever.model.runtime import cpu_dtype, native_cpu_bf16, resolve_dtype
from tests.support.hub_towers import write_bert_sentence_transformer, write_qwen3_embedding
from tests.support.vectors import cosines

TEXTS = ["高血压患者的饮食注意事项", "糖尿病", "儿童发烧38度怎么办，需要去医院吗？", "咳嗽"]


def test_the_cpu_precision_rule() -> None:
    assert cpu_dtype(True, "bfloat16", decoder=True) == torch.bfloat16  # a Qwen3 tower on an AMX CPU
    assert cpu_dtype(False, "bfloat16", decoder=True) == torch.float32  # bf16 in software: slower than fp32
    assert cpu_dtype(True, "bfloat16", decoder=False) == torch.float32  # an encoder (query tower)
    assert cpu_dtype(True, "float32", decoder=True) == cpu_dtype(True, None, decoder=True) == torch.float32
    assert resolve_dtype("fp32", "cpu", "bfloat16", True) == torch.float32  # asked for: kept
    assert resolve_dtype("auto", "cpu", "bfloat16", True) == cpu_dtype(native_cpu_bf16(), "bfloat16", True)


@pytest.fixture(scope="module")
def towers(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("cpu-precision")
    query = write_bert_sentence_transformer(root / "bert")
    return query, write_qwen3_embedding(root / "qwen3-embedding-bf16", dtype=torch.bfloat16)


@pytest.mark.parametrize("native", [True, False], ids=["amx", "no-amx"])
def test_a_bf16_document_tower_on_a_cpu(native: bool, towers: tuple[Path, Path], monkeypatch) -> None:
    if native and not native_cpu_bf16():
        pytest.skip("this CPU does not multiply bf16 in hardware (no AMX)")
    if not native:  # the hardware probe only: what a CPU without AMX answers
        monkeypatch.setattr(runtime, "native_cpu_bf16", lambda: False)
    query, document = towers
    care = AsymmetricEmbedder.from_towers(str(query), str(document), device="cpu")
    assert next(care.document_modules[0].parameters()).dtype == (torch.bfloat16 if native else torch.float32)
    assert next(care.query_modules[0].parameters()).dtype == torch.float32
    reference = SentenceTransformer(str(document), device="cpu")  # its default: the config's bf16
    assert next(reference.parameters()).dtype == torch.bfloat16
    theirs = reference.encode_document(TEXTS, normalize_embeddings=True)
    ours = care.embed_documents(TEXTS)[:, : theirs.shape[1]]
    if native:  # the same bf16 passes as sentence-transformers' own
        assert cosines(ours, theirs[:, : ours.shape[1]]).min() >= 0.9999
    else:  # fp32: closer to the tower's exact answer than bf16
        exact = SentenceTransformer(str(document), device="cpu", model_kwargs={"dtype": torch.float32})
        precise = exact.encode_document(TEXTS, normalize_embeddings=True)[:, : ours.shape[1]]
        assert cosines(ours, precise).min() >= 0.99999


def test_index_reads_a_saved_model_s_bf16_tower_by_the_same_rule(
    towers: tuple[Path, Path], tmp_path: Path, sample_corpus_path: Path, capsys
) -> None:
    """A model written by ``init`` (its document tower saved in bf16, as it ships) and read back by ``index``: the
    saved model's own loading path reads the rule too, and ``index --json`` says which precision ran."""
    import json

    from tests.support.cli import run_cli

    query, document = towers
    model = tmp_path / "model"
    code, _, err = run_cli(capsys, "init", str(model), "--query-model", str(query), "--document-model", str(document))
    assert code == 0, err
    store = f"faiss:{tmp_path / 'store'}"
    args = ["index", "--model", str(model), "--corpus", str(sample_corpus_path), "--store", store, "--json"]
    code, out, err = run_cli(capsys, *args, "--no-progress")
    assert code == 0, err
    assert json.loads(out)["dtype"] == ("bfloat16" if native_cpu_bf16() else "float32")
    code, out, err = run_cli(capsys, *args, "--no-progress", "--dtype", "fp32")
    assert code == 0 and json.loads(out)["dtype"] == "float32", err
