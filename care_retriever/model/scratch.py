"""Create a CARE model with random weights and tokenizers trained offline (no hub access)."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import BertConfig, BertModel, Qwen3Config, Qwen3Model

from care_retriever.documents import iter_jsonl
from care_retriever.errors import InputError
from care_retriever.model.pairing import TowerPairing
from care_retriever.model.towers.presets import get_preset
from care_retriever.model.towers.tokenizer import train_document_tokenizer, train_query_tokenizer

if TYPE_CHECKING:
    from care_retriever.model.embedder import AsymmetricEmbedder

TEXT_FIELDS = ("text", "title", "query", "sentence1", "sentence2", "description", "positive", "negative")


def iter_vocab_texts(files: Sequence[str | Path]) -> Iterator[str]:
    """Texts for tokenizer training: the text-like fields of a ``.jsonl`` file's rows (read by
    :func:`care_retriever.documents.iter_jsonl`, so a bad row names its line), or any other file's lines."""
    for file in files:
        path = Path(file)
        if not path.is_file():
            raise InputError(f"--vocab-from: file not found: {path}")
        if path.suffix == ".jsonl":
            for _, row in iter_jsonl(path):
                for key in TEXT_FIELDS:
                    value = row.get(key)
                    if isinstance(value, str):
                        yield value
                    elif isinstance(value, list):
                        yield from (v for v in value if isinstance(v, str))
            continue
        with path.open("r", encoding="utf-8", errors="replace") as fh:
            yield from (line.strip() for line in fh if line.strip())


def build_random_towers(
    preset: str,
    texts: Iterable[str],
    out_dir: str | Path,
    seed: int = 0,
    *,
    query_config: Mapping[str, Any] | None = None,
    document_config: Mapping[str, Any] | None = None,
) -> tuple[Path, Path]:
    """Write a random BERT query tower and a random Qwen3-style decoder tower as HF folders.

    ``query_config`` / ``document_config`` replace keys of the preset's architecture (a scaling curve's
    deeper or shallower decoder, say); a key the model's configuration does not have is an error, since
    ``transformers`` configurations would keep an unknown key silently and build the preset's shape.
    """
    spec = get_preset(preset)
    query_shape = {**spec.query, **check_architecture(BertConfig, query_config, "query_config")}
    document_shape = {**spec.document, **check_architecture(Qwen3Config, document_config, "document_config")}
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
        **query_shape,
    )
    d_cfg = Qwen3Config(
        vocab_size=max(spec.document_vocab_size or 0, len(d_tok)),
        max_position_embeddings=2048,
        pad_token_id=d_tok.pad_token_id,
        eos_token_id=d_tok.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
        **document_shape,
    )
    q_dir, d_dir = out / "query", out / "document"
    BertModel(q_cfg).save_pretrained(q_dir)
    q_tok.save_pretrained(q_dir)
    Qwen3Model(d_cfg).save_pretrained(d_dir)
    d_tok.save_pretrained(d_dir)
    return q_dir, d_dir


def check_architecture(config_class: type, overrides: Mapping[str, Any] | None, where: str) -> dict[str, Any]:
    """``overrides`` as a dict, each key checked to be an attribute of ``config_class``."""
    if not overrides:
        return {}
    if not isinstance(overrides, Mapping):
        raise InputError(f"{where}: expected a mapping of {config_class.__name__} keys")
    defaults = config_class()
    unknown = sorted(key for key in overrides if not hasattr(defaults, key))
    if unknown:
        raise InputError(f"{where}: {config_class.__name__} has no key(s) {unknown}")
    return dict(overrides)


def init_from_scratch(
    preset: str,
    vocab_files: Sequence[str | Path],
    seed: int = 0,
    device: str | None = None,
    *,
    query_config: Mapping[str, Any] | None = None,
    document_config: Mapping[str, Any] | None = None,
) -> AsymmetricEmbedder:
    """An ``AsymmetricEmbedder`` of the given preset (with its architecture overrides) and random weights."""
    from care_retriever.model.embedder import AsymmetricEmbedder

    with tempfile.TemporaryDirectory(prefix="care-init-") as tmp:
        q_dir, d_dir = build_random_towers(
            preset,
            iter_vocab_texts(vocab_files),
            tmp,
            seed=seed,
            query_config=query_config,
            document_config=document_config,
        )
        embedder = AsymmetricEmbedder.from_towers(str(q_dir), str(d_dir), TowerPairing(preset=preset), device=device)
    # Weights are in memory now; the towers' base_model paths name the deleted temp dir.
    config = embedder.config
    return embedder.with_config(
        query=replace(config.query, base_model=random_model_name(preset, query_config)),
        document=replace(config.document, base_model=random_model_name(preset, document_config)),
    )


def random_model_name(preset: str, overrides: Mapping[str, Any] | None) -> str:
    """What a saved model says its random tower was: ``random:mini``, or ``random:mini{"num_hidden_layers": 2}``."""
    return f"random:{preset}" + (json.dumps(dict(overrides), sort_keys=True) if overrides else "")
