"""Indexing throughput options: precision, attention, token budget on ``care-retriever index``, and the BM25
side tokenised in a child process while the document tower encodes."""

from __future__ import annotations

import json
import logging
import os
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from care_retriever.indexing.config import EncodeConfig
from care_retriever.indexing.corpus import read_corpus
from care_retriever.indexing.writer import DocumentStoreWriter
from care_retriever.model.embedder import AsymmetricEmbedder
from care_retriever.sparse.background import BackgroundTokenizer
from care_retriever.sparse.tokenizer import tokenize
from tests.support.cli import run_cli
from tests.support.data import MEDICAL_TEXTS

TEXTS = [f"{title}{i}：{text}" for i in range(1000) for _, title, text in MEDICAL_TEXTS]


# ------------------------------------------------------------------ the CLI options
@pytest.mark.parametrize(
    ("flag", "value", "names"),
    [
        ("--dtype", "half", "['auto', 'saved', 'fp32', 'bf16', 'fp16', 'fp8']"),
        ("--attn-implementation", "flash", "['auto', 'sdpa', 'flash_attention_2', 'eager']"),
        ("--max-batch-tokens", "0", "must be an integer >= 1"),
    ],
)
def test_a_bad_option_is_one_line_before_any_work(
    capsys, tmp_path: Path, tiny_model_dir: Path, small_corpus_path: Path, flag: str, value: str, names: str
) -> None:
    store = tmp_path / "store"
    args = ["--model", tiny_model_dir, "--corpus", small_corpus_path, "--store", f"faiss:{store}", flag, value]
    code, _, err = run_cli(capsys, "index", *args)
    assert code == 2 and names in err and len(err.strip().splitlines()) == 1, err
    assert not store.exists()


def test_index_runs_with_the_precision_attention_and_budget_asked_for(
    capsys, tmp_path: Path, tiny_model_dir: Path, small_corpus_path: Path
) -> None:
    args = ["index", "--model", tiny_model_dir, "--corpus", small_corpus_path, "--no-progress", "--json"]
    code, out, _ = run_cli(capsys, *args, "--store", f"faiss:{tmp_path / 'a'}")
    assert code == 0
    default = json.loads(out)
    assert (default["dtype"], default["attn_implementation"]) == ("float32", "sdpa")  # auto on CPU
    code, out, _ = run_cli(
        capsys,
        *args,
        "--store",
        f"faiss:{tmp_path / 'b'}",
        "--dtype",
        "fp32",
        "--attn-implementation",
        "eager",
        "--max-batch-tokens",
        "64",
    )
    assert code == 0
    report = json.loads(out)
    assert (report["dtype"], report["attn_implementation"], report["added"]) == ("float32", "eager", 6)
    code, out, _ = run_cli(capsys, "search", "--model", tiny_model_dir, "--store", f"faiss:{tmp_path / 'b'}", "感冒")
    assert code == 0 and out.strip()


# ------------------------------------------------------------------ the BM25 side beside the encoding
def test_submit_returns_while_the_child_tokenises() -> None:
    tokenize(TEXTS[:1])  # jieba's dictionary loaded here first: the timing below is tokenising alone
    start = time.perf_counter()
    expected = tokenize(TEXTS)
    in_process = time.perf_counter() - start
    with BackgroundTokenizer() as tokenizer:
        tokenizer.submit(TEXTS[:10])  # the child has started and loaded jieba once this is answered
        assert tokenizer.result() == expected[:10]
        start = time.perf_counter()
        tokenizer.submit(TEXTS)
        handed_over = time.perf_counter() - start
        assert tokenizer.result() == expected
    # what the caller waits for is handing the texts over, not tokenising them
    assert handed_over < in_process / 4, (handed_over, in_process)


def test_a_child_that_dies_falls_back_to_tokenising_here(caplog: pytest.LogCaptureFixture) -> None:
    with BackgroundTokenizer() as tokenizer, caplog.at_level(logging.WARNING, logger="care_retriever"):
        tokenizer.submit(TEXTS[:1])  # the child is started and answers
        assert tokenizer.result() == tokenize(TEXTS[:1])
        pid = tokenizer.child_pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)  # the child dies from outside, as the OS would kill it
        tokenizer.submit(TEXTS[:50])
        assert tokenizer.result() == tokenize(TEXTS[:50])
        tokenizer.submit(TEXTS[50:60])  # no child any more: tokenised here, said once
        assert tokenizer.result() == tokenize(TEXTS[50:60])
    assert len([r for r in caplog.records if "tokenising in this process instead" in r.getMessage()]) == 1


def _sparse_tables(store: Path) -> dict[str, list[tuple]]:
    (db_path,) = [p for p in store.rglob("*") if p.suffix in (".sqlite", ".db") and "sparse" not in p.name] or [None]
    assert db_path is not None, sorted(store.rglob("*"))
    with sqlite3.connect(db_path) as db:
        return {
            table: db.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall()
            for table in ("sparse_postings", "sparse_lengths", "sparse_terms", "sparse_stats")
        }


def test_the_background_tokens_are_the_postings_the_store_would_write(
    tmp_path: Path, tiny_model_dir: Path, small_corpus_path: Path
) -> None:
    embedder = AsymmetricEmbedder.from_pretrained(tiny_model_dir, load="document")
    tables = {}
    for background in (True, False):
        store = tmp_path / f"background-{background}"
        writer = DocumentStoreWriter(
            embedder,
            f"faiss:{store}",  # two chunks: a request per chunk, answered in step
            sparse=True,
            background_tokenizer=background,
            show_progress=False,
            encode=EncodeConfig(chunk_size=4),
        )
        writer.write(read_corpus(small_corpus_path))
        writer.store.close()
        tables[background] = _sparse_tables(store)
    assert tables[True]["sparse_postings"] and tables[True] == tables[False]


def test_the_background_tokenizer_is_used_where_the_tower_runs_on_a_gpu(tmp_path: Path, tiny_model_dir: Path) -> None:
    """On CPU torch's threads already take every core: the child would only compete with them."""
    from types import SimpleNamespace

    on_cpu = AsymmetricEmbedder.from_pretrained(tiny_model_dir, load="document", device="cpu")
    assert DocumentStoreWriter(on_cpu, f"faiss:{tmp_path / 'a'}", sparse=True).background_tokenizer is False
    # only where the document tower runs is read when the writer is made
    on_gpu = SimpleNamespace(document_model=SimpleNamespace(device="cuda:1"), space_fingerprint="a-space")
    assert DocumentStoreWriter(on_gpu, f"faiss:{tmp_path / 'b'}", sparse=True).background_tokenizer is True
    forced = DocumentStoreWriter(on_cpu, f"faiss:{tmp_path / 'c'}", sparse=True, background_tokenizer=True)
    assert forced.background_tokenizer is True
