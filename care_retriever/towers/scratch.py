"""Create a CARE model with random weights and tokenizers trained offline (no hub access)."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import torch
from transformers import BertConfig, BertModel, Qwen3Config, Qwen3Model

from care_retriever.errors import InputError
from care_retriever.towers.presets import get_preset
from care_retriever.towers.tokenizer import train_document_tokenizer, train_query_tokenizer

TEXT_FIELDS = ("text", "title", "query", "sentence1", "sentence2", "description", "positive", "negative")


def iter_vocab_texts(files: Sequence[str | Path]) -> Iterator[str]:
    """Texts for tokenizer training: JSONL rows (text-like fields) or plain text lines."""
    for file in files:
        path = Path(file)
        if not path.is_file():
            raise InputError(f"--vocab-from: file not found: {path}")
        with path.open("r", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                line = line.strip()
                if not line:
                    continue
                if line.startswith("{"):
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError:
                        yield line
                        continue
                    for key in TEXT_FIELDS:
                        value = row.get(key)
                        if isinstance(value, str):
                            yield value
                        elif isinstance(value, list):
                            yield from (v for v in value if isinstance(v, str))
                else:
                    yield line


def build_random_towers(preset: str, texts: Iterable[str], out_dir: str | Path, seed: int = 0) -> tuple[Path, Path]:
    """Write a random BERT query tower and a random Qwen3-style decoder tower as HF folders."""
    spec = get_preset(preset)
    texts = list(texts)
    if not texts:
        raise InputError("--vocab-from: no text found to train the tokenizers on")
    torch.manual_seed(seed)
    out = Path(out_dir)
    q_tok = train_query_tokenizer(texts, vocab_size=spec.tokenizer_vocab)
    d_tok = train_document_tokenizer(texts, vocab_size=spec.tokenizer_vocab)
    q_cfg = BertConfig(
        vocab_size=max(spec.query_vocab_size or 0, len(q_tok)),
        max_position_embeddings=512,
        pad_token_id=q_tok.pad_token_id,
        **spec.query,
    )
    d_cfg = Qwen3Config(
        vocab_size=max(spec.document_vocab_size or 0, len(d_tok)),
        max_position_embeddings=2048,
        pad_token_id=d_tok.pad_token_id,
        eos_token_id=d_tok.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
        **spec.document,
    )
    q_dir, d_dir = out / "query", out / "document"
    BertModel(q_cfg).save_pretrained(q_dir)
    q_tok.save_pretrained(q_dir)
    Qwen3Model(d_cfg).save_pretrained(d_dir)
    d_tok.save_pretrained(d_dir)
    return q_dir, d_dir


def init_from_scratch(preset: str, vocab_files: Sequence[str | Path], seed: int = 0, device: str | None = None):
    """An ``AsymmetricEmbedder`` of the given preset with random weights."""
    from care_retriever.embedder import AsymmetricEmbedder

    with tempfile.TemporaryDirectory(prefix="care-init-") as tmp:
        q_dir, d_dir = build_random_towers(preset, iter_vocab_texts(vocab_files), tmp, seed=seed)
        embedder = AsymmetricEmbedder.from_towers(str(q_dir), str(d_dir), device=device, preset=preset)
        # Weights are in memory now; base_model paths pointed at the temp dir.
        embedder.config.query.base_model = f"random:{preset}"
        embedder.config.document.base_model = f"random:{preset}"
    return embedder
